// Normalizers of tokenizer.json ("normalizer"): NFC, NFD, NFKC, NFKD,
// Lowercase, Strip, StripAccents, Replace (string or regex), Prepend and
// Sequence, with the semantics of Hugging Face `tokenizers`. Precompiled
// (SentencePiece charsmap), BertNormalizer and NMT are not implemented:
// loading a tokenizer that uses them fails with UNIMPLEMENTED naming the key.
//
// Thread-safety: immutable after construction; Normalize is thread-safe.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/tokenizer/json_field.h"

namespace ballast::tokenizer {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  // Normalizes the valid UTF-8 `s` in place.
  virtual void Normalize(std::string* s) const = 0;

  // Builds the normalizer described by `j`; null JSON gives nullptr.
  static absl::StatusOr<std::unique_ptr<Normalizer>> FromJson(const JsonField& j);
};

}  // namespace ballast::tokenizer
