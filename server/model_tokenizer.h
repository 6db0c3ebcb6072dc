// Giving a synthetic model a real tokenizer (`serve.models[].tokenizer`):
// the tokenizer's files are copied into the model's directory and the
// model's config.json takes its BOS and EOS ids, so the random-weight model
// is served like a real checkpoint (chat template, special tokens, EOS).
//
// Thread-safety: free functions on the file system; callers keep them off
// directories others write.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace ballast::server {

// The vocabulary size the tokenizer in `dir` (tokenizer.json, with its
// tokenizer_config.json) needs of a model.
absl::StatusOr<int> TokenizerVocabSize(const std::string& dir);

// Copies tokenizer.json, tokenizer_config.json and, when present,
// generation_config.json, special_tokens_map.json and chat_template.jinja
// from `tokenizer_dir` into `model_dir`, and writes the tokenizer's BOS and
// EOS ids into `model_dir`/config.json.
absl::Status AttachTokenizer(const std::string& tokenizer_dir, const std::string& model_dir);

}  // namespace ballast::server
