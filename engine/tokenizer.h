// Tokenizers and the streaming detokenizer.
//
// Tokenizer is what the engine and the node manager need of a model's
// tokenizer: encode a prompt (with or without special tokens and
// special-token parsing), BOS and every EOS id, which ids are special, and a
// per-sequence decode stream. Two implementations:
//   * ByteTokenizer, for synthetic models: ids 0..255 are the bytes
//     themselves, then BOS (256) and EOS (257); any other id in the
//     vocabulary decodes to nothing.
//   * a checkpoint's Hugging Face tokenizer.json (tokenizer::HfTokenizer,
//     engine/tokenizer/), through LoadCheckpointTokenizer, identical to HF
//     `tokenizers` and transformers' decode.
// StreamDecoder turns a stream of token ids into valid UTF-8 text pieces
// (incomplete characters are held back, invalid bytes become U+FFFD), so
// every piece can travel in a protobuf string; the pieces concatenated are
// exactly the whole decode (with the tokenizer's position rules: Metaspace /
// Strip decoders drop the first token's leading space, <0xNN> byte pieces
// assemble into characters, skip_special_tokens).
//
// Thread-safety: Tokenizers are immutable and thread-safe; a StreamDecoder
// (and a TokenDecodeStream) is per request and thread-compatible.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/tokenizer/checkpoint_config.h"
#include "engine/tokenizer/hf_tokenizer.h"
#include "engine/tokenizer/utf8.h"

namespace ballast::engine {

// add_special_tokens: what the tokenizer adds around a sequence (BOS ...);
// parse_special: special tokens' text in the input becomes those tokens.
using EncodeOptions = tokenizer::EncodeOptions;
using GenerationDefaults = tokenizer::GenerationDefaults;

// Decoding of one sequence, token by token: raw bytes out (possibly a
// partial UTF-8 character; StreamDecoder completes or replaces them).
class TokenDecodeStream {
 public:
  virtual ~TokenDecodeStream() = default;
  virtual void Push(int id, std::string* bytes) = 0;
  virtual void Finish(std::string* bytes) {}
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Token ids of `text` (any bytes; invalid UTF-8 reads as U+FFFD): no
  // special tokens added, special-token text parsed.
  std::vector<int> Encode(std::string_view text) const { return Encode(text, EncodeOptions{}); }
  virtual std::vector<int> Encode(std::string_view text, const EncodeOptions& options) const = 0;
  // Raw bytes of one token decoded alone (possibly a partial UTF-8
  // character); empty for ByteTokenizer's special tokens.
  virtual std::string TokenBytes(int id) const = 0;
  // BOS id (-1: none) and the first EOS id (-1: none).
  virtual int bos_id() const = 0;
  virtual int eos_id() const = 0;
  // Every id that ends generation.
  virtual std::vector<int> eos_ids() const { return {eos_id()}; }
  virtual bool IsEos(int id) const { return id == eos_id(); }
  // Ids skipped by skip_special_tokens.
  virtual bool IsSpecial(int id) const { return id == bos_id() || id == eos_id(); }
  // Whether add_special_tokens puts BOS first.
  virtual bool add_bos() const { return true; }
  // One past the largest id the tokenizer produces or decodes.
  virtual int vocab_size() const = 0;
  // Decoding state for one sequence. Default: TokenBytes of each id,
  // skipping IsSpecial ids when asked.
  virtual std::unique_ptr<TokenDecodeStream> NewDecodeStream(bool skip_special_tokens) const;
  // The whole text of `ids` (valid UTF-8), as StreamDecoder would give it.
  std::string Decode(const std::vector<int>& ids, bool skip_special_tokens = true) const;
  // generation_config.json's sampling defaults; tokenizer_config.json's
  // chat template ("" if none).
  virtual GenerationDefaults generation_defaults() const { return {}; }
  virtual std::string chat_template() const { return {}; }
};

class ByteTokenizer final : public Tokenizer {
 public:
  static constexpr int kBos = 256;
  static constexpr int kEos = 257;
  static constexpr int kMinVocab = 258;

  using Tokenizer::Encode;
  // Bytes as ids; add_special_tokens prepends BOS.
  std::vector<int> Encode(std::string_view text, const EncodeOptions& options) const override;
  std::string TokenBytes(int id) const override;
  int bos_id() const override { return kBos; }
  int eos_id() const override { return kEos; }
  int vocab_size() const override { return kMinVocab; }
};

// The tokenizer for the checkpoint in `dir`: its tokenizer.json (with
// tokenizer_config.json, generation_config.json, config.json) when present;
// the ByteTokenizer when the directory has no tokenizer file (synthetic
// models). UNIMPLEMENTED for a SentencePiece tokenizer.model without
// tokenizer.json. INVALID_ARGUMENT, naming both files, when the tokenizer
// has ids at or beyond config.json's `vocab_size`.
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadCheckpointTokenizer(const std::string& dir,
                                                                   int vocab_size);

class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer* tokenizer, bool skip_special_tokens = true)
      : stream_(tokenizer->NewDecodeStream(skip_special_tokens)) {}
  // Appends one token; returns the text it completes (maybe empty).
  std::string Push(int id);
  // Ends the stream; an incomplete trailing character becomes U+FFFD.
  std::string Flush();

 private:
  std::unique_ptr<TokenDecodeStream> stream_;
  tokenizer::Utf8Sanitizer utf8_;
};

}  // namespace ballast::engine
