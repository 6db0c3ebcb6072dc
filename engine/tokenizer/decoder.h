// Decoder: tokenizer.json's "decoder" (ByteLevel, Metaspace, Replace,
// ByteFallback, Fuse, Strip, Sequence; none: tokens joined by spaces) as a
// streaming pipeline. Each stage works on chunks of tokens tagged with the
// token's position in that stage's list, so position rules hold exactly as in
// Hugging Face `tokenizers`' decode_chain: Metaspace drops the replacement
// characters of the first token; Strip after Fuse strips the start of the
// whole text; ByteFallback turns a run of <0xNN> tokens into its text when
// the run is valid UTF-8, else into one U+FFFD per byte (a valid run is held
// until it ends, an invalid one is released at once). Pushing tokens one by
// one gives, concatenated, exactly what decoding them together gives.
// WordPiece, BPEDecoder and CTC are not implemented (UNIMPLEMENTED at load).
//
// Thread-safety: a Decoder is immutable and thread-safe; a DecoderState is
// per stream and thread-compatible.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/tokenizer/json_field.h"

namespace ballast::tokenizer {

// A piece of the text of token number `index` (in a stage's list).
struct Chunk {
  std::string text;
  int index = 0;
};

// One step of the pipeline, with its per-stream state.
class DecoderStage {
 public:
  virtual ~DecoderStage() = default;
  virtual void Push(Chunk chunk, std::vector<Chunk>* out) = 0;
  virtual void Finish(std::vector<Chunk>* out) {}
};

// The streaming state of one decode: token strings in, bytes out (UTF-8, or
// raw bytes after a ByteLevel stage; the caller repairs invalid UTF-8).
class DecoderState {
 public:
  explicit DecoderState(std::vector<std::unique_ptr<DecoderStage>> stages)
      : stages_(std::move(stages)) {}
  void Push(std::string_view token, std::string* out);
  void Finish(std::string* out);

 private:
  std::vector<std::unique_ptr<DecoderStage>> stages_;
  int next_index_ = 0;
};

class Decoder {
 public:
  // Builds the decoder described by `j` (null: join tokens with spaces).
  static absl::StatusOr<std::unique_ptr<Decoder>> FromJson(const JsonField& j);
  std::unique_ptr<DecoderState> NewState() const;

 private:
  using StageFactory = std::function<std::unique_ptr<DecoderStage>()>;
  static absl::Status Add(const JsonField& j, std::vector<StageFactory>* out);
  std::vector<StageFactory> factories_;
};

}  // namespace ballast::tokenizer
