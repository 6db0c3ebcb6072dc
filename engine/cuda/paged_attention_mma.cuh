// The tensor-core decode attention's warp-level pieces, shared by its two
// kernels (paged_attention_mma_kernels.cu: the partitioned one and the
// stream plan's). Included by that file only.
//
// Paged split-KV attention on tensor cores, for caches in the activation
// type (BF16, FP16) or in FP8 (E4M3), and head sizes that are multiples of
// 16 up to 128: the decode path's kernel. Same grid, plan, workspace and merge as the CUDA-
// core kernel (paged_attention.cuh), which it replaces there; only how a
// warp reduces its keys differs. Each K and V element read from shared
// memory feeds every query head of a GQA group in one instruction, as in
// FlashInfer's tensor-core decode, but transposed: the MMA (m16n8k16) takes
// 16 keys as its rows and the group's heads (up to 8) as its columns, so a
// decode step (one query row a head) has no zero rows, only the columns
// past its group (4 of 8 for Llama-3-8B's group of 4); heads as rows left
// 8 of 16 rows zero: twice the MMAs and accumulators:
// - each warp takes every kWarps-th chunk of 16 keys of the block's
//   partition and stages its K and V rows into its own shared memory with
//   cp.async, kStages chunks in flight, padded rows so ldmatrix is free of
//   bank conflicts;
// - S^T = K Q^T (D/16 k-steps, Q^T's B fragments held in registers), the
//   online softmax (base 2) of its heads' columns, and O^T += V^T P^T (P
//   split into two parts in the MMA's type, so its rounding error is about
//   FP32's; movmatrix turns S^T's accumulators into P^T's B fragments)
//   stay in registers;
// - the warps' states are merged in a fixed order, so a query's result
//   depends only on its keys and the partition length (deterministic mode).
// The CUDA-core kernel spreads each key's dot product over 16 lanes and
// reduces it by shuffles, for each head, and was bound by issue, not by
// HBM (docs/benchmarks.md); here a key costs a few instructions. On an
// H200 a batch-256 step at context 1,024 fell from 20.5 to 16.1 ms with
// heads as rows (session 38), and to 16.0 with keys as rows.
//
// FP8 (E4M3) caches take the same path in FP16 MMAs: every E4M3 value is
// an FP16 value, so K and V lose nothing, and the query (BF16 or FP16) is
// converted to FP16 once (exact for |q| in [2^-14, 65504]; smaller values
// lose mantissa bits, larger ones saturate: activations are far inside).
// Rows are staged as bytes, half the shared memory, and read with ldmatrix
// as pairs of bytes (b16):
// - K: the lane's word of a (keys, 16 dims) matrix holds dims 4t .. 4t + 3
//   of its key; the MMA's k columns 2t, 2t + 1 (low pair) and 2t + 8,
//   2t + 9 (high pair) are taken to be these dims, and Q^T's fragments
//   are loaded with the same permutation, so S^T is unchanged;
// - V: a transposed load gives keys 2t and 2t + 1 of dims 2g and 2g + 1;
//   one byte permute makes the (dim 2g; keys 2t, 2t + 1) and (dim 2g + 1;
//   keys 2t, 2t + 1) pairs, so the MMA's rows g and g + 8 are dims 2g and
//   2g + 1 of the 16 (the output is written with that order);
// - the scales are applied where the CUDA-core kernel applies them: k_scale
//   in the softmax's scale, v_scale at the merge.
#pragma once

#include <algorithm>

#include "engine/cuda/common.cuh"
#include "engine/cuda/mma.cuh"
#include "engine/cuda/paged_attention.cuh"

namespace ballast::engine::cuda::paged_mma {

constexpr int kWarps = kPagedAttentionWarps;
constexpr int kThreads = 32 * kWarps;
constexpr int kChunk = 16;                 // keys a warp stages at a time: one k-step of P V
constexpr int kStages = 2;                 // chunks staged per warp (one ahead of the math)
constexpr int kRows = kAttentionMaxGroup;  // query heads a block at most

// Per KV element type and head size D: a staged row holds D elements and
// is padded to an odd number of 16-byte units, so ldmatrix's 8 rows hit 8
// bank groups.
template <typename KvT, int D>
struct Shape {
  static_assert(D % 16 == 0 && D <= 128, "head size");
  static constexpr int kRowBytes = D * static_cast<int>(sizeof(KvT));
  static constexpr int kLdBytes = kRowBytes + ((kRowBytes / 16) % 2 == 0 ? 16 : 0);
  static constexpr int kStageBytes = 2 * kChunk * kLdBytes;  // K rows, then V rows
  static constexpr int kSlotBytes = kStages * kStageBytes;
  // Per warp: its slots, then (reused) its merged state.
  static constexpr int kWarpBytes = std::max(kSlotBytes, WarpStateView<kRows, D>::kBytes);
  static constexpr int kBytes = kWarps * kWarpBytes;
};

// The chunks one warp reads: c = 0, 1, ... of 16 keys from
// start + (c * kWarps + warp) * 16, staged in slot c % kStages as bytes
// (rows kLdBytes apart).
template <typename KvT, int D>
class WarpChunks {
  using S = Shape<KvT, D>;

 public:
  __device__ WarpChunks(const PagedKv& kv, const PagedBlockTask& w, uint8_t* smem)
      : kv_(kv), rows_(kv, w.seq, w.kvh, w.end, D), start_(w.start), end_(w.end), smem_(smem) {}

  __device__ int First(int c) const {
    return start_ + (c * kWarps + static_cast<int>(threadIdx.x >> 5)) * kChunk;
  }
  __device__ bool Exists(int c) const { return First(c) < end_; }
  __device__ int end() const { return end_; }
  __device__ const uint8_t* K(int c) const { return smem_ + (c % kStages) * S::kStageBytes; }
  __device__ const uint8_t* V(int c) const { return K(c) + kChunk * S::kLdBytes; }

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
      uint8_t* ks = const_cast<uint8_t*>(K(c));
      uint8_t* vs = const_cast<uint8_t*>(V(c));
      constexpr int kPieces = S::kRowBytes / 16;  // 16-byte pieces a row
#pragma unroll
      for (int i = lane; i < kChunk * kPieces; i += 32) {
        const int r = i / kPieces, col = (i % kPieces) * 16;
        const int pos = f + r;
        const bool valid = pos < end_;
        const uint8_t* k =
            valid ? reinterpret_cast<const uint8_t*>(rows_.Row(page, page_pos0, pos, false)) + col
                  : kv_.base;
        const uint8_t* v =
            valid ? reinterpret_cast<const uint8_t*>(rows_.Row(page, page_pos0, pos, true)) + col
                  : k;
        CopyAsync<16>(ks + r * S::kLdBytes + col, k, valid);
        CopyAsync<16>(vs + r * S::kLdBytes + col, v, valid);
      }
    }
    CopyCommit();
  }

 private:
  const PagedKv& kv_;
  ChunkRows<KvT> rows_;
  const int start_, end_;
  uint8_t* const smem_;
};

// One warp's online-softmax state, transposed: keys are the MMA's rows
// and the group's query heads its 8 columns (past the group: zero). In
// fragment layout (g = lane / 4, t = lane % 4) the lane holds heads 2t and
// 2t + 1 (j = 0, 1): O^T at dims 16 i + g and 16 i + g + 8, and the
// running max and its keys' part of the denominator of each.
template <int D>
struct WarpState {
  uint32_t q[D / 16][2];  // Q^T's B fragments: head g, dims 16 kk + 2t, +1 and + 8
  float o[D / 16][4];     // (16 i + g, 2t), (16 i + g, 2t + 1), (16 i + g + 8, 2t), ...
  float m[2] = {-INFINITY, -INFINITY};  // running max of head 2t + j's scores, base 2
  float l[2] = {0.0f, 0.0f};            // this lane's part of head 2t + j's denominator
};

// The online-softmax update for one chunk's masked scores S^T (s: keys g
// and g + 8 of heads 2t, 2t + 1; scale c2 in log2 units): max and
// denominator in st, O rescaled, and P^T as B fragments (keys 2t, +1 and
// + 8 of head g) in two parts, p + pl, in T.
template <typename T, int D>
__device__ __forceinline__ void SoftmaxUpdate(const float (&s)[4], float c2, WarpState<D>& st,
                                              uint32_t (&p)[2], uint32_t (&pl)[2]) {
  float e[4], alpha[2];
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    float mx = fmaxf(s[j], s[2 + j]);
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
    const float mn = fmaxf(st.m[j], mx * c2);
    const float mc = mn == -INFINITY ? 0.0f : mn;
    alpha[j] = Exp2(st.m[j] - mc);
    st.m[j] = mn;
    e[j] = Exp2(fmaf(s[j], c2, -mc));
    e[2 + j] = Exp2(fmaf(s[2 + j], c2, -mc));
    st.l[j] = st.l[j] * alpha[j] + (e[j] + e[2 + j]);
  }
  // P as a sum of two T parts, each multiplied by V: P's rounding error
  // falls from T's (2^-9 for BF16) to about its square, as close to the
  // CUDA-core kernel's FP32 P as makes no difference (an FP8 model's next
  // rounding step magnifies such errors); the extra MMAs cost little here.
  // Packed, a part is S^T's accumulator layout; movmatrix transposes each
  // 8x8 half into the B layout.
  const uint32_t hi0 = Pack2<T>(e[0], e[1]), hi1 = Pack2<T>(e[2], e[3]);
  const float2 h0 = Unpack2<T>(hi0), h1 = Unpack2<T>(hi1);
  p[0] = Movt(hi0), p[1] = Movt(hi1);
  pl[0] = Movt(Pack2<T>(e[0] - h0.x, e[1] - h0.y));
  pl[1] = Movt(Pack2<T>(e[2] - h1.x, e[3] - h1.y));
#pragma unroll
  for (int i = 0; i < D / 16; ++i) {
    st.o[i][0] *= alpha[0], st.o[i][1] *= alpha[1];
    st.o[i][2] *= alpha[0], st.o[i][3] *= alpha[1];
  }
}

// SoftmaxUpdate of the scores of the chunk starting at key `first`, the
// keys at or past `end` masked out.
template <typename T, int D>
__device__ __forceinline__ void MaskAndSoftmax(int first, int end, float (&s)[4], float c2,
                                               WarpState<D>& st, uint32_t (&p)[2],
                                               uint32_t (&pl)[2]) {
  const int g = (threadIdx.x & 31) >> 2;
  if (first + kChunk > end) {
    if (first + g >= end) s[0] = s[1] = -INFINITY;
    if (first + g + 8 >= end) s[2] = s[3] = -INFINITY;
  }
  SoftmaxUpdate<T, D>(s, c2, st, p, pl);
}

// Chunk c of the warp's keys (staged and visible to the warp), KV in the
// activation type T: scores S^T = K Q^T, mask past the end, softmax update
// with scale c2 (log2 units), O^T += V^T P^T.
template <typename T, int D>
__device__ __forceinline__ void AttendChunk(const WarpChunks<T, D>& keys, int c, float c2,
                                            WarpState<D>& st) {
  constexpr int kLd = Shape<T, D>::kLdBytes / 2;  // elements
  const int lane = threadIdx.x & 31;
  float s[4] = {};
  const T* ks = reinterpret_cast<const T*>(keys.K(c));
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    // K's A fragment: matrices (keys 0-7, d 0-7), (8-15, 0-7), (0-7,
    // 8-15), (8-15, 8-15) of this k-step.
    uint32_t a[4];
    Ldsm4(SmemAddr(ks + ((lane & 7) + 8 * ((lane >> 3) & 1)) * kLd + kk * 16 + 8 * (lane >> 4)), a);
    Mma<T>(s, a, st.q[kk][0], st.q[kk][1]);
  }
  uint32_t p[2], pl[2];
  MaskAndSoftmax<T, D>(keys.First(c), keys.end(), s, c2, st, p, pl);
  const T* vs = reinterpret_cast<const T*>(keys.V(c));
#pragma unroll
  for (int i = 0; i < D / 16; ++i) {
    // V^T's A fragment, transposed loads of (keys 0-7, d 0-7), (0-7,
    // 8-15), (8-15, 0-7), (8-15, 8-15) of dims 16 i ...
    uint32_t a[4];
    Ldsm4T(SmemAddr(vs + ((lane & 7) + 8 * (lane >> 4)) * kLd + 16 * i + 8 * ((lane >> 3) & 1)), a);
    Mma<T>(st.o[i], a, p[0], p[1]);
    Mma<T>(st.o[i], a, pl[0], pl[1]);
  }
}

// S^T += K Q^T for one k-step of FP8 keys: k0 and k8 are the lane's words
// of the (keys 0-7) and (keys 8-15) matrices of 16 dims, bytes as b16
// pairs (dims 4t .. 4t + 3 of keys g and g + 8).
__device__ __forceinline__ void MmaFp8Keys(float (&s)[4], uint32_t k0, uint32_t k8,
                                           const uint32_t (&q)[2]) {
  const uint32_t a[4] = {Fp8x2ToHalf2(k0), Fp8x2ToHalf2(k8), Fp8x2ToHalf2(k0 >> 16),
                         Fp8x2ToHalf2(k8 >> 16)};
  Mma<__half>(s, a, q[0], q[1]);
}

// O^T += V^T P^T for 16 dims of FP8 values: v0 and v8 are the lane's words
// of the transposed (keys 0-7) and (keys 8-15) matrices (keys 2t, 2t + 1
// of dims 2g, 2g + 1); rows g and g + 8 of the MMA are dims 2g and 2g + 1.
__device__ __forceinline__ void MmaFp8Values(float (&o)[4], uint32_t v0, uint32_t v8,
                                             const uint32_t (&p)[2], const uint32_t (&pl)[2]) {
  const uint32_t x = __byte_perm(v0, 0, 0x3120), y = __byte_perm(v8, 0, 0x3120);
  const uint32_t a[4] = {Fp8x2ToHalf2(x), Fp8x2ToHalf2(x >> 16), Fp8x2ToHalf2(y),
                         Fp8x2ToHalf2(y >> 16)};
  Mma<__half>(o, a, p[0], p[1]);
  Mma<__half>(o, a, pl[0], pl[1]);
}

// AttendChunk for FP8 (E4M3) keys and values, in FP16 MMAs (the file's
// comment has the layouts). Two 16-dim slabs per ldmatrix.x4, the last of
// an odd number with .x2.
template <int D>
__device__ __forceinline__ void AttendChunkFp8(const WarpChunks<__nv_fp8_e4m3, D>& keys, int c,
                                               float c2, WarpState<D>& st) {
  constexpr int kLd = Shape<__nv_fp8_e4m3, D>::kLdBytes, kSlabs = D / 16;
  const int lane = threadIdx.x & 31;
  // Row of lane's address: matrices (keys 0-7), (8-15), (0-7), (8-15) of
  // slabs j, j, j + 1, j + 1.
  const int row = ((lane & 7) + 8 * ((lane >> 3) & 1)) * kLd + 16 * (lane >> 4);
  float s[4] = {};
  const uint8_t* ks = keys.K(c);
#pragma unroll
  for (int kk = 0; kk + 1 < kSlabs; kk += 2) {
    uint32_t r[4];
    Ldsm4(SmemAddr(ks + row + 16 * kk), r);
    MmaFp8Keys(s, r[0], r[1], st.q[kk]);
    MmaFp8Keys(s, r[2], r[3], st.q[kk + 1]);
  }
  if constexpr (kSlabs % 2 == 1) {
    uint32_t r[2];
    Ldsm2(SmemAddr(ks + row + 16 * (kSlabs - 1)), r);
    MmaFp8Keys(s, r[0], r[1], st.q[kSlabs - 1]);
  }
  uint32_t p[2], pl[2];
  MaskAndSoftmax<__half, D>(keys.First(c), keys.end(), s, c2, st, p, pl);
  const uint8_t* vs = keys.V(c);
#pragma unroll
  for (int i = 0; i + 1 < kSlabs; i += 2) {
    uint32_t r[4];
    Ldsm4T(SmemAddr(vs + row + 16 * i), r);
    MmaFp8Values(st.o[i], r[0], r[1], p, pl);
    MmaFp8Values(st.o[i + 1], r[2], r[3], p, pl);
  }
  if constexpr (kSlabs % 2 == 1) {
    uint32_t r[2];
    Ldsm2T(SmemAddr(vs + row + 16 * (kSlabs - 1)), r);
    MmaFp8Values(st.o[kSlabs - 1], r[0], r[1], p, pl);
  }
}

// x clamped to FP16's finite range: a query element past it (none in
// practice) saturates rather than turning the head's scores into inf/NaN.
__device__ __forceinline__ float Fp16Range(float x) { return fminf(fmaxf(x, -65504.0f), 65504.0f); }

// Q^T's B fragments for head g of the block (zero past the group): in the
// activation type (dims 16 kk + 2t, +1 and + 8), or for FP8 caches in
// FP16 with AttendChunkFp8's permutation (dims 16 kk + 4t, +1 and +2, +3).
template <typename T, typename KvT, int D>
__device__ __forceinline__ void LoadQuery(const T* qrow, bool valid, WarpState<D>& st) {
  const int t = threadIdx.x & 3;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    if constexpr (std::is_same_v<KvT, __nv_fp8_e4m3>) {
      const uint2 u =
          valid ? *reinterpret_cast<const uint2*>(qrow + 16 * kk + 4 * t) : make_uint2(0u, 0u);
      if constexpr (std::is_same_v<T, __half>) {
        st.q[kk][0] = u.x, st.q[kk][1] = u.y;
      } else {
        const float2 lo = Unpack2<T>(u.x), hi = Unpack2<T>(u.y);
        st.q[kk][0] = Pack2<__half>(Fp16Range(lo.x), Fp16Range(lo.y));
        st.q[kk][1] = Pack2<__half>(Fp16Range(hi.x), Fp16Range(hi.y));
      }
    } else {
      st.q[kk][0] = valid ? *reinterpret_cast<const uint32_t*>(qrow + 16 * kk + 2 * t) : 0u;
      st.q[kk][1] = valid ? *reinterpret_cast<const uint32_t*>(qrow + 16 * kk + 8 + 2 * t) : 0u;
    }
  }
#pragma unroll
  for (int i = 0; i < D / 16; ++i) st.o[i][0] = st.o[i][1] = st.o[i][2] = st.o[i][3] = 0.0f;
}

// The warp's state into its shared memory (WarpStateView) for the merge:
// the MMA's rows g and g + 8 of slab i are dims 16 i + g and + 8, or for
// FP8 caches 16 i + 2g and + 1.
template <typename KvT, int D>
__device__ __forceinline__ void StoreWarpState(const WarpState<D>& st, int ng, uint8_t* mine) {
  constexpr bool kFp8 = std::is_same_v<KvT, __nv_fp8_e4m3>;
  const int lane = threadIdx.x & 31, g = lane >> 2, t2 = 2 * (lane & 3);
  const int r0 = kFp8 ? 2 * g : g, r8 = kFp8 ? 2 * g + 1 : g + 8;
  const WarpStateView<kRows, D> view(mine);
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    float l = st.l[j];
    l += __shfl_xor_sync(0xffffffffu, l, 4);
    l += __shfl_xor_sync(0xffffffffu, l, 8);
    l += __shfl_xor_sync(0xffffffffu, l, 16);
    const int h = t2 + j;
    if (h < ng) {
#pragma unroll
      for (int i = 0; i < D / 16; ++i) {
        view.o[h * D + 16 * i + r0] = st.o[i][j];
        view.o[h * D + 16 * i + r8] = st.o[i][2 + j];
      }
      if (g == 0) {
        view.m[h] = st.m[j];
        view.l[h] = l;
      }
    }
  }
}

// One block's attention of task w's keys (one partition, or one segment of
// a stream plan): each warp stages and reduces its chunks, then stores its
// state in its shared memory for the block's merge (after a
// __syncthreads(), which this ends with). c2: the scale in log2 units.
template <typename T, typename KvT, int D>
__device__ __forceinline__ void AttendKeys(const T* __restrict__ q, int num_heads,
                                           const PagedKv& kv, float c2, const PagedBlockTask& w,
                                           uint8_t* smem) {
  using S = Shape<KvT, D>;
  const int g = (threadIdx.x & 31) >> 2;
  uint8_t* mine = smem + (threadIdx.x >> 5) * S::kWarpBytes;
  WarpChunks<KvT, D> keys(kv, w, mine);
#pragma unroll
  for (int c = 0; c < kStages - 1; ++c) keys.Issue(c);
  WarpState<D> st;
  LoadQuery<T, KvT, D>(q + (static_cast<size_t>(w.t) * num_heads + w.head0 + g) * D, g < w.ng, st);
  for (int c = 0; keys.Exists(c); ++c) {
    keys.Issue(c + kStages - 1);
    CopyWait<kStages - 1>();
    __syncwarp();  // every lane's copies of chunk c are visible
    if constexpr (std::is_same_v<KvT, __nv_fp8_e4m3>) {
      AttendChunkFp8<D>(keys, c, c2, st);
    } else {
      AttendChunk<T, D>(keys, c, c2, st);
    }
    __syncwarp();  // chunk c's slot is read before Issue refills it
  }
  CopyWait<0>();  // the slots are reused below
  __syncwarp();
  StoreWarpState<KvT, D>(st, w.ng, mine);
  __syncthreads();
}

}  // namespace ballast::engine::cuda::paged_mma
