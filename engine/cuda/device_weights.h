// DeviceWeights: a Llama-family checkpoint uploaded to one GPU in the
// activation type (BF16, or FP16 for FP16 checkpoints), laid out for the
// CUDA executor: q/k/v concatenated into one [(H + 2 Hkv) D, hidden]
// matrix and gate/up into one [2 I, hidden] matrix, so each is one GEMM.
// Tensors stream from the memory-mapped safetensors files (no float32 host
// copy); F32 and F16 sources are converted on the device.
//
// Thread-safety: immutable after Load.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/cuda/cuda_status.h"
#include "engine/cuda/kernels.h"
#include "engine/model_config.h"

namespace ballast::engine::cuda {

struct DeviceLayer {
  void* input_norm = nullptr;  // [hidden]
  void* qkv = nullptr;         // [(H + 2 Hkv) D, hidden]
  void* qkv_bias = nullptr;    // [(H + 2 Hkv) D] or null
  void* o = nullptr;           // [hidden, H D]
  void* o_bias = nullptr;      // [hidden] or null
  void* post_norm = nullptr;   // [hidden]
  void* gate_up = nullptr;     // [2 I, hidden]
  void* down = nullptr;        // [hidden, I]
};

class DeviceWeights {
 public:
  static absl::StatusOr<std::unique_ptr<DeviceWeights>> Load(const std::string& dir,
                                                             const ModelConfig& config,
                                                             ActType type, cudaStream_t stream);

  ActType type() const { return type_; }
  const void* embed() const { return embed_; }        // [vocab, hidden]
  const void* final_norm() const { return final_norm_; }
  const void* lm_head() const { return lm_head_; }    // [vocab, hidden] (embed when tied)
  const DeviceLayer& layer(int l) const { return layers_[l]; }
  int64_t bytes() const { return static_cast<int64_t>(storage_.bytes()); }

 private:
  DeviceWeights() = default;
  ActType type_ = ActType::kBF16;
  DeviceBuffer storage_;  // every tensor, carved in order
  void* embed_ = nullptr;
  void* final_norm_ = nullptr;
  void* lm_head_ = nullptr;
  std::vector<DeviceLayer> layers_;
};

}  // namespace ballast::engine::cuda
