// PostProcessor: what tokenizer.json's "post_processor" adds around a single
// sequence when special tokens are requested (HF add_special_tokens=True):
// TemplateProcessing ("single" template), BertProcessing and
// RobertaProcessing (cls ... sep), ByteLevel (nothing) and Sequence. Pair
// templates are not used by a serving engine and are ignored.
//
// Thread-safety: plain value; immutable after FromJson.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "engine/tokenizer/json_field.h"

namespace ballast::tokenizer {

struct SpecialTokensAround {
  std::vector<int> prefix;
  std::vector<int> suffix;
};

// Parses "post_processor" (null: nothing added).
absl::StatusOr<SpecialTokensAround> ParsePostProcessor(const JsonField& j);

}  // namespace ballast::tokenizer
