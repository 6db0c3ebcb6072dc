// The decode path's paged split-KV attention on tensor cores: the
// partitioned kernel (a block a (token, KV head, head group, partition);
// GetPagedBlockTask) and the stream plan's (a block an equal run of the
// launch's chunks; paged_attention_stream.cuh), both built from the
// warp-level pieces of paged_attention_mma.cuh, and the one kernel table
// that maps (KV type, head size) to their instantiations for the launch
// and the occupancy query.
#include <algorithm>
#include <atomic>

#include "engine/cuda/paged_attention_mma.cuh"
#include "engine/cuda/paged_attention_stream.cuh"

namespace ballast::engine::cuda {
namespace {

using namespace paged_mma;  // NOLINT(build/namespaces): this file's own pieces

template <typename T, typename KvT, int D>
__global__ void __launch_bounds__(kThreads)
    PagedAttentionMmaKernel(const T* __restrict__ q, TokenMap tokens, int num_heads, PagedKv kv,
                            float scale, int partition_tokens, int heads_per_block,
                            PagedWorkspace ws, T* __restrict__ out) {
  static_assert(sizeof(T) == 2, "activations of 2-byte elements");
  using S = Shape<KvT, D>;
  extern __shared__ __align__(128) uint8_t smem[];
  AllowNextGrid();
  WaitPriorGrid();
  PagedBlockTask w;
  if (const PagedTask task =
          GetPagedBlockTask(tokens, num_heads, kv, partition_tokens, heads_per_block, ws, &w);
      task != PagedTask::kWork) {
    if (task == PagedTask::kEmptySplit) ArriveAndMerge(w, num_heads, D, ws, out);
    return;
  }
  AttendKeys<T, KvT, D>(q, num_heads, kv, scale * kv.k_scale * kPagedLog2e, w, smem);
  MergeWarpsAndStore<T, kRows, D>(smem, S::kWarpBytes, w, num_heads, kv.v_scale, ws, out);
  if (!w.direct) ArriveAndMerge(w, num_heads, D, ws, out);
}

// The stream plan's kernel: block b attends its run of the launch's chunks
// (paged_attention_stream.cuh) segment by segment, each as the kernel above
// attends a partition, and writes the output (a whole unit) or a piece,
// whose unit's last block to finish merges the pieces.
template <typename T, typename KvT, int D>
__global__ void __launch_bounds__(kThreads)
    PagedAttentionStreamKernel(const T* __restrict__ q, TokenMap tokens, int num_heads, PagedKv kv,
                               float scale, int partition_tokens, int heads_per_block,
                               PagedWorkspace ws, T* __restrict__ out) {
  static_assert(sizeof(T) == 2, "activations of 2-byte elements");
  static_assert(kChunk == kAttentionStreamChunk, "a stream chunk is a warp's staged chunk");
  using S = Shape<KvT, D>;
  extern __shared__ __align__(128) uint8_t smem[];
  AllowNextGrid();
  WaitPriorGrid();
  const int4 s4 = reinterpret_cast<const int4*>(tokens.stream)[blockIdx.x];
  const int ctas = static_cast<int>(gridDim.x);
  const int64_t total = s4.z;
  int64_t j = blockIdx.x * total / ctas;
  const int64_t j_end = (blockIdx.x + 1) * total / ctas;
  if (j >= j_end) return;
  StreamCursor cursor(tokens, num_heads, kv, heads_per_block, {s4.x, s4.y, s4.z, 0});
  const StreamPieces pieces(ws);
  const float c2 = scale * kv.k_scale * kPagedLog2e;
  while (j < j_end) {
    PagedBlockTask w;
    int64_t first, seg_end;
    int chunks;
    cursor.Segment(j, j_end, &w, &first, &chunks, &seg_end);
    AttendKeys<T, KvT, D>(q, num_heads, kv, c2, w, smem);
    if (w.direct) {
      MergeWarpsAndStore<T, kRows, D>(smem, S::kWarpBytes, w, num_heads, kv.v_scale, ws, out);
    } else {
      const int b0 = StreamBlockOf(first, total, ctas);
      const int b1 = StreamBlockOf(first + chunks - 1, total, ctas);
      const int piece = j == first ? static_cast<int>(blockIdx.x) : ctas + blockIdx.x;
      MergeWarpsAndStorePiece<kRows, D>(smem, S::kWarpBytes, w, kv.v_scale, pieces, piece);
      if (ArriveLast(w, num_heads, ws, StreamBlocksHolding(b0, b1, total, ctas))) {
        MergeStreamPieces<T, kRows>(w, num_heads, D, pieces, b0, b1, total, ctas, out);
      }
    }
    __syncthreads();  // the warps' states are read before the next segment's copies
    j = seg_end;
  }
  (void)partition_tokens;
}

// Raises both kernels' dynamic shared memory limit to their Shape (once
// per device).
template <typename T, typename KvT, int D>
cudaError_t AllowSmem() {
  static std::atomic<uint64_t> smem_set{0}, stream_smem_set{0};  // per device
  const cudaError_t e =
      SetMaxDynamicSmemOnce(&PagedAttentionMmaKernel<T, KvT, D>, Shape<KvT, D>::kBytes, &smem_set);
  if (e != cudaSuccess) return e;
  return SetMaxDynamicSmemOnce(&PagedAttentionStreamKernel<T, KvT, D>, Shape<KvT, D>::kBytes,
                               &stream_smem_set);
}

// One instantiation of the two kernels, as the launch and the occupancy
// query both see it: the entry points (one signature: the stream kernel
// ignores partition_tokens), their dynamic shared memory, and the call
// that lets them have that much. `fn` is null where none serves the shape.
template <typename T>
struct MmaKernel {
  using Fn = void (*)(const T*, TokenMap, int, PagedKv, float, int, int, PagedWorkspace, T*);
  Fn fn = nullptr;         // partitioned
  Fn stream_fn = nullptr;  // the stream plan's
  int smem_bytes = 0;
  cudaError_t (*allow_smem)() = nullptr;
};

template <typename T, typename KvT>
MmaKernel<T> MmaKernelForDim(int head_dim) {
  switch (head_dim) {
#define BALLAST_MMA_CASE(DIM)                                                                  \
  case DIM:                                                                                    \
    if constexpr (PagedAttentionMmaServes(DIM)) {                                              \
      return {&PagedAttentionMmaKernel<T, KvT, DIM>, &PagedAttentionStreamKernel<T, KvT, DIM>, \
              Shape<KvT, DIM>::kBytes, &AllowSmem<T, KvT, DIM>};                               \
    } else {                                                                                   \
      return {};                                                                               \
    }
    BALLAST_ATTENTION_HEAD_DIMS(BALLAST_MMA_CASE)
#undef BALLAST_MMA_CASE
    default:
      return {};
  }
}

// The kernel table: the one place that maps (KV type, head size) to an
// instantiation; LaunchPagedAttentionMma and PagedAttentionMmaBlocksPerSm
// both go through it, so the plan's occupancy is the launched kernel's.
template <typename T>
MmaKernel<T> MmaKernelFor(KvType kv_type, int head_dim) {
  return kv_type == KvType::kFP8E4M3 ? MmaKernelForDim<T, __nv_fp8_e4m3>(head_dim)
                                     : MmaKernelForDim<T, T>(head_dim);
}

// The instantiation for (kv_type, head_dim) with its shared memory limit
// raised; null `fn` (and cudaErrorInvalidValue) where none serves.
template <typename T>
cudaError_t ReadyMmaKernel(KvType kv_type, int head_dim, MmaKernel<T>* kernel) {
  *kernel = MmaKernelFor<T>(kv_type, head_dim);
  if (kernel->fn == nullptr) return cudaErrorInvalidValue;
  return kernel->allow_smem();
}

}  // namespace

bool PagedAttentionMmaSupports(int head_dim, KvType kv_type, ActType act_type) {
  const bool same = (kv_type == KvType::kBF16 && act_type == ActType::kBF16) ||
                    (kv_type == KvType::kF16 && act_type == ActType::kF16);
  return (same || kv_type == KvType::kFP8E4M3) && PagedAttentionMmaServes(head_dim) &&
         PagedAttentionSupports(head_dim);
}

cudaError_t LaunchPagedAttentionMma(const void* q, TokenMap tokens, int num_heads,
                                    const PagedKv& kv, float scale, int partition_tokens, dim3 grid,
                                    int heads_per_block, const PagedWorkspace& ws, void* out,
                                    ActType type, cudaStream_t stream, bool streamed) {
  if (!PagedAttentionMmaSupports(kv.head_dim, kv.dtype, type) || heads_per_block > kRows ||
      (streamed && tokens.stream == nullptr)) {
    return cudaErrorInvalidValue;
  }
  BALLAST_DISPATCH_ACT(type, T, {
    MmaKernel<T> kernel;
    const cudaError_t e = ReadyMmaKernel<T>(kv.dtype, kv.head_dim, &kernel);
    if (e != cudaSuccess) return e;
    return LaunchKernel(streamed ? kernel.stream_fn : kernel.fn, grid, kThreads, kernel.smem_bytes,
                        stream, static_cast<const T*>(q), tokens, num_heads, kv, scale,
                        partition_tokens, heads_per_block, ws, static_cast<T*>(out));
  });
  return cudaErrorInvalidValue;
}

cudaError_t PagedAttentionMmaBlocksPerSm(int head_dim, KvType kv_type, ActType act_type,
                                         int* blocks, bool streamed) {
  if (!PagedAttentionMmaSupports(head_dim, kv_type, act_type)) return cudaErrorInvalidValue;
  BALLAST_DISPATCH_ACT(act_type, T, {
    MmaKernel<T> kernel;
    const cudaError_t e = ReadyMmaKernel<T>(kv_type, head_dim, &kernel);
    if (e != cudaSuccess) return e;
    return cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        blocks, streamed ? kernel.stream_fn : kernel.fn, kThreads, kernel.smem_bytes);
  });
  return cudaErrorInvalidValue;
}

}  // namespace ballast::engine::cuda
