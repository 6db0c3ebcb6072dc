// Bpe: the BPE model of tokenizer.json ("model": {"type": "BPE"}), giving the
// same ids as Hugging Face `tokenizers`: merges by rank with a min-heap over
// a linked list of symbols (lowest rank first, leftmost among equals),
// merges given as "a b" strings or [a, b] pairs, byte_fallback (<0xNN>
// tokens), unk_token with fuse_unk, ignore_merges (a word in the vocabulary
// is one token), continuing_subword_prefix and end_of_word_suffix. Words
// shorter than 256 bytes are cached (sharded, bounded).
//
// Thread-safety: immutable after FromJson except the cache, which is
// internally synchronized; Tokenize is thread-safe.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "engine/tokenizer/json_field.h"

namespace ballast::tokenizer {

class Bpe {
 public:
  // `model` is tokenizer.json's "model" object.
  static absl::StatusOr<std::unique_ptr<Bpe>> FromJson(const JsonField& model);
  ~Bpe();

  // Appends the ids of one pre-token.
  void Tokenize(std::string_view word, std::vector<int>* ids) const;

  std::optional<int> TokenToId(std::string_view token) const;
  // The token of `id`, or nullptr outside the vocabulary.
  const std::string* IdToToken(int id) const;
  // Entries in the vocabulary (tokenizers' get_vocab_size).
  int vocab_entries() const { return static_cast<int>(vocab_.size()); }
  // Largest id in the vocabulary.
  int max_id() const { return static_cast<int>(vocab_r_.size()) - 1; }

 private:
  struct Merge {
    uint32_t rank;
    uint32_t new_id;
  };
  struct Cache;

  Bpe();
  absl::Status LoadVocab(const JsonField& vocab);
  absl::Status LoadMerges(const JsonField& merges);
  // HF's merge_word: initial symbols (chars, byte fallback, unk), then merges.
  void MergeWord(std::string_view word, std::vector<int>* ids) const;
  void ApplyMerges(std::vector<int>* symbols) const;
  const Merge* FindMerge(int a, int b) const;

  absl::flat_hash_map<std::string, int> vocab_;
  std::vector<std::string> vocab_r_;
  std::vector<bool> has_id_;
  absl::flat_hash_map<uint64_t, Merge> merges_;
  std::optional<std::string> unk_token_;
  std::optional<std::string> prefix_;  // continuing_subword_prefix
  std::optional<std::string> suffix_;  // end_of_word_suffix
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  int byte_ids_[256];  // <0xNN> ids for byte_fallback, -1 if absent
  std::unique_ptr<Cache> cache_;
};

}  // namespace ballast::tokenizer
