// What a Hugging Face checkpoint's tokenizer_config.json,
// generation_config.json and config.json say about special tokens, EOS,
// chat template and default sampling, as transformers reads them.
//
// Thread-safety: plain values.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/tokenizer/json_field.h"

namespace ballast::tokenizer {

// generation_config.json's sampling defaults (unset: not given).
struct GenerationDefaults {
  std::optional<double> temperature;
  std::optional<double> top_p;
  std::optional<int> top_k;
  std::optional<bool> do_sample;  // false: greedy
};

struct CheckpointSettings {
  // tokenizer_config.json (with transformers' per-class defaults when a key
  // is absent: GemmaTokenizer's mask "<mask>", LlamaTokenizer's "<s>" ...).
  std::optional<std::string> bos_token;
  std::optional<std::string> eos_token;
  std::optional<bool> add_bos_token;
  std::optional<bool> add_eos_token;
  // Every special token the config names (bos, eos, unk, pad, mask, sep,
  // cls, additional_special_tokens, extra_special_tokens): transformers skips
  // them in decode(skip_special_tokens=True).
  std::vector<std::string> special_tokens;
  std::string chat_template;  // "" if none
  // generation_config.json then config.json: eos_token_id (int or list).
  std::vector<int> eos_token_ids;
  std::optional<int> bos_token_id;
  GenerationDefaults generation;
};

// Any of the three may be null JSON (file absent).
absl::StatusOr<CheckpointSettings> ParseCheckpointSettings(const JsonField& tokenizer_config,
                                                           const JsonField& generation_config,
                                                           const JsonField& model_config);

}  // namespace ballast::tokenizer
