// Paged causal attention for mixed prefill/decode batches, split over the
// KV length (flash-decoding). Head sizes that are multiples of 16 up to 128
// go to the tensor-core kernel (paged_attention_mma_kernels.cu), whatever
// the cache type; this file's CUDA-core kernel serves the rest (head sizes
// 8 and 256, BF16, FP16 or FP8 caches), and both share the grid, plan,
// workspace and merge (paged_attention.cuh). Each block handles one query
// token, up to G query heads sharing one kv head (GQA: K and V are read
// once for the group), and one partition of the context. Inside the block
// each warp takes every kWarps-th chunk of keys and streams it through
// shared memory with cp.async, kStages chunks in flight; inside a warp each
// group of kLanes lanes takes one key per load, each lane 8 elements of it,
// so K and V rows are read whole with coalesced vector copies and the loop
// has no block barrier. Every lane group keeps its own online softmax (base
// 2); the groups, then the warps, then the partitions (by the last
// partition to finish, ArriveAndMerge, or by PartitionMergeKernel) are
// merged in a fixed order, so a query's result depends only on its own
// keys and the partition length (deterministic mode relies on it). CUDA
// cores, FP32 accumulation.
#include <algorithm>
#include <type_traits>

#include "engine/cuda/common.cuh"
#include "engine/cuda/paged_attention.cuh"

namespace ballast::engine::cuda {
namespace {

constexpr int kWarps = kPagedAttentionWarps;
constexpr int kThreads = 32 * kWarps;
constexpr int kMaxGroup = kAttentionMaxGroup;  // query heads per block
constexpr float kLog2e = kPagedLog2e;
using Workspace = PagedWorkspace;

// Shapes of one head's row for a head size D: 8 elements per lane.
template <int D>
struct RowShape {
  static constexpr int kSlices = D / 8;  // lanes that hold part of a row
  static constexpr int kLanes = kSlices <= 1    ? 1
                                : kSlices <= 2  ? 2
                                : kSlices <= 4  ? 4
                                : kSlices <= 8  ? 8
                                : kSlices <= 16 ? 16
                                                : 32;  // lanes per key (a power of two)
  static constexpr int kKeysPerLoad = 32 / kLanes;
  static_assert(D % 8 == 0 && kSlices <= 32, "head size");
};

// Raw storage of 8 KV elements: 16 bytes (2-byte types) or 8 (FP8).
template <typename KvT>
struct Vec8 {
  using Raw = typename std::conditional<sizeof(KvT) == 2, uint4, uint2>::type;
  Raw raw;
  __device__ __forceinline__ void ToFloat(float out[8]) const {
    const KvT* e = reinterpret_cast<const KvT*>(&raw);
#pragma unroll
    for (int i = 0; i < 8; ++i) out[i] = ToF(e[i]);
  }
};

// Online-softmax state of one lane group for G heads and the lane's 8 columns.
template <int G>
struct SoftmaxState {
  float m[G], l[G], acc[G][8];
  __device__ __forceinline__ void Init() {
#pragma unroll
    for (int g = 0; g < G; ++g) {
      m[g] = -INFINITY;
      l[g] = 0.0f;
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[g][j] = 0.0f;
    }
  }
  // Folds in (m2, l2, acc2) of the same heads: both sides come out equal
  // whichever is `this` (addition is commutative), which the lane-exchange
  // merge relies on.
  __device__ __forceinline__ void Merge(int g, float m2, float l2, const float acc2[8]) {
    const float mn = fmaxf(m[g], m2);
    const float a = m[g] == -INFINITY ? 0.0f : exp2f(m[g] - mn);
    const float b = m2 == -INFINITY ? 0.0f : exp2f(m2 - mn);
    l[g] = l[g] * a + l2 * b;
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[g][j] = acc[g][j] * a + acc2[j] * b;
    m[g] = mn;
  }
};

constexpr int kStages = 3;  // chunks in flight per warp (2 ahead of the one computed)

// The keys one warp reads: chunks c = 0, 1, ... of kChunk keys from
// start + (c * kWarps + warp) * kChunk, staged through kStages slots of the
// warp's shared memory by cp.async. Each lane copies and reads back only its
// own 8 elements of K and of V, so no barrier is needed. Block ids are
// fetched 32 chunks at a time (one per lane), off the copies' critical path.
template <typename KvT, int D, int U>
class WarpKeys {
 public:
  using Shape = RowShape<D>;
  using Raw = typename Vec8<KvT>::Raw;
  static constexpr int kChunk = U * Shape::kKeysPerLoad;
  static constexpr int kStageBytes = 2 * U * 32 * static_cast<int>(sizeof(Raw));

  __device__ WarpKeys(const PagedKv& kv, int seq, int kvh, int start, int end, uint8_t* smem)
      : kv_(kv), rows_(kv, seq, kvh, end, kv.head_dim), start_(start), end_(end), smem_(smem) {}

  __device__ int First(int c) const {
    return start_ + (c * kWarps + static_cast<int>(threadIdx.x >> 5)) * kChunk;
  }
  __device__ bool Exists(int c) const { return First(c) < end_; }
  __device__ int end() const { return end_; }

  // Starts the copies of chunk c into its slot (none past the end) and
  // closes one commit group either way. Called by the whole warp for
  // c = 0, 1, 2, ... in order.
  __device__ void Issue(int c) {
    const int lane = threadIdx.x & 31;
    const int id = rows_.BlockId(c, [this](int j) { return First(j); });
    if (Exists(c)) {
      const int f = First(c);
      int page_pos0;
      const uint8_t* page = rows_.Page(id, f, kChunk, &page_pos0);
      const int key_in_load = lane / Shape::kLanes, slice = lane % Shape::kLanes;
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int pos = f + u * Shape::kKeysPerLoad + key_in_load;
        const bool valid = pos < end_ && slice < Shape::kSlices;
        const KvT* k = valid ? rows_.Row(page, page_pos0, pos, false) + slice * 8
                             : reinterpret_cast<const KvT*>(kv_.base);
        const KvT* v = valid ? rows_.Row(page, page_pos0, pos, true) + slice * 8 : k;
        CopyAsync<sizeof(Raw)>(Slot(c, false, u), k, valid);
        CopyAsync<sizeof(Raw)>(Slot(c, true, u), v, valid);
      }
    }
    CopyCommit();
  }

  // This lane's 8 elements of load u of chunk c (after its group is waited).
  __device__ Vec8<KvT> Get(int c, bool value, int u) const {
    Vec8<KvT> r;
    r.raw = *reinterpret_cast<const Raw*>(Slot(c, value, u));
    return r;
  }

 private:
  __device__ uint8_t* Slot(int c, bool value, int u) const {
    return smem_ + (c % kStages) * kStageBytes +
           ((value ? U : 0) + u) * 32 * static_cast<int>(sizeof(Raw)) +
           static_cast<int>(threadIdx.x & 31) * static_cast<int>(sizeof(Raw));
  }
  const PagedKv& kv_;
  ChunkRows<KvT> rows_;
  const int start_, end_;
  uint8_t* const smem_;
};

// Chunk c (already copied) for one lane: scores for its key of each load,
// then the online-softmax update and P V for its 8 columns. Keys at or past
// the end are masked.
template <typename KvT, int D, int G, int U>
__device__ __forceinline__ void AttendChunk(const WarpKeys<KvT, D, U>& keys, int c, int ng,
                                            const float (&q)[G][8], SoftmaxState<G>& st) {
  using Shape = RowShape<D>;
  const int key_in_load = (threadIdx.x & 31) / Shape::kLanes;
  const int first = keys.First(c);
  float s[U][G];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    float kf[8];
    keys.Get(c, false, u).ToFloat(kf);
    const bool live = first + u * Shape::kKeysPerLoad + key_in_load < keys.end();
#pragma unroll
    for (int g = 0; g < G; ++g) {
      float d = 0.0f;
#pragma unroll
      for (int j = 0; j < 8; ++j) d += q[g][j] * kf[j];
#pragma unroll
      for (int o = Shape::kLanes / 2; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
      s[u][g] = live ? d : -INFINITY;
    }
  }
#pragma unroll
  for (int g = 0; g < G; ++g) {
    if (g >= ng) continue;
    float mx = s[0][g];
#pragma unroll
    for (int u = 1; u < U; ++u) mx = fmaxf(mx, s[u][g]);
    const float mn = fmaxf(st.m[g], mx);
    if (mn == -INFINITY) continue;  // nothing yet for this lane group
    const float a = exp2f(st.m[g] - mn);
    st.l[g] *= a;
#pragma unroll
    for (int j = 0; j < 8; ++j) st.acc[g][j] *= a;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const float p = exp2f(s[u][g] - mn);
      st.l[g] += p;
      float vf[8];
      keys.Get(c, true, u).ToFloat(vf);
#pragma unroll
      for (int j = 0; j < 8; ++j) st.acc[g][j] += p * vf[j];
    }
    st.m[g] = mn;
  }
}

// Merges the states of a warp's lane groups (lanes kLanes apart) in a
// fixed butterfly order; every lane ends with the warp's state.
template <int kLanes, int G>
__device__ __forceinline__ void MergeLaneGroups(SoftmaxState<G>& st) {
#pragma unroll
  for (int o = kLanes; o < 32; o <<= 1) {
#pragma unroll
    for (int g = 0; g < G; ++g) {
      float acc2[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) acc2[j] = __shfl_xor_sync(0xffffffffu, st.acc[g][j], o);
      const float m2 = __shfl_xor_sync(0xffffffffu, st.m[g], o);
      const float l2 = __shfl_xor_sync(0xffffffffu, st.l[g], o);
      st.Merge(g, m2, l2, acc2);
    }
  }
}

// Lane `slice`'s 8 columns of a warp's merged state (and, from slice 0,
// m and l) into its view.
template <int G, int D>
__device__ __forceinline__ void StoreWarpState(const SoftmaxState<G>& st, int slice,
                                               const WarpStateView<G, D>& v) {
#pragma unroll
  for (int g = 0; g < G; ++g) {
#pragma unroll
    for (int j = 0; j < 8; ++j) v.o[g * D + slice * 8 + j] = st.acc[g][j];
    if (slice == 0) {
      v.m[g] = st.m[g];
      v.l[g] = st.l[g];
    }
  }
}

template <typename T, typename KvT, int D, int G>
__global__ void __launch_bounds__(kThreads)
    PagedAttentionKernel(const T* __restrict__ q, TokenMap tokens, int num_heads, PagedKv kv,
                         float scale, int partition_tokens, Workspace ws, T* __restrict__ out) {
  using Shape = RowShape<D>;
  constexpr int U = G <= 4 ? 4 : 2;  // loads of K and of V in flight per lane
  using Keys = WarpKeys<KvT, D, U>;
  // Per warp: the copy slots, then (reused) its merged state.
  constexpr int kWarpBytes = kStages * Keys::kStageBytes > WarpStateView<G, D>::kBytes
                                 ? kStages * Keys::kStageBytes
                                 : WarpStateView<G, D>::kBytes;
  __shared__ __align__(16) uint8_t smem[kWarps][kWarpBytes];
  AllowNextGrid();
  WaitPriorGrid();

  PagedBlockTask w;
  if (const PagedTask task = GetPagedBlockTask(tokens, num_heads, kv, partition_tokens, G, ws, &w);
      task != PagedTask::kWork) {
    if (task == PagedTask::kEmptySplit) ArriveAndMerge(w, num_heads, D, ws, out);
    return;
  }
  const int ng = w.ng;
  const int lane = threadIdx.x & 31;
  // This lane's 8 columns of each head's query, scaled for base-2 softmax.
  const int slice = lane % Shape::kLanes;
  const float qs = scale * kv.k_scale * kLog2e;
  float qr[G][8];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    if (g < ng && slice < Shape::kSlices) {
      const T* src = q + (static_cast<size_t>(w.t) * num_heads + w.head0 + g) * D + slice * 8;
      Load8(src, qr[g]);
#pragma unroll
      for (int j = 0; j < 8; ++j) qr[g][j] *= qs;
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) qr[g][j] = 0.0f;
    }
  }
  SoftmaxState<G> st;
  st.Init();
  Keys keys(kv, w.seq, w.kvh, w.start, w.end, smem[threadIdx.x >> 5]);
#pragma unroll
  for (int c = 0; c < kStages - 1; ++c) keys.Issue(c);
  for (int c = 0; keys.Exists(c); ++c) {
    keys.Issue(c + kStages - 1);
    CopyWait<kStages - 1>();
    AttendChunk<KvT, D, G, U>(keys, c, ng, qr, st);
  }
  CopyWait<0>();  // the slots are reused below
  MergeLaneGroups<Shape::kLanes>(st);
  __syncwarp();  // every lane is done with its slots
  if (lane < Shape::kSlices) StoreWarpState(st, lane, WarpStateView<G, D>(smem[threadIdx.x >> 5]));
  __syncthreads();
  MergeWarpsAndStore<T, G, D>(&smem[0][0], kWarpBytes, w, num_heads, kv.v_scale, ws, out);
  if (!w.direct) ArriveAndMerge(w, num_heads, D, ws, out);
}

// grid (ws.rows slots, H), one warp a block: merges the partitions of the
// split tokens (MergePartitionsInWarp); the
// attention kernel wrote the others' output.
template <typename T>
__global__ void PartitionMergeKernel(TokenMap tokens, int parts, int partition_tokens, int head_dim,
                                     Workspace ws, T* __restrict__ out) {
  AllowNextGrid();
  WaitPriorGrid();
  const int slot = blockIdx.x;
  const int t = tokens.order != nullptr ? tokens.order[slot] : slot;
  if (t >= tokens.num_tokens || tokens.pos[t] < partition_tokens) return;  // -1: skipped
  const size_t th = static_cast<size_t>(slot) * gridDim.y + blockIdx.y;
  const size_t oh = static_cast<size_t>(t) * gridDim.y + blockIdx.y;
  MergePartitionsInWarp(ws, th, parts, head_dim, out + oh * head_dim, threadIdx.x);
}

Workspace Carve(void* workspace, unsigned* arrivals, int rows, int H, int D, int parts) {
  Workspace w;
  w.arrivals = arrivals;
  w.o = static_cast<float*>(workspace);
  w.m = w.o + static_cast<size_t>(rows) * H * parts * D;
  w.l = w.m + static_cast<size_t>(rows) * H * parts;
  w.rows = parts > 1 ? rows : 0;
  return w;
}

// Query heads per block: the GQA group rounded up to a power of two, at
// most kMaxGroup (larger groups take several blocks).
int HeadsPerBlock(int group) {
  int g = 1;
  while (g < group && g < kMaxGroup) g *= 2;
  return g;
}

// The grid of both attention kernels (GetPagedBlockTask): false when it
// is too large.
bool PagedGrid(TokenMap tokens, int num_heads, const PagedKv& kv, const AttentionPlan& plan,
               dim3* grid) {
  const int group = num_heads / kv.num_kv_heads;
  const int g = HeadsPerBlock(group);
  const long blocks =
      static_cast<long>(tokens.num_tokens) * kv.num_kv_heads * ((group + g - 1) / g);
  if (blocks > 0x7fffffffL) return false;  // grid.x
  *grid = dim3(static_cast<unsigned>(blocks), 1, plan.num_partitions);
  return true;
}

// The CUDA-core kernel for a GQA group (HeadsPerBlock heads a block);
// null where none is built (head sizes the tensor-core kernel serves).
template <typename T>
using CoreKernel = void (*)(const T*, TokenMap, int, PagedKv, float, int, Workspace, T*);

template <typename T, typename KvT, int D>
CoreKernel<T> CoreKernelFor(int group) {
  if constexpr (PagedAttentionMmaServes(D)) {
    return nullptr;  // the tensor-core kernel's, FP8 too (not built here)
  } else {
    switch (HeadsPerBlock(group)) {
      case 1:
        return PagedAttentionKernel<T, KvT, D, 1>;
      case 2:
        return PagedAttentionKernel<T, KvT, D, 2>;
      case 4:
        return PagedAttentionKernel<T, KvT, D, 4>;
      case 8:
        return PagedAttentionKernel<T, KvT, D, 8>;
      default:
        return nullptr;
    }
  }
}

template <typename T, typename KvT, int D>
cudaError_t LaunchForGroup(const T* q, TokenMap tokens, int num_heads, const PagedKv& kv,
                           float scale, const AttentionPlan& plan, Workspace ws, T* out,
                           cudaStream_t stream) {
  const auto kernel = CoreKernelFor<T, KvT, D>(num_heads / kv.num_kv_heads);
  dim3 grid;
  if (kernel == nullptr || !PagedGrid(tokens, num_heads, kv, plan, &grid)) {
    return cudaErrorInvalidValue;
  }
  return LaunchKernel(kernel, grid, kThreads, 0, stream, q, tokens, num_heads, kv, scale,
                      plan.partition_tokens, ws, out);
}

template <typename T, typename KvT>
cudaError_t LaunchForHeadDim(const T* q, TokenMap tokens, int num_heads, const PagedKv& kv,
                             float scale, const AttentionPlan& plan, Workspace ws, T* out,
                             cudaStream_t stream) {
#define BALLAST_ATTN_CASE(DIM) \
  case DIM:                    \
    return LaunchForGroup<T, KvT, DIM>(q, tokens, num_heads, kv, scale, plan, ws, out, stream);
  switch (kv.head_dim) {
    BALLAST_ATTENTION_HEAD_DIMS(BALLAST_ATTN_CASE)
    default:
      return cudaErrorInvalidValue;
  }
#undef BALLAST_ATTN_CASE
}

// The CUDA-core kernel's resident blocks per SM (LaunchForGroup's kernel).
template <typename T, typename KvT, int D>
cudaError_t CoreBlocksPerSm(int group, int* blocks) {
  const auto kernel = CoreKernelFor<T, KvT, D>(group);
  if (kernel == nullptr) return cudaErrorInvalidValue;
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks, kernel, kThreads, 0);
}

template <typename T, typename KvT>
cudaError_t CoreBlocksPerSmForDim(int head_dim, int group, int* blocks) {
#define BALLAST_ATTN_OCC_CASE(DIM) \
  case DIM:                        \
    return CoreBlocksPerSm<T, KvT, DIM>(group, blocks);
  switch (head_dim) {
    BALLAST_ATTENTION_HEAD_DIMS(BALLAST_ATTN_OCC_CASE)
    default:
      return cudaErrorInvalidValue;
  }
#undef BALLAST_ATTN_OCC_CASE
}

// A stream plan's launch: one block per plan.streamed_ctas on the
// tensor-core kernel, the workspace carved as its pieces
// (paged_attention_stream.cuh), the merge in the launch.
cudaError_t LaunchStreamed(const void* q, TokenMap tokens, int num_heads, const PagedKv& kv,
                           float scale, const AttentionPlan& plan, void* workspace, void* out,
                           ActType type, cudaStream_t stream, unsigned* merge_counts) {
  if (!PagedAttentionMmaSupports(kv.head_dim, kv.dtype, type) || merge_counts == nullptr ||
      tokens.stream == nullptr || plan.workspace_rows < tokens.num_tokens) {
    return cudaErrorInvalidValue;
  }
  const size_t pieces = 2 * static_cast<size_t>(plan.streamed_ctas) * kMaxGroup;
  Workspace ws;
  ws.arrivals = merge_counts;
  ws.o = static_cast<float*>(workspace);
  ws.m = ws.o + pieces * kv.head_dim;
  ws.l = ws.m + pieces;
  ws.rows = tokens.num_tokens;
  const int G = HeadsPerBlock(num_heads / kv.num_kv_heads);
  return LaunchPagedAttentionMma(q, tokens, num_heads, kv, scale, 0, dim3(plan.streamed_ctas), G,
                                 ws, out, type, stream, /*streamed=*/true);
}

}  // namespace

cudaError_t PagedAttentionStreamBlocksPerSm(int head_dim, KvType kv, ActType type, int* blocks) {
  *blocks = 0;
  if (!PagedAttentionMmaSupports(head_dim, kv, type)) return cudaSuccess;
  int partitioned = 0, streamed = 0;
  cudaError_t e = PagedAttentionMmaBlocksPerSm(head_dim, kv, type, &partitioned);
  if (e == cudaSuccess) e = PagedAttentionMmaBlocksPerSm(head_dim, kv, type, &streamed, true);
  *blocks = std::min(partitioned, streamed);
  return e;
}

cudaError_t PagedAttentionBlocksPerSm(int num_heads, int num_kv_heads, int head_dim, KvType kv,
                                      ActType type, int* blocks) {
  if (num_kv_heads <= 0 || num_heads % num_kv_heads != 0) return cudaErrorInvalidValue;
  if (PagedAttentionMmaSupports(head_dim, kv, type)) {
    return PagedAttentionMmaBlocksPerSm(head_dim, kv, type, blocks);
  }
  BALLAST_DISPATCH_ACT(type, T, {
    const int group = num_heads / num_kv_heads;
    return kv == KvType::kFP8E4M3 ? CoreBlocksPerSmForDim<T, __nv_fp8_e4m3>(head_dim, group, blocks)
                                  : CoreBlocksPerSmForDim<T, T>(head_dim, group, blocks);
  });
  return cudaErrorInvalidValue;
}

bool PagedAttentionSupports(int head_dim) {
#define BALLAST_ATTN_SUPPORTS(DIM) \
  if (head_dim == DIM) return true;
  BALLAST_ATTENTION_HEAD_DIMS(BALLAST_ATTN_SUPPORTS)
#undef BALLAST_ATTN_SUPPORTS
  return false;
}

cudaError_t LaunchPagedAttention(const void* q, TokenMap tokens, int num_heads, PagedKv kv,
                                 float scale, const AttentionPlan& plan, void* workspace, void* out,
                                 ActType type, cudaStream_t stream, unsigned* merge_counts) {
  if (tokens.num_tokens == 0) return cudaSuccess;
  if (kv.num_kv_heads <= 0 || num_heads % kv.num_kv_heads != 0) return cudaErrorInvalidValue;
  if (plan.num_partitions > 1 &&
      (plan.workspace_rows <= 0 || plan.workspace_rows > tokens.num_tokens)) {
    return cudaErrorInvalidValue;  // a split plan's rows: 1..T
  }
  if (kv.dtype != KvType::kFP8E4M3 && (kv.dtype == KvType::kBF16) != (type == ActType::kBF16)) {
    return cudaErrorInvalidValue;  // KV is stored in the activation type or in FP8
  }
  if (plan.streamed_ctas > 0) {
    return LaunchStreamed(q, tokens, num_heads, kv, scale, plan, workspace, out, type, stream,
                          merge_counts);
  }
  const Workspace ws = Carve(workspace, merge_counts, plan.workspace_rows, num_heads, kv.head_dim,
                             plan.num_partitions);
  cudaError_t e = cudaErrorInvalidValue;
  if (PagedAttentionMmaSupports(kv.head_dim, kv.dtype, type)) {
    dim3 grid;
    if (!PagedGrid(tokens, num_heads, kv, plan, &grid)) return cudaErrorInvalidValue;
    e = LaunchPagedAttentionMma(q, tokens, num_heads, kv, scale, plan.partition_tokens, grid,
                                HeadsPerBlock(num_heads / kv.num_kv_heads), ws, out, type, stream);
  } else {
    BALLAST_DISPATCH_ACT(type, T, {
      const T* qt = static_cast<const T*>(q);
      T* o = static_cast<T*>(out);
      e = kv.dtype == KvType::kFP8E4M3
              ? LaunchForHeadDim<T, __nv_fp8_e4m3>(qt, tokens, num_heads, kv, scale, plan, ws, o,
                                                   stream)
              : LaunchForHeadDim<T, T>(qt, tokens, num_heads, kv, scale, plan, ws, o, stream);
    });
  }
  if (e != cudaSuccess || plan.num_partitions == 1 || ws.rows == 0 || merge_counts != nullptr) {
    return e;  // merged by the attention's last partitions (ArriveAndMerge)
  }
  BALLAST_DISPATCH_ACT(type, T, {
    return LaunchKernel(PartitionMergeKernel<T>, dim3(ws.rows, num_heads), 32, 0, stream, tokens,
                        plan.num_partitions, plan.partition_tokens, kv.head_dim, ws,
                        static_cast<T*>(out));
  });
  return cudaErrorInvalidValue;
}

}  // namespace ballast::engine::cuda
