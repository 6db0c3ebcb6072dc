// Synthetic checkpoints: writes a Llama-family model with seeded random
// weights as real HF-format files (config.json + model.safetensors), loadable
// by Ballast and by transformers alike. Used by `ballast make-model`, the
// embedded default and the tests. Pure function of the spec: the same spec
// writes the same bytes.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "engine/model_config.h"

namespace ballast::engine {

struct SyntheticModelSpec {
  // llama | qwen2 | mistral | qwen3 (q/k norms, no bias)
  std::string architecture = "llama";
  int layers = 2;
  int hidden = 64;
  int heads = 4;
  int kv_heads = 2;
  int head_dim = 0;  // 0: hidden / heads; else explicit (q_dim need not equal hidden)
  int intermediate = 128;
  int vocab = 258;  // at least 258 for the byte tokenizer
  int max_position = 1024;
  std::string dtype = "bf16";  // bf16 | fp16 | f32
  uint64_t seed = 1;
  bool tie_embeddings = false;
  bool llama3_rope_scaling = false;
  double rope_theta = 10000.0;
  // Standard deviation of the random projection weights.
  double init_std = 0.05;
  // Scale down the output rows of non-printable tokens (untied models only)
  // so generated text is mostly readable ASCII. Weights stay random.
  bool printable_prior = true;
};

// The ModelConfig that `spec` describes (validated).
absl::StatusOr<ModelConfig> SyntheticConfig(const SyntheticModelSpec& spec);

// How WriteSyntheticModel spends the host; the bytes written do not depend
// on it.
struct SyntheticWriteOptions {
  // Threads drawing the weights. Default 0: one per core (an 8B shape takes
  // minutes on one thread). 1: the calling thread only.
  int threads = 0;
  // Samples per work item (default 65,536: about a millisecond of work).
  // Tests make it small to split small tensors across threads.
  int64_t chunk_samples = 1 << 16;
};

// Writes the model into `dir` (created if missing).
absl::Status WriteSyntheticModel(const SyntheticModelSpec& spec, const std::string& dir,
                                 const SyntheticWriteOptions& options = {});

}  // namespace ballast::engine
