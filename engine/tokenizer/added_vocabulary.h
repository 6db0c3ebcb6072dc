// AddedVocabulary: tokenizer.json's "added_tokens" (special and not), found
// in the text before the model runs, as Hugging Face `tokenizers` does:
// tokens with normalized=false are matched in the raw text, the others in
// the normalized pieces (against their normalized form); leftmost-longest
// matching; single_word, lstrip and rstrip as in tokenizers' find_matches.
// Ids follow tokenizers' rule: a token already in the model's vocabulary
// keeps that id, a new one gets the next id after the vocabulary.
//
// Thread-safety: immutable after FromJson; all methods are thread-safe.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "engine/tokenizer/bpe.h"
#include "engine/tokenizer/json_field.h"
#include "engine/tokenizer/normalizer.h"
#include "engine/tokenizer/utf8.h"

namespace ballast::tokenizer {

struct AddedToken {
  int id = -1;
  std::string content;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = true;
  bool special = false;
  // What is matched (and decoded): the normalized content when `normalized`
  // and the normalizer changes it, else `content`.
  std::string form;
};

class AddedVocabulary {
 public:
  // A split of the text: an added token (id >= 0) or text [start, end).
  struct Segment {
    int id = -1;
    size_t start = 0;
    size_t end = 0;
  };

  static absl::StatusOr<AddedVocabulary> FromJson(const JsonField& added_tokens, const Bpe& model,
                                                  const Normalizer* normalizer);

  // Splits `text` on the added tokens of one pass (raw text: normalized=false
  // tokens; normalized pieces: the others). With parse_special false, special
  // tokens are not matched (tokenizers' encode_special_tokens).
  void Split(std::string_view text, bool normalized_pass, bool parse_special,
             std::vector<Segment>* out) const;
  // Whether the pass has any token (Split would find nothing otherwise).
  bool HasTokens(bool normalized_pass) const {
    return !(normalized_pass ? normalized_ : raw_).terminal.empty();
  }

  const AddedToken* Find(int id) const;
  std::optional<int> IdOf(std::string_view content) const;
  bool IsSpecialContent(std::string_view s) const { return special_.contains(Sv(s)); }
  const std::vector<AddedToken>& tokens() const { return tokens_; }
  // Largest id, or -1.
  int max_id() const { return max_id_; }

 private:
  // Byte trie: edges keyed by (node << 8 | byte); terminal node -> token index.
  struct Trie {
    absl::flat_hash_map<uint64_t, int> edges;
    absl::flat_hash_map<int, int> terminal;
    bool first_byte[256] = {};
    int nodes = 1;
    void Add(std::string_view pattern, int token);
    // Longest pattern starting at s[i]: its token index and end, or -1.
    int LongestAt(std::string_view s, size_t i, size_t* end) const;
  };

  std::vector<AddedToken> tokens_;
  absl::flat_hash_map<int, int> by_id_;
  absl::flat_hash_map<std::string, int> by_content_;
  absl::flat_hash_set<std::string> special_;
  Trie raw_, normalized_;
  int max_id_ = -1;
};

}  // namespace ballast::tokenizer
