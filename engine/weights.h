// ModelWeights: a Llama-family checkpoint loaded from a directory of
// safetensors files into float32 matrices for the CPU backend.
//
// Every tensor is checked against the ModelConfig (name present, shape,
// finite values); errors name the tensor and the file. Immutable after
// Load; safe to share across threads.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model_config.h"

namespace ballast::engine {

// Row-major float32 matrix [rows, cols]; a vector has rows == 1.
struct Matrix {
  int rows = 0;
  int cols = 0;
  std::vector<float> data;
  const float* row(int r) const { return data.data() + static_cast<size_t>(r) * cols; }
};

// The FP8 reference (WeightQuant::kFp8): each row r of `m` becomes
// scale_r * e4m3(m[r][i] / scale_r), scale_r = max|m[r]| / 448 (1 for a
// zero row), e4m3 rounding to nearest even and saturating: the values the
// CUDA backend's E4M3 weights and per-row scales stand for. Returns the
// scales. The CPU backend also rounds each linear layer's input this way,
// one scale per token, as the CUDA backend quantizes its activations, in
// steps of more than kFp8UnroundedInputMaxTokens tokens.
std::vector<float> RoundRowsToFp8(Matrix* m);
// Steps of at most this many tokens multiply FP8 weights by unrounded
// inputs: the CUDA backend's decode products of up to four rows read E4M3
// weights beside BF16/FP16 activations (W8A16, engine/cuda/kernels.h,
// SkinnyGemmFp8WeightsSupports; GpuExecutorOptions::skinny_fp8_max_m's
// default), which quantizing would only make slower and less exact (on an
// H100, 8B shape: 5.59 ms a step at three rows and 5.62 at four, against
// 6.01 and 5.97 quantized through cuBLASLt; docs/benchmarks.md, session
// 67). (Not in the CUDA deterministic mode, which has no skinny kernel:
// there every step rounds.)
constexpr int kFp8UnroundedInputMaxTokens = 4;
void RoundRowsToFp8(float* data, int rows, int cols, float* scales = nullptr);

struct LayerWeights {
  Matrix input_norm;              // [1, hidden]
  Matrix q, k, v, o;              // [q_dim, hidden], [kv_dim, hidden] x2, [hidden, q_dim]
  Matrix q_bias, k_bias, v_bias;  // [1, q_dim], [1, kv_dim] x2 (empty unless qkv_bias)
  Matrix o_bias;                  // [1, hidden] (empty unless o_bias)
  Matrix q_norm, k_norm;          // [1, head_dim] each (empty unless qk_norm)
  Matrix post_norm;               // [1, hidden]
  Matrix gate, up;                // [intermediate, hidden]
  Matrix down;                    // [hidden, intermediate]
};

struct ModelWeights {
  Matrix embed;  // [vocab, hidden]
  std::vector<LayerWeights> layers;
  Matrix final_norm;  // [1, hidden]
  Matrix lm_head;     // [vocab, hidden]; empty when tied (use embed)
  // Bytes of the checkpoint's tensors in their stored dtype.
  int64_t stored_bytes = 0;

  const Matrix& output_matrix() const { return lm_head.data.empty() ? embed : lm_head; }

  // Loads every *.safetensors file in `dir` (sharded checkpoints included).
  // With config.weight_quant == kFp8 the linear layers' rows are rounded
  // by RoundRowsToFp8 (float32 storage: a reference, not a saving; the
  // CpuExecutor rounds their inputs per token).
  static absl::StatusOr<ModelWeights> Load(const std::string& dir, const ModelConfig& config);
};

}  // namespace ballast::engine
