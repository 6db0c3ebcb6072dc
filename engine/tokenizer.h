// Tokenizers and the streaming detokenizer.
//
// ByteTokenizer is the tokenizer of synthetic models: ids 0..255 are the
// bytes themselves, then BOS (256) and EOS (257); any other id in the
// vocabulary decodes to nothing. StreamDecoder turns a stream of token ids
// into valid UTF-8 text pieces (incomplete characters are held back,
// invalid bytes become U+FFFD), so every piece can travel in a protobuf
// string. Tokenizers are immutable and thread-safe; a StreamDecoder is
// per request and thread-compatible.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace ballast::engine {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Token ids of `text`, without BOS.
  virtual std::vector<int> Encode(std::string_view text) const = 0;
  // Raw bytes of one token (possibly a partial UTF-8 character); empty for
  // special tokens.
  virtual std::string TokenBytes(int id) const = 0;
  virtual int bos_id() const = 0;
  virtual int eos_id() const = 0;
};

class ByteTokenizer final : public Tokenizer {
 public:
  static constexpr int kBos = 256;
  static constexpr int kEos = 257;
  static constexpr int kMinVocab = 258;

  std::vector<int> Encode(std::string_view text) const override;
  std::string TokenBytes(int id) const override;
  int bos_id() const override { return kBos; }
  int eos_id() const override { return kEos; }
};

class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer* tokenizer) : tokenizer_(tokenizer) {}
  // Appends one token; returns the text it completes (maybe empty).
  std::string Push(int id);
  // Ends the stream; an incomplete trailing character becomes U+FFFD.
  std::string Flush();

 private:
  std::string Drain(bool final);
  const Tokenizer* tokenizer_;
  std::string pending_;
};

}  // namespace ballast::engine
