// ModelConfig: the hyper-parameters of a Llama-family decoder, read from a
// Hugging Face `config.json` (LlamaForCausalLM, MistralForCausalLM,
// Qwen2ForCausalLM, Qwen3ForCausalLM) and written back by `ballast
// make-model`.
// Plain value type; thread-compatible.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "engine/dtype.h"

namespace ballast::engine {

struct RopeScaling {
  // Only "llama3" is supported (Llama 3.1+). Other types are rejected.
  std::string type;
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int original_max_position_embeddings = 8192;
};

// How the linear layers (q/k/v, o, gate/up, down) compute when served.
// Not read from config.json: set from the serving options
// (ModelEngineOptions::quantization) before anything is sized.
//   kNone: weights and activations in the activation type (BF16/FP16 on
//          cuda, float32 on cpu).
//   kFp8:  dynamic FP8, as vLLM's "fp8": weights in OCP E4M3 with one
//          float32 scale per output channel (row), scale = max|row| / 448,
//          w = scale * e4m3(w / scale); each layer's input rounded the same
//          way with one scale per token; products accumulated in FP32. The
//          cuda backend stores 1 byte a weight (embeddings, norms, biases
//          and lm_head stay in the activation type) and runs FP8 tensor
//          cores; the cpu backend computes the same rounding in float32
//          (the reference the cuda path is checked against; no saving).
enum class WeightQuant { kNone, kFp8 };
// "none" | "fp8"; errors name the accepted values.
absl::StatusOr<WeightQuant> WeightQuantFromConfig(std::string_view name);
const char* WeightQuantName(WeightQuant q);

struct ModelConfig {
  std::string architecture = "LlamaForCausalLM";  // architectures[0]
  std::string model_type = "llama";
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_hidden_layers = 0;
  int num_attention_heads = 0;
  int num_key_value_heads = 0;
  // Explicit in config.json or hidden_size / num_attention_heads; Qwen3
  // defaults to 128 as transformers' Qwen3Config does.
  int head_dim = 0;
  int vocab_size = 0;
  int max_position_embeddings = 2048;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  std::optional<RopeScaling> rope_scaling;
  bool tie_word_embeddings = false;
  // Bias on q/k/v projections (Qwen2 always; Llama when attention_bias).
  bool qkv_bias = false;
  // Bias on o_proj (Llama's and Qwen3's attention_bias).
  bool o_bias = false;
  // Qwen3: RMSNorm over each head of q and of k (weights q_norm, k_norm of
  // [head_dim], eps rms_norm_eps) after the projection, before RoPE.
  bool qk_norm = false;
  DType torch_dtype = DType::kBF16;
  int bos_token_id = 256;
  int eos_token_id = 257;
  // Serving choice, not part of config.json (ToJson leaves it out).
  WeightQuant weight_quant = WeightQuant::kNone;
  // The checkpoint's linear weights are already E4M3 with scales
  // (config.json's quantization_config: vLLM's "fp8" without blocks, or
  // compressed-tensors' 8-bit float with tensor or channel strategy). Such
  // a model is always served with weight_quant kFp8: the bytes and scales
  // are used as stored (activations are quantized per token, whatever
  // static input scales the checkpoint has).
  bool fp8_checkpoint = false;

  // Parses config.json at `path`. Errors name the file and the key.
  static absl::StatusOr<ModelConfig> Load(const std::string& path);
  static absl::StatusOr<ModelConfig> Parse(const std::string& json_text, const std::string& origin);
  // HF-compatible config.json text.
  std::string ToJson() const;

  int q_dim() const { return num_attention_heads * head_dim; }
  int kv_dim() const { return num_key_value_heads * head_dim; }
  // Number of weight parameters (for memory accounting).
  int64_t NumParameters() const;
};

// Sets c->weight_quant from a serving option ("none" | "fp8"), except for
// an FP8 checkpoint, which is served as stored (fp8) whatever it says.
// INVALID_ARGUMENT for an unknown option.
absl::Status ApplyServingQuant(std::string_view option, ModelConfig* c);

}  // namespace ballast::engine
