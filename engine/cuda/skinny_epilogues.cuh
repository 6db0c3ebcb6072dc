// Device helpers of the skinny GEMV kernel (gemv_kernels.cu): its K loop
// and warp sums, the folded RMSNorm's sums (kernels.h, SkinnyNormIn and
// SkinnyNormOut) and the qkv product's RoPE + KV write epilogue
// (SkinnyRope). Included by gemv_kernels.cu only; every function runs in
// one thread block of kWarps warps.
#pragma once

#include "engine/cuda/common.cuh"

namespace ballast::engine::cuda::skinny {

constexpr int kWarps = 8;
constexpr int kChunk = 32 * 8;  // K elements a warp covers per step (16 bytes a lane)
// Producer sums a kNormIn thread loads before its K loop (512 blocks, a
// 4,096-wide norm, at 256 threads); any more it reads after.
constexpr int kPreSums = 2;

template <int M, int C>
using WarpSums = float[kWarps][M][C];  // shared: each warp's sum per row and column

// acc[i][c] += x[i] · w[c] over the warp's interleaved 256-element chunks
// of K (chunks warp, warp + kWarps, ...), 16-byte loads, kUnroll chunks in
// flight: 4 for one or two rows (on an H200, 8B shapes, 9% faster than 2:
// docs/benchmarks.md, "The skinny GEMV's loads in flight"); more rows hold
// more registers per chunk.
template <typename T, int M, int C>
__device__ __forceinline__ void AccumulateK(const T* __restrict__ x, const T* const (&wr)[C], int k,
                                            float (&acc)[M][C]) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int i = 0; i < M; ++i)
#pragma unroll
    for (int c = 0; c < C; ++c) acc[i][c] = 0.0f;
  const int chunks = (k + kChunk - 1) / kChunk;
  constexpr int kUnroll = M <= 2 ? 4 : 2;
#pragma unroll kUnroll
  for (int ch = warp; ch < chunks; ch += kWarps) {
    const int k0 = ch * kChunk + lane * 8;
    if (k0 >= k) continue;
    float wf[C][8];
#pragma unroll
    for (int c = 0; c < C; ++c) Load8(wr[c] + k0, wf[c]);
#pragma unroll
    for (int i = 0; i < M; ++i) {
      float xf[8];
      Load8(x + static_cast<size_t>(i) * k + k0, xf);
#pragma unroll
      for (int c = 0; c < C; ++c)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[i][c] += xf[j] * wf[c][j];
    }
  }
}

// 16 consecutive elements of x (a chunk's share of a lane) as floats: two
// 16-byte loads of a 2-byte type, one of E4M3.
template <typename X>
__device__ __forceinline__ void Load16(const X* p, float out[16]) {
  Load8(p, out);
  Load8(p + 8, out + 8);
}
template <>
__device__ __forceinline__ void Load16<__nv_fp8_e4m3>(const __nv_fp8_e4m3* p, float out[16]) {
  Fp8x16ToFloat(*reinterpret_cast<const uint4*>(p), out);
}

// AccumulateK over E4M3 weights: interleaved 512-element chunks, one
// 16-byte weight load a column and 16 elements of x a row (rows past m
// read row m - 1) per lane and chunk, each column's 16 weights converted
// to float as its FMAs need them (16 floats a column at once would cost
// the second resident block). x in the activation type (W8A16, the folded
// decode products of up to four rows) or E4M3 (fp8_kernels.cu's W8A8
// kernel); the scales are the caller's (ScaleSums).
template <typename X, int M, int C>
__device__ __forceinline__ void AccumulateK(const X* __restrict__ x,
                                            const __nv_fp8_e4m3* const (&wr)[C], int m, int k,
                                            float (&acc)[M][C]) {
  constexpr int kChunk8 = 32 * 16;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int i = 0; i < M; ++i)
#pragma unroll
    for (int c = 0; c < C; ++c) acc[i][c] = 0.0f;
  const int chunks = (k + kChunk8 - 1) / kChunk8;
#pragma unroll 2
  for (int ch = warp; ch < chunks; ch += kWarps) {
    const int k0 = ch * kChunk8 + lane * 16;
    if (k0 >= k) continue;
    uint4 raw[C];
#pragma unroll
    for (int c = 0; c < C; ++c) raw[c] = *reinterpret_cast<const uint4*>(wr[c] + k0);
    float xf[M][16];
#pragma unroll
    for (int i = 0; i < M; ++i) Load16(x + static_cast<size_t>(min(i, m - 1)) * k + k0, xf[i]);
#pragma unroll
    for (int c = 0; c < C; ++c) {
      float wf[16];
      Fp8x16ToFloat(raw[c], wf);
#pragma unroll
      for (int i = 0; i < M; ++i)
#pragma unroll
        for (int j = 0; j < 16; ++j) acc[i][c] += xf[i][j] * wf[j];
    }
  }
}

// The E4M3 rows' scales on a thread's sums, before StoreWarpSums: each
// warp's share is scaled, then the shares are summed (for 2-byte weights
// nothing is done).
template <typename W, int M, int C>
__device__ __forceinline__ void ScaleSums(const float (&scale)[C], float (&acc)[M][C]) {
  if constexpr (sizeof(W) == 1) {
#pragma unroll
    for (int i = 0; i < M; ++i)
#pragma unroll
      for (int c = 0; c < C; ++c) acc[i][c] *= scale[c];
  }
}

// Each warp's sums (shuffles) into red[warp]; a barrier must follow.
template <int M, int C>
__device__ __forceinline__ void StoreWarpSums(const float (&acc)[M][C], WarpSums<M, C>& red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int i = 0; i < M; ++i) {
#pragma unroll
    for (int c = 0; c < C; ++c) {
      const float v = WarpSum(acc[i][c]);
      if (lane == 0) red[warp][i][c] = v;
    }
  }
}

// The block's sum for (row i, column c), warps in order.
template <int M, int C>
__device__ __forceinline__ float BlockSumOf(const WarpSums<M, C>& red, int i, int c) {
  float v = 0.0f;
#pragma unroll
  for (int wv = 0; wv < kWarps; ++wv) v += red[wv][i][c];
  return v;
}

// kNormIn: the producer's per-block sums of squares, summed in a fixed
// order (the same in every block and run). Load before the K loop (the
// latency then hides behind the weight stream: loaded after it, on an
// H100, two-row steps lost 3%), Reduce after it, then a barrier, then
// InvRms.
template <int M>
struct NormInSums {
  float pre[M][kPreSums];

  __device__ __forceinline__ void Load(const SkinnyNormIn& in, int m) {
#pragma unroll
    for (int i = 0; i < M; ++i) {
#pragma unroll
      for (int j = 0; j < kPreSums; ++j) {
        const int b = threadIdx.x + j * blockDim.x;
        pre[i][j] =
            i < m && b < in.blocks ? in.sumsq[static_cast<size_t>(i) * in.blocks + b] : 0.0f;
      }
    }
  }

  // Into row_ss[warp][i].
  __device__ __forceinline__ void Reduce(const SkinnyNormIn& in, int m,
                                         float (&row_ss)[kWarps][M]) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int i = 0; i < M; ++i) {
      float s = 0.0f;
#pragma unroll
      for (int j = 0; j < kPreSums; ++j) s += pre[i][j];
      if (i < m) {  // past kPreSums sums a thread (hidden > 4,096 at 256 threads)
        const float* part = in.sumsq + static_cast<size_t>(i) * in.blocks;
        for (int b = threadIdx.x + kPreSums * blockDim.x; b < in.blocks; b += blockDim.x) {
          s += part[b];
        }
      }
      s = WarpSum(s);
      if (lane == 0) row_ss[warp][i] = s;
    }
  }
};

// Row i's 1 / rms from Reduce's sums.
template <int M>
__device__ __forceinline__ float InvRms(const float (&row_ss)[kWarps][M], const SkinnyNormIn& in,
                                        int i) {
  float ss = 0.0f;
#pragma unroll
  for (int wv = 0; wv < kWarps; ++wv) ss += row_ss[wv][i];
  return rsqrtf(ss / static_cast<float>(in.hidden) + in.eps);
}

// kNormOut: thread t < M * C owns output (t / C, n0 + t % C); its residual,
// bias and gamma are loaded before the K loop, as NormInSums.
struct NormOutPre {
  float r = 0.0f, add = 0.0f, gamma = 0.0f;
};

template <typename T, int M, int C>
__device__ __forceinline__ NormOutPre LoadNormOutPre(const SkinnyNormOut& o, int m, int n, int n0) {
  NormOutPre p;
  const int i = threadIdx.x / C, c = threadIdx.x % C;
  if (threadIdx.x < M * C && i < m && n0 + c < n) {
    p.r = o.resid[static_cast<size_t>(i) * n + n0 + c];
    if (o.bias != nullptr) p.add = ToF(static_cast<const T*>(o.bias)[n0 + c]);
    p.gamma = ToF(static_cast<const T*>(o.gamma)[n0 + c]);
  }
  return p;
}

// r = resid + T(sum) (+ bias), LaunchAddRmsNorm's order and bits; resid
// = r, xg = T(gamma r), sumsq[row][block] = the block's sum of r^2.
// red[0][i][c] is reused for r^2: only its owning thread read
// red[.][i][c].
template <typename T, int M, int C>
__device__ __forceinline__ void NormOutEpilogue(const SkinnyNormOut& o, const NormOutPre& p,
                                                WarpSums<M, C>& red, int m, int n, int n0) {
  static_assert(M * C <= kWarps * 32, "one output a thread");
  if (threadIdx.x < M * C) {
    const int i = threadIdx.x / C, c = threadIdx.x % C;
    const float v = BlockSumOf<M, C>(red, i, c);
    float r = 0.0f;
    if (i < m && n0 + c < n) {
      const size_t at = static_cast<size_t>(i) * n + n0 + c;
      r = p.r + ToF(FromF<T>(v));
      if (o.bias != nullptr) r += p.add;
      o.resid[at] = r;
      static_cast<T*>(o.xg)[at] = FromF<T>(p.gamma * r);
    }
    red[0][i][c] = r * r;
  }
  __syncthreads();
  if (threadIdx.x < m && threadIdx.x < M) {
    float ss = 0.0f;
#pragma unroll
    for (int c = 0; c < C; ++c) ss += red[0][threadIdx.x][c];
    o.sumsq[static_cast<size_t>(threadIdx.x) * gridDim.x + blockIdx.x] = ss;
  }
}

// kEpi == kRopeKv (the qkv product of a decode step, kernels.h,
// LaunchSkinnyGemmRopeKv): a block's 8 rows are 4 RoPE pairs (d, d + D/2)
// of one q or k head, or 8 consecutive V columns; its epilogue does what
// LaunchRopeKvWrite does with the rounded product, with the same
// arithmetic, and y is not written.
struct RopeCols {
  bool rotated;  // a block of q/k pairs, else of V columns
  int head;      // rotated: q heads then k heads; else the V head
  int d0;        // rotated: the first pair's d (< D/2); else the first column in the head
};

__device__ __forceinline__ RopeCols RopeColsOf(const SkinnyRope& r, int block) {
  const int D = r.kv.head_dim, half = D / 2;
  const int rot_blocks = (r.num_heads + r.kv.num_kv_heads) * half / 4;
  if (block < rot_blocks) return {true, block * 4 / half, block * 4 % half};
  const int col = (block - rot_blocks) * 8;
  return {false, col / D, col % D};
}

// The qkv row of column c (< 8) of a block at `cols`.
__device__ __forceinline__ int RopeRow(const SkinnyRope& r, const RopeCols& cols, int c) {
  const int D = r.kv.head_dim;
  if (cols.rotated) return cols.head * D + cols.d0 + (c & 3) + (c >= 4 ? D / 2 : 0);
  return (r.num_heads + r.kv.num_kv_heads + cols.head) * D + cols.d0 + c;
}

// What a kRopeKv thread t < M * 8 (row i = t / 8, column c = t % 8) loads
// before the K loop: its token, bias, and for rotated pairs (c < 4) the
// angle's sine and cosine, as RopePrologue computes them.
struct RopePre {
  int pos = -1, seq = 0;
  float bias1 = 0.0f, bias2 = 0.0f, sin = 0.0f, cos = 0.0f;
};

template <typename T>
__device__ __forceinline__ RopePre LoadRopePre(const SkinnyRope& r, const RopeCols& cols, int i,
                                               int c, int m) {
  RopePre p;
  if (i >= m) return p;
  p.pos = r.tokens.pos[i];
  p.seq = r.tokens.seq[i];
  const T* bias = static_cast<const T*>(r.bias);
  if (bias != nullptr) p.bias1 = ToF(bias[RopeRow(r, cols, c)]);
  if (cols.rotated && c < 4) {
    if (bias != nullptr) p.bias2 = ToF(bias[RopeRow(r, cols, c + 4)]);
    sincosf(static_cast<float>(p.pos) * r.inv_freq[cols.d0 + c], &p.sin, &p.cos);
  }
  return p;
}

// The epilogue of thread (i, c): v1 its column's sum, v2 its pair's (c < 4).
template <typename T, typename KvT>
__device__ __forceinline__ void RopeStore(const SkinnyRope& r, const RopeCols& cols,
                                          const RopePre& p, int i, int c, float v1, float v2) {
  if (p.pos < 0) return;  // a padding token: LaunchRopeKvWrite skips it too
  const int D = r.kv.head_dim, half = D / 2;
  const float x1 = ToF(FromF<T>(v1)) + p.bias1;
  if (!cols.rotated) {
    KvT* v = reinterpret_cast<KvT*>(KvSlot(r.kv, p.seq, p.pos, cols.head, true, sizeof(KvT)));
    v[cols.d0 + c] = FromF<KvT>(x1 * (1.0f / r.kv.v_scale));
    return;
  }
  if (c >= 4) return;  // the pair's first column stores both
  const float x2 = ToF(FromF<T>(v2)) + p.bias2;
  const float o1 = x1 * p.cos - x2 * p.sin, o2 = x2 * p.cos + x1 * p.sin;
  const int d = cols.d0 + c;
  if (cols.head < r.num_heads) {
    T* q = static_cast<T*>(r.q_out) + (static_cast<size_t>(i) * r.num_heads + cols.head) * D;
    q[d] = FromF<T>(o1);
    q[d + half] = FromF<T>(o2);
  } else {
    KvT* kp = reinterpret_cast<KvT*>(
        KvSlot(r.kv, p.seq, p.pos, cols.head - r.num_heads, false, sizeof(KvT)));
    const float inv = 1.0f / r.kv.k_scale;
    kp[d] = FromF<KvT>(o1 * inv);
    kp[d + half] = FromF<KvT>(o2 * inv);
  }
}

// kRopeKv: thread (i, c) < M * 8 stores its column (and c < 4 its pair's).
template <typename T, typename KvT, int M, int C>
__device__ __forceinline__ void RopeEpilogue(const SkinnyRope& rope, const RopeCols& cols,
                                             const RopePre& pre, const WarpSums<M, C>& red,
                                             const float (&inv)[M]) {
  static_assert(C == 8, "4 pairs or 8 V columns a block");
  if (threadIdx.x >= M * C) return;
  const int i = threadIdx.x / C, c = threadIdx.x % C;
  const float v1 = BlockSumOf<M, C>(red, i, c), v2 = BlockSumOf<M, C>(red, i, (c + 4) % C);
  RopeStore<T, KvT>(rope, cols, pre, i, c, v1 * inv[i], v2 * inv[i]);
}

}  // namespace ballast::engine::cuda::skinny
