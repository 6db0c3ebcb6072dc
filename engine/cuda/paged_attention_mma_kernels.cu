// Paged split-KV attention on tensor cores, for caches in the activation
// type (BF16, FP16) and head sizes that are multiples of 16 up to 128: the
// decode path's kernel. Same grid, plan, workspace and merge as the CUDA-
// core kernel (paged_attention.cuh), which it replaces there; only how a
// warp reduces its keys differs. As FlashInfer's tensor-core decode does,
// a GQA group's query heads are the rows of the MMA (m16n8k16: rows 0-7
// hold up to 8 heads, rows 8-15 are zero), so each K and V element read
// from shared memory feeds every head of the group in one instruction:
// - each warp takes every kWarps-th chunk of 16 keys of the block's
//   partition and stages its K and V rows into its own shared memory with
//   cp.async, kStages chunks in flight, padded rows so ldmatrix is free of
//   bank conflicts;
// - S = Q K^T (2 n-tiles of 8 keys, D/16 k-steps, Q's A fragments held in
//   registers), the online softmax (base 2) of its own rows, and O += P V
//   (P split into two parts in the activation type, so its rounding error
//   is about FP32's) stay in registers;
// - the warps' states are merged in a fixed order, so a query's result
//   depends only on its keys and the partition length (deterministic mode).
// The CUDA-core kernel spreads each key's dot product over 16 lanes and
// reduces it by shuffles, for each head, and was bound by issue, not by
// HBM (docs/benchmarks.md); here a key costs a few instructions. On an
// H200 a batch-256 step at context 1,024 fell from 20.5 to 16.1 ms.
#include <algorithm>

#include "engine/cuda/common.cuh"
#include "engine/cuda/mma.cuh"
#include "engine/cuda/paged_attention.cuh"

namespace ballast::engine::cuda {
namespace {

constexpr int kWarps = kPagedAttentionWarps;
constexpr int kThreads = 32 * kWarps;
constexpr int kChunk = 16;                 // keys a warp stages at a time: one k-step of P V
constexpr int kStages = 2;                 // chunks staged per warp (one ahead of the math)
constexpr int kRows = kAttentionMaxGroup;  // query heads a block at most

// Per head size D: a staged row holds D elements and 8 of padding (an odd
// number of 16-byte units, so ldmatrix's 8 rows hit 8 bank groups).
template <int D>
struct Shape {
  static_assert(D % 16 == 0 && D <= 128, "head size");
  static constexpr int kLd = D + 8;
  static constexpr int kStageBytes = 2 * kChunk * kLd * 2;  // K rows, then V rows
  static constexpr int kSlotBytes = kStages * kStageBytes;
  // Per warp: its slots, then (reused) its merged state.
  static constexpr int kWarpBytes = std::max(kSlotBytes, WarpStateView<kRows, D>::kBytes);
  static constexpr int kBytes = kWarps * kWarpBytes;
};

// The chunks one warp reads: c = 0, 1, ... of 16 keys from
// start + (c * kWarps + warp) * 16, staged in slot c % kStages.
template <typename T, int D>
class WarpChunks {
 public:
  __device__ WarpChunks(const PagedKv& kv, const PagedBlockTask& w, uint8_t* smem)
      : kv_(kv), rows_(kv, w.seq, w.kvh, w.end, D), start_(w.start), end_(w.end), smem_(smem) {}

  __device__ int First(int c) const {
    return start_ + (c * kWarps + static_cast<int>(threadIdx.x >> 5)) * kChunk;
  }
  __device__ bool Exists(int c) const { return First(c) < end_; }
  __device__ int end() const { return end_; }
  __device__ const T* K(int c) const {
    return reinterpret_cast<const T*>(smem_ + (c % kStages) * Shape<D>::kStageBytes);
  }
  __device__ const T* V(int c) const { return K(c) + kChunk * Shape<D>::kLd; }

  // Starts the copies of chunk c (none past the end; keys past it are
  // zero-filled) and closes one commit group either way. Called by the
  // whole warp for c = 0, 1, 2, ... in order, after its slot was last read.
  __device__ void Issue(int c) {
    const int lane = threadIdx.x & 31;
    const int id = rows_.BlockId(c, [this](int j) { return First(j); });
    if (Exists(c)) {
      const int f = First(c);
      int page_pos0;
      const uint8_t* page = rows_.Page(id, f, kChunk, &page_pos0);
      T* ks = const_cast<T*>(K(c));
      T* vs = const_cast<T*>(V(c));
      constexpr int kPieces = D / 8;  // 16-byte pieces a row
#pragma unroll
      for (int i = lane; i < kChunk * kPieces; i += 32) {
        const int r = i / kPieces, col = (i % kPieces) * 8;
        const int pos = f + r;
        const bool valid = pos < end_;
        const T* k = valid ? rows_.Row(page, page_pos0, pos, false) + col
                           : reinterpret_cast<const T*>(kv_.base);
        const T* v = valid ? rows_.Row(page, page_pos0, pos, true) + col : k;
        CopyAsync<16>(ks + r * Shape<D>::kLd + col, k, valid);
        CopyAsync<16>(vs + r * Shape<D>::kLd + col, v, valid);
      }
    }
    CopyCommit();
  }

 private:
  const PagedKv& kv_;
  ChunkRows<T> rows_;
  const int start_, end_;
  uint8_t* const smem_;
};

// One warp's online-softmax state, in MMA fragment layout (g = lane / 4,
// t = lane % 4): the lane holds row g (query head g of the block) at
// columns 8 n + 2t, +1 of O; rows g + 8 (o[n][2], o[n][3]) stay zero.
template <int D>
struct WarpState {
  uint32_t q[D / 16][2];  // Q's A fragments a0, a2 (a1 = a3 = 0: rows g + 8)
  float o[D / 8][4];
  float m = -INFINITY;  // running max of row g's scores, base 2
  float l = 0.0f;       // this lane's part of row g's denominator
};

// Row g's online-softmax update for one chunk's masked scores s (columns
// 0, 1 of each n-tile; scale c2 in log2 units): max and denominator in
// st, O rescaled, and P as A fragments in two parts, p + pl, in T.
template <typename T, int D>
__device__ __forceinline__ void SoftmaxUpdate(const float (&s)[2][4], float c2, WarpState<D>& st,
                                              uint32_t (&p)[4], uint32_t (&pl)[4]) {
  float mx = fmaxf(fmaxf(s[0][0], s[0][1]), fmaxf(s[1][0], s[1][1]));
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
  const float mn = fmaxf(st.m, mx * c2);
  const float mc = mn == -INFINITY ? 0.0f : mn;
  const float alpha = Exp2(st.m - mc);
  st.m = mn;
  const float p00 = Exp2(fmaf(s[0][0], c2, -mc)), p01 = Exp2(fmaf(s[0][1], c2, -mc));
  const float p10 = Exp2(fmaf(s[1][0], c2, -mc)), p11 = Exp2(fmaf(s[1][1], c2, -mc));
  st.l = st.l * alpha + ((p00 + p01) + (p10 + p11));
  // P as a sum of two T parts, each multiplied by V: P's rounding error
  // falls from T's (2^-9 for BF16) to about its square, as close to the
  // CUDA-core kernel's FP32 P as makes no difference (an FP8 model's next
  // rounding step magnifies such errors); the extra MMAs cost nothing here.
  const uint32_t hi0 = Pack2<T>(p00, p01), hi1 = Pack2<T>(p10, p11);
  const float2 h0 = Unpack2<T>(hi0), h1 = Unpack2<T>(hi1);
  p[0] = hi0, p[1] = 0u, p[2] = hi1, p[3] = 0u;
  pl[0] = Pack2<T>(p00 - h0.x, p01 - h0.y), pl[1] = 0u;
  pl[2] = Pack2<T>(p10 - h1.x, p11 - h1.y), pl[3] = 0u;
#pragma unroll
  for (int n = 0; n < D / 8; ++n) {
    st.o[n][0] *= alpha;
    st.o[n][1] *= alpha;
  }
}

// Chunk c of the warp's keys (staged and visible to the warp): scores,
// mask past the end, softmax update with scale c2 (log2 units), P V.
template <typename T, int D>
__device__ __forceinline__ void AttendChunk(const WarpChunks<T, D>& keys, int c, float c2,
                                            WarpState<D>& st) {
  constexpr int kLd = Shape<D>::kLd;
  const int lane = threadIdx.x & 31;
  float s[2][4] = {};
  const T* ks = keys.K(c);
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    // Matrices (keys 0-7, d 0-7), (0-7, 8-15), (8-15, 0-7), (8-15, 8-15):
    // b0, b1 of n-tile 0 and of n-tile 1.
    uint32_t b[4];
    Ldsm4(SmemAddr(ks + ((lane & 7) + 8 * (lane >> 4)) * kLd + kk * 16 + 8 * ((lane >> 3) & 1)), b);
    const uint32_t a[4] = {st.q[kk][0], 0u, st.q[kk][1], 0u};
    Mma<T>(s[0], a, b[0], b[1]);
    Mma<T>(s[1], a, b[2], b[3]);
  }
  const int first = keys.First(c);
  if (first + kChunk > keys.end()) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        if (first + 8 * j + 2 * (lane & 3) + i >= keys.end()) s[j][i] = -INFINITY;
      }
    }
  }
  uint32_t p[4], pl[4];
  SoftmaxUpdate<T, D>(s, c2, st, p, pl);
  const T* vs = keys.V(c);
#pragma unroll
  for (int dp = 0; dp < D / 16; ++dp) {
    // Transposed: (keys 0-7, d 0-7), (8-15, 0-7), (0-7, 8-15), (8-15,
    // 8-15) give b0, b1 of d-tiles 2 dp and 2 dp + 1.
    uint32_t b[4];
    Ldsm4T(SmemAddr(vs + ((lane & 7) + 8 * ((lane >> 3) & 1)) * kLd + 16 * dp + 8 * (lane >> 4)),
           b);
    Mma<T>(st.o[2 * dp], p, b[0], b[1]);
    Mma<T>(st.o[2 * dp + 1], p, b[2], b[3]);
    Mma<T>(st.o[2 * dp], pl, b[0], b[1]);
    Mma<T>(st.o[2 * dp + 1], pl, b[2], b[3]);
  }
}

template <typename T, int D>
__global__ void __launch_bounds__(kThreads)
    PagedAttentionMmaKernel(const T* __restrict__ q, TokenMap tokens, int num_heads, PagedKv kv,
                            float scale, int partition_tokens, int heads_per_block,
                            PagedWorkspace ws, T* __restrict__ out) {
  static_assert(sizeof(T) == 2, "Shape's rows are of 2-byte elements");
  extern __shared__ __align__(128) uint8_t smem[];
  AllowNextGrid();
  WaitPriorGrid();
  PagedBlockTask w;
  if (!GetPagedBlockTask(tokens, num_heads, kv, partition_tokens, heads_per_block, ws, &w)) return;
  const int lane = threadIdx.x & 31, g = lane >> 2, t2 = 2 * (lane & 3);
  uint8_t* mine = smem + (threadIdx.x >> 5) * Shape<D>::kWarpBytes;
  WarpChunks<T, D> keys(kv, w, mine);
#pragma unroll
  for (int c = 0; c < kStages - 1; ++c) keys.Issue(c);
  WarpState<D> st;
  {
    const T* qrow = q + (static_cast<size_t>(w.t) * num_heads + w.head0 + g) * D;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      st.q[kk][0] = g < w.ng ? *reinterpret_cast<const uint32_t*>(qrow + 16 * kk + t2) : 0u;
      st.q[kk][1] = g < w.ng ? *reinterpret_cast<const uint32_t*>(qrow + 16 * kk + 8 + t2) : 0u;
    }
#pragma unroll
    for (int n = 0; n < D / 8; ++n) st.o[n][0] = st.o[n][1] = st.o[n][2] = st.o[n][3] = 0.0f;
  }
  const float c2 = scale * kv.k_scale * kPagedLog2e;
  for (int c = 0; keys.Exists(c); ++c) {
    keys.Issue(c + kStages - 1);
    CopyWait<kStages - 1>();
    __syncwarp();  // every lane's copies of chunk c are visible
    AttendChunk<T, D>(keys, c, c2, st);
    __syncwarp();  // chunk c's slot is read before Issue refills it
  }
  CopyWait<0>();  // the slots are reused below
  __syncwarp();
  st.l += __shfl_xor_sync(0xffffffffu, st.l, 1);
  st.l += __shfl_xor_sync(0xffffffffu, st.l, 2);
  const WarpStateView<kRows, D> view(mine);
  if (g < w.ng) {
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      view.o[g * D + 8 * n + t2] = st.o[n][0];
      view.o[g * D + 8 * n + t2 + 1] = st.o[n][1];
    }
    if (t2 == 0) {
      view.m[g] = st.m;
      view.l[g] = st.l;
    }
  }
  __syncthreads();
  MergeWarpsAndStore<T, kRows, D>(smem, Shape<D>::kWarpBytes, w, num_heads, kv.v_scale, ws, out);
}

template <typename T, int D>
cudaError_t Launch(const T* q, TokenMap tokens, int num_heads, const PagedKv& kv, float scale,
                   int partition_tokens, dim3 grid, int heads_per_block, const PagedWorkspace& ws,
                   T* out, cudaStream_t stream) {
  auto* kernel = &PagedAttentionMmaKernel<T, D>;
  const cudaError_t e =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Shape<D>::kBytes);
  if (e != cudaSuccess) return e;
  return LaunchKernel(kernel, grid, kThreads, Shape<D>::kBytes, stream, q, tokens, num_heads, kv,
                      scale, partition_tokens, heads_per_block, ws, out);
}

template <typename T>
cudaError_t LaunchForDim(const void* q, TokenMap tokens, int num_heads, const PagedKv& kv,
                         float scale, int partition_tokens, dim3 grid, int heads_per_block,
                         const PagedWorkspace& ws, void* out, cudaStream_t stream) {
  const T* qt = static_cast<const T*>(q);
  T* o = static_cast<T*>(out);
  switch (kv.head_dim) {
#define BALLAST_MMA_CASE(DIM)                                                         \
  case DIM:                                                                           \
    if constexpr (PagedAttentionMmaServes(DIM)) {                                     \
      return Launch<T, DIM>(qt, tokens, num_heads, kv, scale, partition_tokens, grid, \
                            heads_per_block, ws, o, stream);                          \
    } else {                                                                          \
      return cudaErrorInvalidValue;                                                   \
    }
    BALLAST_ATTENTION_HEAD_DIMS(BALLAST_MMA_CASE)
#undef BALLAST_MMA_CASE
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace

bool PagedAttentionMmaSupports(int head_dim, KvType kv_type, ActType act_type) {
  const bool same = (kv_type == KvType::kBF16 && act_type == ActType::kBF16) ||
                    (kv_type == KvType::kF16 && act_type == ActType::kF16);
  return same && PagedAttentionMmaServes(head_dim) && PagedAttentionSupports(head_dim);
}

cudaError_t LaunchPagedAttentionMma(const void* q, TokenMap tokens, int num_heads,
                                    const PagedKv& kv, float scale, int partition_tokens, dim3 grid,
                                    int heads_per_block, const PagedWorkspace& ws, void* out,
                                    ActType type, cudaStream_t stream) {
  if (!PagedAttentionMmaSupports(kv.head_dim, kv.dtype, type) || heads_per_block > kRows) {
    return cudaErrorInvalidValue;
  }
  BALLAST_DISPATCH_ACT(type, T, {
    return LaunchForDim<T>(q, tokens, num_heads, kv, scale, partition_tokens, grid, heads_per_block,
                           ws, out, stream);
  });
  return cudaErrorInvalidValue;
}

}  // namespace ballast::engine::cuda
