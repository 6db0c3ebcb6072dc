// What the two paged (decode) attention kernels share: the grid's mapping
// of blocks to (token slot, query heads, partition), the split-KV
// workspace, cp.async helpers, and the end of a block, where its warps'
// online-softmax states are merged in a fixed order and written to the
// output or to the workspace. The kernels differ only in how a warp
// reduces its keys: on CUDA cores (attention_kernels.cu, head sizes the
// other does not serve) or on tensor cores (paged_attention_mma_kernels.cu,
// head sizes that are multiples of 16 up to 128; BF16, FP16 and FP8
// caches). Included by .cu files only; device functions act on the
// calling block alone.
#pragma once

#include "engine/cuda/common.cuh"

namespace ballast::engine::cuda {

constexpr int kPagedAttentionWarps = 4;  // warps per block, both kernels
constexpr float kPagedLog2e = 1.4426950408889634f;

// Partial results of the split tokens, by token slot (the position in
// TokenMap::order): slots [0, rows) only (AttentionPlan::workspace_rows).
struct PagedWorkspace {
  float* o;  // [rows][H][parts][D], unnormalised (times v_scale)
  float* m;  // [rows][H][parts], running max, base 2 (-inf: empty partition)
  float* l;  // [rows][H][parts], softmax denominator
  int rows;
  // [rows][H], zero between launches: how many of a split token's
  // partitions (blocks of its first query head's chunk) have written their
  // partials; the last to arrive merges them (ArriveAndMerge). Null: a
  // PartitionMergeKernel launch after the attention merges instead.
  unsigned* arrivals;
};

// What GetPagedBlockTask found for the block.
enum class PagedTask {
  kSkip,        // nothing to do
  kWork,        // attend its keys
  kEmptySplit,  // an empty partition of a split token: marked empty, to be counted
};

// What one block attends: query heads [head0, head0 + ng) of token t (one
// KV head, kvh) over keys [start, end) of its sequence.
struct PagedBlockTask {
  int slot, t, seq, kvh, head0, ng, start, end;
  bool direct;  // the output is written here (the context is not split)
};

// The block's task, from grid.x = (token slot, KV head chunk of G query
// heads), a token's chunks adjacent so that the slots' order (tokens.order)
// is the blocks' order, and grid.z = partition. kSkip when the block has
// nothing to do: a padding token, a split token past the workspace's rows,
// or an empty partition of a token that is not split; an empty partition
// of a split token marks its workspace entries empty (m = -inf) and is
// kEmptySplit.
__device__ __forceinline__ PagedTask GetPagedBlockTask(const TokenMap& tokens, int num_heads,
                                                       const PagedKv& kv, int partition_tokens,
                                                       int G, const PagedWorkspace& ws,
                                                       PagedBlockTask* task) {
  const int group = num_heads / kv.num_kv_heads;
  const int chunks = (group + G - 1) / G;
  const int per_token = kv.num_kv_heads * chunks;
  PagedBlockTask& w = *task;
  w.slot = blockIdx.x / per_token;
  const int hc = blockIdx.x % per_token;
  w.t = tokens.order != nullptr ? tokens.order[w.slot] : w.slot;
  const int pos = tokens.pos[w.t];
  if (pos < 0) return PagedTask::kSkip;
  w.seq = tokens.seq[w.t];
  const int parts = gridDim.z, part = blockIdx.z;
  w.kvh = hc / chunks;
  const int g0 = (hc % chunks) * G;
  w.ng = min(G, group - g0);
  w.head0 = w.kvh * group + g0;
  w.start = part * partition_tokens;
  w.end = min(pos + 1, w.start + partition_tokens);
  // A context within one partition is not split: its block writes the
  // output. A split one's partials go to the workspace, by slot; the plan
  // puts every split token in the first ws.rows slots (nothing is written
  // past them, should a caller's order break that).
  w.direct = parts == 1 || pos < partition_tokens;
  if (!w.direct && w.slot >= ws.rows) return PagedTask::kSkip;
  if (w.start >= w.end) {  // only with parts > 1: an empty partition
    if (w.direct) return PagedTask::kSkip;
    const int tid = threadIdx.x;
    if (tid < w.ng) {
      const size_t i = (static_cast<size_t>(w.slot) * num_heads + w.head0 + tid) * parts + part;
      ws.m[i] = -INFINITY;
      ws.l[i] = 0.0f;
    }
    return PagedTask::kEmptySplit;
  }
  return PagedTask::kWork;
}

// One warp merges partials row th's `parts` partitions into out_row
// [head_dim] (at most 256): lanes load the partitions' maxima, weights and
// outputs side by side (head_dim / 32 columns a lane), and every sum runs
// in partition order, so the result is the same wherever it runs. Reads
// past L1: in ArriveAndMerge the partials were written by other blocks of
// the same launch (and a cached line may hold a neighbour row's stale
// values). An empty partition (m = -inf) adds nothing; its o was never
// written, so it is loaded and discarded, never multiplied.
template <typename T>
__device__ __forceinline__ void MergePartitionsInWarp(const PagedWorkspace& ws, size_t th,
                                                      int parts, int head_dim,
                                                      T* __restrict__ out_row, int lane) {
  constexpr int kMaxCols = 8;  // head_dim <= 256
  const float* m_row = ws.m + th * parts;
  const float* l_row = ws.l + th * parts;
  const float* o_rows = ws.o + th * parts * head_dim;
  float mx = -INFINITY;
  for (int p = lane; p < parts; p += 32) mx = fmaxf(mx, __ldcg(m_row + p));
  mx = WarpMax(mx);
  float denom = 0.0f, num[kMaxCols];
#pragma unroll
  for (int j = 0; j < kMaxCols; ++j) num[j] = 0.0f;
  for (int p0 = 0; p0 < parts; p0 += 32) {
    const int mine = p0 + lane;
    const float m = mine < parts ? __ldcg(m_row + mine) : -INFINITY;
    const float w = m == -INFINITY ? 0.0f : exp2f(m - mx);
    const float wl = w * (mine < parts ? __ldcg(l_row + mine) : 0.0f);
    const int n = min(32, parts - p0);
#pragma unroll 4
    for (int i = 0; i < n; ++i) {
      const bool empty = __shfl_sync(0xffffffffu, m, i) == -INFINITY;
      const float wi = __shfl_sync(0xffffffffu, w, i);
      denom += __shfl_sync(0xffffffffu, wl, i);
      const float* o = o_rows + static_cast<size_t>(p0 + i) * head_dim;
#pragma unroll
      for (int j = 0; j < kMaxCols; ++j) {
        const int d = lane + 32 * j;
        if (d < head_dim) {
          const float v = __ldcg(o + d);
          num[j] = empty ? num[j] : num[j] + wi * v;
        }
      }
    }
  }
#pragma unroll
  for (int j = 0; j < kMaxCols; ++j) {
    const int d = lane + 32 * j;
    if (d < head_dim) out_row[d] = FromF<T>(num[j] / denom);
  }
}

// A split unit's block, once its partials (or its empty marks) are
// written: counts itself among the unit's `expected` writers, and returns
// true (in every thread) in the last of them to arrive, which resets the
// count for the next launch (the threadfence-reduction pattern: each
// block's writes are made visible before it counts, the last reads after
// it counted). Whole block; false when ws.arrivals is null.
__device__ __forceinline__ bool ArriveLast(const PagedBlockTask& w, int num_heads,
                                           const PagedWorkspace& ws, unsigned expected) {
  if (ws.arrivals == nullptr) return false;
  __threadfence();
  __syncthreads();
  bool mine = false;  // thread 0: this block arrived last (no shared memory: the
                      // CUDA-core kernel's 48 KB are full)
  if (threadIdx.x == 0) {
    unsigned* count = ws.arrivals + static_cast<size_t>(w.slot) * num_heads + w.head0;
    mine = atomicAdd(count, 1u) + 1u == expected;
    if (mine) *count = 0u;  // every writer has counted: none reads it again
  }
  if (!__syncthreads_or(mine)) return false;
  __threadfence();
  return true;
}

// A split token's block, once its partials (or its empty marks) are
// written: the last of its head chunk's partitions to arrive (ArriveLast)
// merges the chunk's heads into out. Saves the PartitionMergeKernel launch
// (6 us of each layer of a batch-1 step on an H200, launch included); on
// an H100 the 8B step went 5.90 -> 5.86 ms at batch 1 and 6.10 -> 6.04 at
// batch 2. The merge must be parallel: a first form, a thread a column
// looping over the partitions through L2, cost 0.6 ms a step
// (docs/benchmarks.md, session 61). Whole block; no-op when ws.arrivals is
// null.
template <typename T>
__device__ __forceinline__ void ArriveAndMerge(const PagedBlockTask& w, int num_heads, int head_dim,
                                               const PagedWorkspace& ws, T* __restrict__ out) {
  if (!ArriveLast(w, num_heads, ws, gridDim.z)) return;
  const int warps = static_cast<int>(blockDim.x) / 32;
  for (int g = static_cast<int>(threadIdx.x) / 32; g < w.ng; g += warps) {  // a warp a head
    const size_t th = static_cast<size_t>(w.slot) * num_heads + w.head0 + g;
    MergePartitionsInWarp(ws, th, gridDim.z, head_dim,
                          out + (static_cast<size_t>(w.t) * num_heads + w.head0 + g) * head_dim,
                          static_cast<int>(threadIdx.x) % 32);
  }
}

// cp.async of kBytes (16 or 8) into shared memory; when !valid nothing is
// read and the destination is zero-filled. The 16-byte form (L1 bypassed)
// asks L2 to fetch the 256 bytes around the address: a warp's copy reads
// two whole 256-byte rows, and the hint made large-batch decode steps
// 0.5-1.3% faster on an H100 (docs/benchmarks.md, session 63).
template <int kBytes>
__device__ __forceinline__ void CopyAsync(void* smem, const void* gmem, bool valid) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int n = valid ? kBytes : 0;
  if constexpr (kBytes == 16) {
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem),
                 "r"(n)
                 : "memory");
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(dst), "l"(gmem),
                 "n"(kBytes), "r"(n)
                 : "memory");
  }
}
__device__ __forceinline__ void CopyCommit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void CopyWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Start of KV block `id` (as KvSlot finds it).
__device__ __forceinline__ const uint8_t* BlockBase(const PagedKv& kv, int id) {
  const unsigned u = static_cast<unsigned>(id), mask = (1u << kv.slab_shift) - 1u;
  return kv.base + static_cast<size_t>(u >> kv.slab_shift) * kv.slab_bytes +
         static_cast<size_t>(u & mask) * kv.block_bytes;
}

// The KV rows of one (sequence, kv head) that a warp stages chunk by chunk
// (chunk j's first key: first(j)). Block ids are fetched 32 chunks at a
// time, one per lane, and passed by shuffle, off the copies' critical
// path. Every call is made by the whole warp.
template <typename KvT>
class ChunkRows {
 public:
  __device__ ChunkRows(const PagedKv& kv, int seq, int kvh, int end, int head_dim)
      : kv_(kv), seq_(seq), kvh_(kvh), end_(end), head_dim_(head_dim) {}

  // The block id of chunk c's first key (0 past the end); called for
  // c = 0, 1, 2, ... in order.
  template <typename First>
  __device__ int BlockId(int c, First first) {
    if (c % 32 == 0) {
      const int f = first(c + static_cast<int>(threadIdx.x & 31));
      ids_ = f < end_
                 ? kv_.block_ids[static_cast<size_t>(seq_) * kv_.max_blocks + f / kv_.block_tokens]
                 : 0;
    }
    return __shfl_sync(0xffffffffu, ids_, c % 32);
  }
  // Block `id`'s start when it holds keys [f, f + n), else nullptr: the
  // keys straddle two blocks (block sizes not a multiple of the chunk) and
  // Row looks each one up. *pos0: the block's first position.
  __device__ const uint8_t* Page(int id, int f, int n, int* pos0) const {
    const int bt = kv_.block_tokens;
    *pos0 = f - f % bt;
    return f % bt + n <= bt ? BlockBase(kv_, id) : nullptr;
  }
  // Row of key `pos` (K, or V when value), from Page's result.
  __device__ const KvT* Row(const uint8_t* page, int pos0, int pos, bool value) const {
    if (page == nullptr) {
      return reinterpret_cast<const KvT*>(KvSlot(kv_, seq_, pos, kvh_, value, sizeof(KvT)));
    }
    const size_t row = static_cast<size_t>(kv_.num_kv_heads) * head_dim_ * sizeof(KvT);
    return reinterpret_cast<const KvT*>(page + (value ? kv_.block_tokens * row : 0) +
                                        static_cast<size_t>(pos - pos0) * row +
                                        static_cast<size_t>(kvh_) * head_dim_ * sizeof(KvT));
  }

 private:
  const PagedKv& kv_;
  const int seq_, kvh_, end_, head_dim_;
  int ids_ = 0;  // lane j: block id of chunk (c - c % 32 + j)'s first key
};

// A warp's merged state in its shared-memory region (after its copies):
// o [G][D], m [G], l [G]; m is the running max of the scores in base-2
// units (-inf: the warp saw no key), o is unnormalised.
template <int G, int D>
struct WarpStateView {
  static constexpr int kBytes = (G * D + 2 * G) * static_cast<int>(sizeof(float));
  float* o;
  float* m;
  float* l;
  __device__ explicit WarpStateView(uint8_t* p)
      : o(reinterpret_cast<float*>(p)), m(o + G * D), l(m + G) {}
};

// Element (head g, dim d) of the block's kPagedAttentionWarps warp states
// (warp k's at smem + k * warp_bytes), merged in a fixed order: the
// running max, the denominator and the unnormalised output.
template <int G, int D>
__device__ __forceinline__ void MergeWarpStates(const uint8_t* smem, int warp_bytes, int g, int d,
                                                float* m_out, float* l_out, float* o_out) {
  float m = -INFINITY;
#pragma unroll
  for (int k = 0; k < kPagedAttentionWarps; ++k)
    m = fmaxf(m, WarpStateView<G, D>(const_cast<uint8_t*>(smem) + k * warp_bytes).m[g]);
  float l = 0.0f, o = 0.0f;
#pragma unroll
  for (int k = 0; k < kPagedAttentionWarps; ++k) {  // a fixed order
    const WarpStateView<G, D> v(const_cast<uint8_t*>(smem) + k * warp_bytes);
    if (v.m[g] == -INFINITY) continue;
    const float a = exp2f(v.m[g] - m);
    l += v.l[g] * a;
    o += v.o[g * D + d] * a;
  }
  *m_out = m, *l_out = l, *o_out = o;
}

// The block's end, after __syncthreads(): merges the kPagedAttentionWarps
// warps' states (warp w's at smem + w * warp_bytes) in a fixed order and
// writes the output (direct) or the partition's partial result.
template <typename T, int G, int D>
__device__ __forceinline__ void MergeWarpsAndStore(uint8_t* smem, int warp_bytes,
                                                   const PagedBlockTask& w, int num_heads,
                                                   float v_scale, const PagedWorkspace& ws,
                                                   T* __restrict__ out) {
  const int parts = gridDim.z, part = blockIdx.z;
  for (int i = threadIdx.x; i < w.ng * D; i += blockDim.x) {
    const int g = i / D, d = i % D;
    float m, l, o;
    MergeWarpStates<G, D>(smem, warp_bytes, g, d, &m, &l, &o);
    o *= v_scale;
    if (w.direct) {
      out[(static_cast<size_t>(w.t) * num_heads + w.head0 + g) * D + d] = FromF<T>(o / l);
    } else {
      const size_t th = static_cast<size_t>(w.slot) * num_heads + w.head0 + g;
      ws.o[(th * parts + part) * D + d] = o;
      if (d == 0) {
        ws.m[th * parts + part] = m;
        ws.l[th * parts + part] = l;
      }
    }
  }
}

// Head sizes the tensor-core kernel is built for (KV in the activation
// type or in FP8); the CUDA-core kernel is not built for them.
constexpr bool PagedAttentionMmaServes(int head_dim) {
  return head_dim % 16 == 0 && head_dim <= 128;
}

// Tensor-core paged attention (paged_attention_mma_kernels.cu): whether it
// serves head size D with KV of the activation type or FP8, and its launch, on
// the same grid, plan and workspace as the CUDA-core kernel's (G query
// heads a block: 1, 2, 4 or 8). The launch merges the partitions itself
// when ws.arrivals is set; otherwise the caller launches the merge.
// streamed: the stream plan's kernel (grid.x: the plan's blocks;
// tokens.stream set; ws carved as its pieces, arrivals set).
bool PagedAttentionMmaSupports(int head_dim, KvType kv_type, ActType act_type);
cudaError_t LaunchPagedAttentionMma(const void* q, TokenMap tokens, int num_heads,
                                    const PagedKv& kv, float scale, int partition_tokens, dim3 grid,
                                    int heads_per_block, const PagedWorkspace& ws, void* out,
                                    ActType type, cudaStream_t stream, bool streamed = false);
// Blocks of the tensor-core kernel (streamed: the stream plan's, which
// holds more registers at some head sizes) for these types and head size
// that an SM of the current device keeps resident (the occupancy API).
cudaError_t PagedAttentionMmaBlocksPerSm(int head_dim, KvType kv_type, ActType act_type,
                                         int* blocks, bool streamed = false);

}  // namespace ballast::engine::cuda
