// Regex: a compiled PCRE2 pattern (UTF + UCP, JIT-compiled when the library
// supports it) for tokenizer.json's Split, Replace and ByteLevel patterns.
//
// Hugging Face `tokenizers` runs these patterns on Oniguruma; PCRE2 agrees on
// the constructs they use (\p{..} classes, lookahead, (?i:..)) except \s,
// which in PCRE2 also matches U+180E. Patterns are therefore rewritten so
// that \s (and \S outside a class) mean exactly Unicode White_Space.
//
// Thread-safety: immutable after Compile; ForEachMatch may run from many
// threads at once (match data and JIT stack are per thread).
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"

namespace ballast::tokenizer {

class Regex {
 public:
  // Compiles a tokenizer.json regex. Errors give PCRE2's message and offset.
  static absl::StatusOr<std::unique_ptr<Regex>> Compile(std::string_view pattern);
  // A pattern matching `text` literally.
  static absl::StatusOr<std::unique_ptr<Regex>> Literal(std::string_view text);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Calls fn(start, end) (byte offsets) for every non-overlapping match in
  // the valid UTF-8 `s`, left to right. Empty matches are skipped.
  void ForEachMatch(std::string_view s, absl::FunctionRef<void(size_t, size_t)> fn) const;

  // The pattern with \s rewritten (see the file comment).
  static std::string Translate(std::string_view pattern);

 private:
  explicit Regex(void* code, bool jit) : code_(code), jit_(jit) {}
  void* code_;  // pcre2_code_8
  bool jit_;
};

}  // namespace ballast::tokenizer
