// DeviceWeights: a Llama-family checkpoint uploaded to one GPU in the
// activation type (BF16, or FP16 for FP16 checkpoints) — the linear layers
// quantized to E4M3 at load when the config says kFp8 — laid out for the
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
// exact bytes, layout included) into pinned host memory once (chunks of the
// node's HostArena); LoadFromHost copies it back in 64 MiB pieces spread
// over several streams, with no checkpoint parsing or conversion.
//
// Thread-safety: immutable after Load; SaveToHost only reads.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/checkpoint.h"
#include "engine/cuda/cuda_status.h"
#include "engine/cuda/kernels.h"
#include "engine/executor.h"
#include "engine/host_arena.h"
#include "engine/model_config.h"

namespace ballast::engine::cuda {

// The four linear weights are in the activation type, or E4M3 bytes when
// the config's weight_quant is kFp8; then each has FP32 scales, one per
// row (output channel), and the weight is scale[r] * e4m3 value.
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
  // FP8 only (null otherwise): [(H + 2 Hkv) D], [hidden], [2 I], [hidden].
  float* qkv_scale = nullptr;
  float* o_scale = nullptr;
  float* gate_up_scale = nullptr;
  float* down_scale = nullptr;

  // The same tensors `delta` bytes away (a layer's copy in a remap slot:
  // every layer is laid out alike). Null pointers stay null.
  DeviceLayer Shifted(ptrdiff_t delta) const;
};

struct WeightDest {
  uint8_t* at = nullptr;  // null: allocate with cudaMalloc
  size_t capacity = 0;    // bytes at `at`; must be >= DeviceWeights::Bytes
};

// A device weight image in pinned host memory (engine::HostWeights): the
// chunks of a HostArena pinned when the node started (serving), or one
// cudaHostAlloc of its own (benchmarks; nodes that keep no arena).
class PinnedWeights final : public HostWeights {
 public:
  // One pinned allocation of `bytes`, uninitialised (benchmarks fill it
  // with Fill; serving gets images from SaveToHost).
  static absl::StatusOr<std::shared_ptr<PinnedWeights>> Allocate(size_t bytes, ActType type);
  // Chunks of `arena`, uninitialised; RESOURCE_EXHAUSTED when it has too
  // few free. They go back to the arena with the image.
  static absl::StatusOr<std::shared_ptr<PinnedWeights>> FromArena(std::shared_ptr<HostArena> arena,
                                                                  size_t bytes, ActType type);
  ~PinnedWeights() override;
  PinnedWeights(const PinnedWeights&) = delete;  // the chunks go back once
  PinnedWeights& operator=(const PinnedWeights&) = delete;
  // Host memory held (whole chunks).
  int64_t bytes() const override {
    return static_cast<int64_t>(chunks_.chunks.size() * chunks_.chunk_bytes);
  }
  // The device image's size.
  int64_t image_bytes() const { return static_cast<int64_t>(chunks_.bytes); }
  ActType type() const { return type_; }
  const HostChunks& chunks() const { return chunks_; }
  void Fill(uint8_t value);
  // Queues the copy of image bytes [offset, offset + n) to `dst` on
  // `stream` (one cudaMemcpyAsync per chunk it spans; capturable).
  cudaError_t CopyToDevice(void* dst, size_t offset, size_t n, cudaStream_t stream) const;

 private:
  PinnedWeights() = default;
  HostChunks chunks_;
  std::shared_ptr<HostArena> arena_;  // null: chunks_ is one cudaHostAlloc
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
  // Copies the device image into pinned host memory (on its own streams):
  // chunks of `arena`, or a new cudaHostAlloc when it is null (which holds
  // up the process's other CUDA calls while it pins; engine/host_arena.h).
  absl::StatusOr<std::shared_ptr<PinnedWeights>> SaveToHost(
      const std::shared_ptr<HostArena>& arena) const;

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
  struct Source;
  struct Carver;
  DeviceWeights() = default;
  // Layer l's tensors, carved in order by `k`.
  void LayoutLayer(const ModelConfig& c, int l, Carver* k);
  // Every tensor (and an FP8 checkpoint's scales) checked against the
  // layout before anything is allocated; `staging` grows to the largest
  // tensor that is converted or quantized on the way.
  absl::Status CheckSources(const CheckpointIndex& idx, const ModelConfig& c,
                            const std::vector<Piece>& pieces, std::vector<Source>* sources,
                            size_t* staging) const;
  // Queues one piece's copy (and conversion or quantization) on `stream`.
  absl::Status Upload(const Piece& pc, const Source& src, void* stage, cudaStream_t stream) const;
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
