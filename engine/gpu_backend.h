// The GPU backend as seen from code that must build without CUDA. The
// implementation file is chosen at build time: engine/cuda/cuda_backend.cc
// when a CUDA toolkit is found, engine/gpu_backend_stub.cc (every call
// returns UNIMPLEMENTED) otherwise. No #ifdef anywhere. The device's page
// pool for elastic memory is memory/gpu_page_pool.h; the GPU benchmarks are
// engine/gpu_bench.h (library ballast_engine_bench).
//
// Thread-safety: the functions are thread-safe; see each object's header.
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "engine/executor.h"
#include "engine/host_arena.h"
#include "engine/kv_cache.h"
#include "engine/model_config.h"
#include "engine/weights.h"
#include "memory/block_allocator.h"

namespace ballast::engine {

// GpuExecutorOptions::skinny_mma_max_m's default (at most the CUDA
// kernels' kSkinnyMmaMaxM, checked where both are seen).
inline constexpr int kSkinnyMmaDefaultMaxM = 16;

struct GpuExecutorOptions {
  // CUDA device ordinal. Default 0.
  int device = 0;
  // Most tokens in one step (prefill chunk + decode tokens). Default 256.
  int max_batch_tokens = 256;
  // Most sequences in one step (the planner's max_seqs). Sizes what is per
  // sequence, not per token: the logits (one row per sampled position,
  // vocab x 4 bytes each; for an 8B Llama-3 at 1,024 batch tokens that was
  // 525 MB, at 64 sequences 33 MB), their gathered rows and the block
  // table. Rows are min(max_batch_tokens, GraphBucketTokens(max_seqs)):
  // decode graphs pad the batch to its bucket (engine/graph_buckets.h).
  // 0: max_batch_tokens
  // (the engine benchmark's decode batches). Default 0.
  int max_seqs = 0;
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
  // FP8 products (E4M3 weights) with at most this many rows read the
  // activations as they are (W8A16 on the skinny kernel, up to 4 rows);
  // larger ones quantize them to E4M3 per token first (W8A8). The default
  // is the CPU reference's (engine/weights.h, kFp8UnroundedInputMaxTokens);
  // 0: always quantize.
  int skinny_fp8_max_m = kFp8UnroundedInputMaxTokens;
  // FP8 products of more rows than skinny_gemm_max_m and at most this many
  // (up to 16, engine/cuda/kernels.h's kSkinnyMmaMaxM) run the tensor-core
  // skinny kernel: the rows of x as an mma's columns, the E4M3 weights
  // streamed once (W8A16 up to skinny_fp8_max_m rows, W8A8 past it).
  // Measured on an H100 (8B shape): steps of 4, 8 and 16 rows 23%, 17% and
  // 8% faster than the CUDA-core kernel and cuBLASLt's FP8 GEMM. 0: off.
  int skinny_mma_max_m = kSkinnyMmaDefaultMaxM;
  // BF16/FP16 weights take it too (the same rows). Default off: cuBLASLt's
  // products gave 4-20% faster steps at 3-16 rows (H100, 8B shape).
  bool skinny_mma_2byte = false;
  // Fold the RMSNorms between skinny products into them (decode steps of
  // at most two tokens, one with FP8 weights; kernels.h, SkinnyNormOut):
  // 63 fewer launches a step for 32 layers. Off in deterministic mode (no
  // skinny kernel there). Default on; off only to measure it
  // (bench-engine --no-fold-norms).
  bool fold_norms = true;
  // With fold_norms (and no Qwen3 head norms): RoPE and the KV write in the
  // qkv product's epilogue (kernels.h, LaunchSkinnyGemmRopeKv), one launch
  // a layer fewer. Default on; off only to measure it (bench-engine
  // --no-fold-rope).
  bool fold_rope = true;
  // cuBLASLt algorithms timed per GEMM shape and row bucket (up to 2,048
  // rows) at its first uncaptured call (Gemm's tuning, engine/cuda/gemm.h):
  // the fastest is kept. Costs each bucket's first step about this many x 4
  // products of each shape and as many waits for the stream (a decode
  // graph's bucket: at its warm-up run, before capture). Default 0:
  // cuBLASLt's heuristic first, untimed, the same algorithms every run. On
  // an H200 (8B, docs/benchmarks.md, "cuBLASLt's picks between powers of
  // two") 8 candidates took a 448-row decode step from 19.5 to 16.2 ms, but
  // moved other buckets by -4% to +3%, and 1,000 requests offline gained
  // nothing: their buckets lived too few steps to repay the timing. Off in
  // deterministic mode.
  int gemm_tune_candidates = 0;
  // At Init, launch each cuBLASLt product a step runs (each layer
  // product with layer 0's weights, and the LM head's) at every row
  // bucket (engine/graph_buckets.h) up to max_batch_tokens, the rows of
  // an eager step with prefill chunks (the LM head's, which runs on the
  // sampled rows, up to the graphs' rows: min(GraphBucketTokens(max_seqs),
  // max_batch_tokens)), on zeros, queued on the step stream and not
  // waited for; a product whose algorithm was already launched for its
  // shape is skipped (Gemm::SetWarming). cuBLASLt sets a
  // kernel's attributes at its first launch, and on an H200 that call
  // waited for all the work queued on the device: a busy server's first
  // step in a new bucket (the head's rows change with every step that
  // finishes prompts) blocked its launch for the step in flight
  // (docs/benchmarks.md, "The prefill launch that waited for the
  // device"), and so did the first prefill step of a new bucket past the
  // graphs' rows (docs/benchmarks.md, "Prefill buckets warmed too").
  // Costs, for an 8B at max_seqs 1,024 and max_batch_tokens 8,192 on an
  // H200, about 4 ms of an activation (357-359 ms against 353-356 not
  // warmed), and 230-400 ms more of a process's first,
  // where cuBLASLt loads the kernels (docs/benchmarks.md, "Products
  // warmed at activation"); on a device busy with other models each first launch
  // also waits for their queued work, as it would in this model's steps.
  // With tuning (gemm_tune_candidates) a row count between buckets runs
  // its own pick or its bucket's timed winner, which may still be a first
  // launch in a step; the buckets are timed at their first step, on its
  // operands. A failure here is logged, not returned. Default on.
  bool warm_products = true;
  // Batch-invariant kernels (engine.deterministic): a sequence's logits do
  // not depend on what else shares its steps. GEMMs run one fixed cuBLASLt
  // algorithm per shape (no split-K, no skinny kernel) and every token's
  // attention the split-KV kernel with fixed-length partitions (no
  // tensor-core prefill kernel). Costs speed; docs/benchmarks.md says how
  // much. Default off.
  bool deterministic = false;
  // How the end of a step's device work is signalled
  // (Executor::NotifyWhenStepDone; StepDoneSignal says what each costs).
  StepDoneSignal step_done = StepDoneSignal::kSpinningThread;
  // Where the weights go: weight pages mapped from the device's balloon
  // (elastic mode). Null: one cudaMalloc owned by the executor.
  uint8_t* weights_at = nullptr;
  size_t weights_capacity = 0;
  // Activate from this host copy (an earlier KeepHostWeights of the same
  // model and backend) instead of the checkpoint; null: read the checkpoint.
  std::shared_ptr<const HostWeights> host_weights;
  // Where KeepHostWeights puts the host copy (the node's pinned arena);
  // null: a new pinned allocation (engine/host_arena.h says what it costs).
  std::shared_ptr<HostArena> host_arena;
  // Streams that copy a host copy to the device in parallel chunks. Default 4.
  int copy_streams = 4;
  // > 0: the step streams belong to an SM partition (a CUDA green context,
  // engine/cuda/sm_partition.h): their kernels run on the device's first
  // sm_partition SMs (rounded up to the partition granule), or with
  // sm_partition_rest on the SMs left after them. 0: the whole device.
  // Only the engine benchmark's interference runs set it
  // (--interference-sms; docs/benchmarks.md has what it does). Default 0.
  int sm_partition = 0;
  bool sm_partition_rest = false;
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

// Pins host memory for DMA (cudaHostRegister), so copies to and from the
// device run at full PCIe speed; the returned handle unpins it when the
// last reference goes. Null when nothing was pinned (no CUDA backend in
// this build, or the driver refused: copies then still work, slower).
std::shared_ptr<void> PinHostMemory(void* data, size_t bytes);

// Host memory pinned for DMA now, in 1 GiB slabs (cudaHostAlloc, portable
// to every device), lent by the returned arena in chunks of `chunk_bytes`
// (a divisor of 1 GiB). Takes seconds per ten gigabytes: call it before
// serving. UNIMPLEMENTED without the CUDA backend.
absl::StatusOr<std::shared_ptr<HostArena>> CreatePinnedHostArena(int64_t bytes,
                                                                 size_t chunk_bytes = 64u << 20);

// Device memory: free and total bytes.
absl::StatusOr<std::pair<int64_t, int64_t>> GpuMemoryInfo(int device);

}  // namespace ballast::engine
