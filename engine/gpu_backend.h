// The GPU backend as seen from code that must build without CUDA. The
// implementation file is chosen at build time: engine/cuda/cuda_backend.cc
// when a CUDA toolkit is found, engine/gpu_backend_stub.cc (every call
// returns UNIMPLEMENTED) otherwise. No #ifdef anywhere.
//
// Thread-safety: the functions are thread-safe; see each object's header.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/executor.h"
#include "engine/kv_cache.h"
#include "engine/model_config.h"
#include "memory/block_allocator.h"
#include "memory/page_pool.h"

namespace ballast::engine {

struct GpuExecutorOptions {
  // CUDA device ordinal. Default 0.
  int device = 0;
  // Most tokens in one step (prefill chunk + decode tokens). Default 256.
  int max_batch_tokens = 256;
  // Longest context a sequence reaches; sizes the block-table stride
  // (4 bytes per layer per block per sequence slot).
  int max_context = 4096;
  // Replay decode-only steps from CUDA graphs. Default on; each distinct
  // (batch, context) bucket costs one capture the first time.
  bool cuda_graphs = true;
  // Products with at most this many rows use Ballast's skinny GEMM kernel
  // rather than cuBLASLt (decode). Default 2: measured faster than
  // cuBLASLt at 1 row, slower from 4 rows (H100, 8B shapes); 0 off.
  int skinny_gemm_max_m = 2;
  // Where the weights go: weight pages mapped from the device's balloon
  // (elastic mode). Null: one cudaMalloc owned by the executor.
  uint8_t* weights_at = nullptr;
  size_t weights_capacity = 0;
  // Activate from this host copy (an earlier KeepHostWeights of the same
  // model and backend) instead of the checkpoint; null: read the checkpoint.
  std::shared_ptr<const HostWeights> host_weights;
  // Streams that copy a host copy to the device in parallel chunks. Default 4.
  int copy_streams = 4;
};

// True when this binary was built with the CUDA backend.
bool GpuBackendBuilt();

// A CudaExecutor over `kv` (whose allocator must hand out device memory).
absl::StatusOr<std::unique_ptr<Executor>> CreateGpuExecutor(const ModelConfig& config,
                                                            const std::string& model_dir,
                                                            KvCache* kv,
                                                            const GpuExecutorOptions& options);

// Device bytes the weights of `config` take on the GPU backend (what
// GpuExecutorOptions::weights_capacity must hold).
int64_t GpuWeightBytes(const ModelConfig& config);

// KV cache dtype the GPU backend uses for "auto": the model's activation
// type (BF16, or FP16 for FP16 checkpoints; CudaExecutor::ActivationType).
inline DType GpuAutoKvDType(const ModelConfig& config) {
  return config.torch_dtype == DType::kF16 ? DType::kF16 : DType::kBF16;
}

// A static pool of `num_blocks` device blocks (one cudaMalloc, freed with
// the pool).
absl::StatusOr<std::unique_ptr<memory::BlockAllocator>> CreateGpuBlockPool(int device,
                                                                           size_t block_bytes,
                                                                           int64_t num_blocks);

// A CUDA VMM page pool for the device's elastic KV arena.
absl::StatusOr<std::shared_ptr<memory::PagePool>> CreateGpuPagePool(int device, size_t page_bytes,
                                                                    int64_t budget_bytes);

// `ballast bench-engine`: decode and prefill speed of the CUDA executor on
// one model, against the HBM roofline and cuBLAS's own GEMM rate.
struct GpuEngineBenchOptions {
  std::string model_dir;
  int device = 0;
  std::vector<int> batches = {1, 16, 64, 256};
  int context = 1024;         // tokens of KV each decoding sequence attends to
  int prefill_tokens = 2048;  // prompt length of the prefill measurement
  int steps = 32;             // timed decode steps per batch size
  int warmup = 4;             // untimed steps first (graph capture happens here)
  int prefill_runs = 3;
  int block_tokens = 16;
  std::string kv_dtype = "auto";
  bool cuda_graphs = true;
  // HBM bandwidth of the roofline; 0 = the datasheet figure of the device
  // (H100 SXM 3.35 TB/s, H100 PCIe 2.0, H200 4.8), else the measured
  // device-to-device copy rate.
  double hbm_bytes_per_s = 0;
  bool gemm_peak = true;      // also time an 8192^3 cuBLASLt GEMM
  int skinny_gemm_max_m = 2;  // see GpuExecutorOptions
  // "static": one cudaMalloc'd block pool; "arena": the elastic KV slab
  // arena over CUDA VMM pages (64 MiB slabs), as elastic nodes use.
  std::string kv_pool = "static";
};
// Results as JSON (see engine/cuda/engine_bench.cc for the fields).
absl::StatusOr<std::string> RunGpuEngineBench(const GpuEngineBenchOptions& options);

// `ballast bench-activation`: how long activating a model from its pinned
// host copy takes (weight pages mapped from a VMM pool, chunked copies on
// `copy_streams` streams, executor set up) against the PCIe bound (weight
// bytes / the measured pinned host-to-device copy rate). The weights are
// random (only shapes matter); `config_json` gives the shapes.
struct GpuActivationBenchOptions {
  std::string config_path;  // a config.json
  int device = 0;
  int runs = 3;
  int copy_streams = 4;
  // VMM page (physical handle) size the weights are mapped in. Default
  // 64 MiB: measured on H100, mapping 15 GiB in 2 MiB pages costs ~200 ms
  // (one cuMemMap per page), in 64 MiB pages a few ms.
  size_t page_bytes = 64u << 20;
};
absl::StatusOr<std::string> RunGpuActivationBench(const GpuActivationBenchOptions& options);

// Device memory: free and total bytes.
absl::StatusOr<std::pair<int64_t, int64_t>> GpuMemoryInfo(int device);

}  // namespace ballast::engine
