// Pre-tokenizers of tokenizer.json ("pre_tokenizer"): Split (string or regex
// pattern; Removed, Isolated, MergedWithPrevious, MergedWithNext and
// Contiguous; invert), ByteLevel (add_prefix_space, use_regex), Metaspace
// (prepend_scheme always/first/never, split), Digits, Punctuation,
// Whitespace, WhitespaceSplit, BertPreTokenizer, CharDelimiterSplit and
// Sequence, with the semantics of Hugging Face `tokenizers`. UnicodeScripts
// and FixedLength are not implemented (UNIMPLEMENTED at load).
//
// Thread-safety: immutable after construction; PreTokenize is thread-safe.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/tokenizer/json_field.h"

namespace ballast::tokenizer {

// One split of the text. `at_origin`: it begins at offset 0 of the original
// input (Metaspace's prepend_scheme "first" prepends only there).
struct Piece {
  std::string text;
  bool at_origin = false;
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Replaces `pieces` by their splits (never empty ones), in order.
  virtual void PreTokenize(std::vector<Piece>* pieces) const = 0;

  // Builds the pre-tokenizer described by `j`; null JSON gives nullptr.
  static absl::StatusOr<std::unique_ptr<PreTokenizer>> FromJson(const JsonField& j);
};

// The GPT-2 byte-to-character table: the UTF-8 of the character that stands
// for byte `b` in byte-level vocabularies ("Ġ" for ' ').
const std::string& ByteLevelChar(unsigned char b);
// The byte a byte-level character stands for, or -1.
int ByteLevelByte(char32_t cp);

}  // namespace ballast::tokenizer
