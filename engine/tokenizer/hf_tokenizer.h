// HfTokenizer: a Hugging Face tokenizer loaded from a checkpoint directory
// (tokenizer.json, plus tokenizer_config.json, generation_config.json and
// config.json when present), giving the same ids as the `tokenizers`
// library and the same text as its decode (skip_special_tokens as in
// transformers), with no Python or Rust at run time.
//
// Encode follows tokenizers' pipeline: invalid UTF-8 becomes U+FFFD (as
// Python's decode("utf-8", "replace")); added tokens are split off
// (AddedVocabulary); each remaining piece is normalized, pre-tokenized and
// run through the BPE model; add_special_tokens adds what the post-processor
// (adjusted by tokenizer_config's add_bos_token / add_eos_token) puts around
// a sequence. DecodeStream decodes token by token (decoder.h) and yields
// exactly what a whole decode yields.
//
// Thread-safety: immutable after Load/FromJson, every const method is
// thread-safe (the BPE cache is internally synchronized). A DecodeStream is
// per stream and thread-compatible; it must not outlive its tokenizer.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "engine/tokenizer/added_vocabulary.h"
#include "engine/tokenizer/bpe.h"
#include "engine/tokenizer/checkpoint_config.h"
#include "engine/tokenizer/decoder.h"
#include "engine/tokenizer/normalizer.h"
#include "engine/tokenizer/post_processor.h"
#include "engine/tokenizer/pre_tokenizer.h"
#include "nlohmann/json.hpp"

namespace ballast::tokenizer {

struct EncodeOptions {
  // Add the special tokens of the post-processor (BOS ...): HF
  // add_special_tokens=True.
  bool add_special_tokens = false;
  // Read special added tokens' text ("<|im_end|>") as those tokens; false
  // encodes it as plain text (tokenizers' encode_special_tokens).
  bool parse_special = true;
};

class HfTokenizer;

// Token-by-token decoding of one sequence; bytes out (partial UTF-8
// sequences possible with byte-level vocabularies; the caller completes or
// replaces them, e.g. with Utf8Sanitizer).
class DecodeStream {
 public:
  DecodeStream(const HfTokenizer* tokenizer, bool skip_special_tokens);
  void Push(int id, std::string* bytes);
  void Finish(std::string* bytes);

 private:
  const HfTokenizer* tokenizer_;
  bool skip_special_;
  std::unique_ptr<DecoderState> state_;
};

class HfTokenizer {
 public:
  // Loads `dir`/tokenizer.json (required) and the optional config files.
  // Errors name the file and the JSON key; components the library does not
  // implement give UNIMPLEMENTED.
  static absl::StatusOr<std::unique_ptr<HfTokenizer>> Load(const std::string& dir);
  // From parsed files; any but `tokenizer_json` may be null JSON. `dir`
  // names the files in errors.
  static absl::StatusOr<std::unique_ptr<HfTokenizer>> FromJson(
      const nlohmann::json& tokenizer_json, const nlohmann::json& tokenizer_config,
      const nlohmann::json& generation_config, const nlohmann::json& model_config,
      const std::string& dir);

  std::vector<int> Encode(std::string_view text, const EncodeOptions& options = {}) const;
  // The whole text of `ids` (valid UTF-8; invalid bytes become U+FFFD).
  std::string Decode(const std::vector<int>& ids, bool skip_special_tokens) const;
  std::unique_ptr<DecodeStream> NewDecodeStream(bool skip_special_tokens) const {
    return std::make_unique<DecodeStream>(this, skip_special_tokens);
  }

  std::optional<int> TokenToId(std::string_view token) const;
  // The token's string as the decoder sees it; nullptr for an unknown id.
  const std::string* IdToToken(int id) const;
  // Skipped by skip_special_tokens: tokenizers' special added tokens and the
  // special tokens tokenizer_config.json names (as transformers does).
  bool IsSpecial(int id) const { return skip_ids_.contains(id); }
  // One past the largest id (model vocabulary and added tokens).
  int vocab_size() const { return vocab_size_; }
  // BOS id, -1 if none. add_special_tokens puts special_prefix() first.
  int bos_id() const { return bos_id_; }
  const std::vector<int>& special_prefix() const { return around_.prefix; }
  const std::vector<int>& special_suffix() const { return around_.suffix; }
  // Every id that ends generation: tokenizer_config's eos_token first, then
  // generation_config.json's and config.json's eos_token_id.
  const std::vector<int>& eos_ids() const { return eos_ids_; }
  const std::string& chat_template() const { return settings_.chat_template; }
  const GenerationDefaults& generation_defaults() const { return settings_.generation; }

 private:
  friend class DecodeStream;
  HfTokenizer() = default;
  absl::Status Init(const JsonField& tokenizer, const JsonField& config,
                    const JsonField& generation, const JsonField& model_config);
  absl::Status ResolveSpecials(const std::string& dir);
  void EncodeText(std::string_view raw, bool at_origin, const EncodeOptions& options,
                  std::vector<int>* ids) const;
  void EncodeNormalized(std::string text, bool at_origin, std::vector<int>* ids) const;

  std::unique_ptr<Normalizer> normalizer_;
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  std::unique_ptr<Bpe> model_;
  std::unique_ptr<Decoder> decoder_;
  AddedVocabulary added_;
  SpecialTokensAround around_;
  CheckpointSettings settings_;
  absl::flat_hash_set<int> skip_ids_;
  std::vector<int> eos_ids_;
  int bos_id_ = -1;
  int vocab_size_ = 0;
};

}  // namespace ballast::tokenizer
