// DeviceWeights: a Llama-family checkpoint uploaded to one GPU in the
// activation type (BF16, or FP16 for FP16 checkpoints), laid out for the
// CUDA executor: q/k/v concatenated into one [(H + 2 Hkv) D, hidden]
// matrix and gate/up into one [2 I, hidden] matrix, so each is one GEMM.
// Tensors stream from the memory-mapped safetensors files (no float32 host
// copy); F32 and F16 sources are converted on the device.
//
// Where the tensors live: a caller-provided range (weight pages mapped from
// the device's balloon) or, when `at` is null, one cudaMalloc owned by the
// DeviceWeights (static mode, tests, benchmarks).
//
// Activation from host memory: SaveToHost copies the device image (the
// exact bytes, layout included) into pinned host memory once; LoadFromHost
// copies it back in 64 MiB chunks spread over several streams, with no
// checkpoint parsing or conversion.
//
// Thread-safety: immutable after Load; SaveToHost only reads.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/cuda/cuda_status.h"
#include "engine/cuda/kernels.h"
#include "engine/executor.h"
#include "engine/model_config.h"

namespace ballast::engine::cuda {

struct DeviceLayer {
  void* input_norm = nullptr;  // [hidden]
  void* qkv = nullptr;         // [(H + 2 Hkv) D, hidden]
  void* qkv_bias = nullptr;    // [(H + 2 Hkv) D] or null
  void* o = nullptr;           // [hidden, H D]
  void* o_bias = nullptr;      // [hidden] or null
  void* q_norm = nullptr;      // [D] or null (Qwen3)
  void* k_norm = nullptr;      // [D] or null (Qwen3)
  void* post_norm = nullptr;   // [hidden]
  void* gate_up = nullptr;     // [2 I, hidden]
  void* down = nullptr;        // [hidden, I]
};

struct WeightDest {
  uint8_t* at = nullptr;  // null: allocate with cudaMalloc
  size_t capacity = 0;    // bytes at `at`; must be >= DeviceWeights::Bytes
};

// A device weight image in pinned host memory (engine::HostWeights).
class PinnedWeights final : public HostWeights {
 public:
  // Uninitialised pinned memory for an image of `bytes` (benchmarks fill
  // it themselves; serving gets images from SaveToHost).
  static absl::StatusOr<std::shared_ptr<PinnedWeights>> Allocate(size_t bytes, ActType type);
  ~PinnedWeights() override;
  uint8_t* mutable_data() { return data_; }
  int64_t bytes() const override { return static_cast<int64_t>(bytes_); }
  ActType type() const { return type_; }
  const uint8_t* data() const { return data_; }

 private:
  friend class DeviceWeights;
  PinnedWeights() = default;
  uint8_t* data_ = nullptr;
  size_t bytes_ = 0;
  ActType type_ = ActType::kBF16;
};

class DeviceWeights {
 public:
  // Device bytes the weights of `config` take in `type` (layout included).
  static int64_t Bytes(const ModelConfig& config, ActType type);
  static absl::StatusOr<std::unique_ptr<DeviceWeights>> Load(const std::string& dir,
                                                             const ModelConfig& config,
                                                             ActType type, cudaStream_t stream,
                                                             WeightDest dest = {});
  // Activation from a SaveToHost image of the same config and type:
  // `streams` copy streams (>= 1), 64 MiB chunks round robin.
  static absl::StatusOr<std::unique_ptr<DeviceWeights>> LoadFromHost(const PinnedWeights& image,
                                                                     const ModelConfig& config,
                                                                     ActType type, int streams,
                                                                     WeightDest dest = {});
  // Copies the device image into pinned host memory (on its own stream).
  absl::StatusOr<std::shared_ptr<PinnedWeights>> SaveToHost() const;

  ActType type() const { return type_; }
  const void* embed() const { return embed_; }  // [vocab, hidden]
  const void* final_norm() const { return final_norm_; }
  const void* lm_head() const { return lm_head_; }  // [vocab, hidden] (embed when tied)
  const DeviceLayer& layer(int l) const { return layers_[l]; }
  // Layer l's bytes in the image: [offset, offset + bytes), its tensors
  // contiguous and laid out identically in every layer.
  LayerExtent layer_extent(int l) const;
  uint8_t* base() const { return base_; }
  int64_t bytes() const { return static_cast<int64_t>(bytes_); }

 private:
  struct Piece;
  DeviceWeights() = default;
  // Lays the tensors out from `base` (null: sizes only); returns the bytes
  // and, when `pieces` is set, what to copy where.
  size_t Layout(const ModelConfig& c, uint8_t* base, std::vector<Piece>* pieces);
  absl::Status Place(const ModelConfig& c, WeightDest dest);

  ActType type_ = ActType::kBF16;
  DeviceBuffer storage_;  // when no destination was given
  uint8_t* base_ = nullptr;
  size_t bytes_ = 0;
  void* embed_ = nullptr;
  void* final_norm_ = nullptr;
  void* lm_head_ = nullptr;
  std::vector<DeviceLayer> layers_;
};

}  // namespace ballast::engine::cuda
