// Skinny GEMM for decode (M <= 8 rows): y[M][N] = x[M][K] w[N][K]^T with
// the weight streamed once at close to full memory bandwidth, FP32 partial
// sums. The x rows (a few KB) stay in L1/L2. Measured (H100, 8B shapes):
// with more rows x traffic from L1 outgrows the weight stream and cuBLASLt
// wins, so larger products go there.
#include "engine/cuda/common.cuh"

namespace ballast::engine::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kChunk = 32 * 8;  // K elements a warp covers per step (16 bytes a lane)

// A block owns C output columns; its 8 warps split K into interleaved
// 256-element chunks, so each column's weight row is read by the whole
// block with C independent 16-byte loads per chunk and lane, and (one or two
// rows) 4 chunks in flight. It waits for the kernel producing x before it
// loads anything: an L2 prefetch of the first chunk before the wait (which
// PDL allows for weights) cost 0.1 ms a batch-1 step on an H200, and an L2
// prefetch of the next product's first rows from this one's last blocks,
// meant to keep HBM busy through the kernels between products, cost
// 0.1-0.5 ms (8-32 MB a product; docs/benchmarks.md, session 61). Partial sums
// are reduced within each warp by shuffles, then across warps in shared
// memory.
//
// kEpi == kSiluPairs: w is an MLP's [gate; up] ([2n][k], gate rows first)
// and y [m][n] = silu(x w_gate^T) * (x w_up^T): a block owns C / 2 gate rows
// and the up rows of the same outputs, and its epilogue rounds both sums to
// T and applies SiluTimes as SiluMulKernel does, so the result is bit for
// bit that of the product followed by LaunchSiluMul, with one launch and no
// [m][2n] intermediate.
//
// kEpi == kNormOut (the o and down projections before a folded RMSNorm,
// kernels.h): each output, rounded to T as y would hold it, is added (with
// the bias) to the FP32 residual row; gamma * r goes to xg in T, and the
// block's sum of r^2 per row to sumsq[row][block]. y is not written.
// kNormIn (the qkv and gate/up products after one): after the K loop the
// block sums the producer's per-block sums in a fixed order (the same in
// every block and run) and scales each row's dot products by
// rsqrt(sum / hidden + eps) before rounding: x · w, x = T(gamma * r), is the
// norm's product up to where the rounding to T happens.
enum class Epi { kPlain, kSiluPairs, kNormOut, kRopeKv };
// Producer sums a kNormIn thread loads before its K loop (512 blocks, a
// 4,096-wide norm, at 256 threads); any more it reads after.
constexpr int kPreSums = 2;

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

template <typename T, typename OutT, int M, int C, Epi kEpi = Epi::kPlain, bool kNormIn = false,
          typename KvT = T>
__global__ void __launch_bounds__(kWarps * 32)
    SkinnyGemmKernel(const T* __restrict__ x, const T* __restrict__ w, OutT* __restrict__ y, int m,
                     int n, int k, SkinnyNormIn norm_in, SkinnyNormOut norm_out, SkinnyRope rope) {
  constexpr bool kSiluPairs = kEpi == Epi::kSiluPairs;
  static_assert(!kSiluPairs || C % 2 == 0, "pairs of gate and up rows");
  __shared__ float red[kWarps][M][C];
  __shared__ float row_ss[kWarps][M];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int n0 = blockIdx.x * (kSiluPairs ? C / 2 : C);
  RopeCols rope_cols{};
  if constexpr (kEpi == Epi::kRopeKv) rope_cols = RopeColsOf(rope, blockIdx.x);
  const T* wr[C];
#pragma unroll
  for (int c = 0; c < C; ++c) {
    int row = kSiluPairs ? (c < C / 2 ? min(n0 + c, n - 1) : n + min(n0 + c - C / 2, n - 1))
                         : min(n0 + c, n - 1);
    if constexpr (kEpi == Epi::kRopeKv) row = RopeRow(rope, rope_cols, c);
    wr[c] = w + static_cast<size_t>(row) * k;
  }
  AllowNextGrid();
  WaitPriorGrid();
  // The folded norm's operands are loaded now, so their latency hides
  // behind the weight stream rather than adding to the block's tail (on an
  // H100, loaded in the epilogue, two rows lost 3% a step).
  float pre_ss[M][kPreSums];                             // kNormIn: the producer's first sums
  float pre_r = 0.0f, pre_add = 0.0f, pre_gamma = 0.0f;  // kNormOut: this thread's output
  if constexpr (kNormIn) {
#pragma unroll
    for (int i = 0; i < M; ++i) {
#pragma unroll
      for (int j = 0; j < kPreSums; ++j) {
        const int b = threadIdx.x + j * blockDim.x;
        pre_ss[i][j] = i < m && b < norm_in.blocks
                           ? norm_in.sumsq[static_cast<size_t>(i) * norm_in.blocks + b]
                           : 0.0f;
      }
    }
  }
  RopePre rope_pre;
  if constexpr (kEpi == Epi::kRopeKv) {
    if (threadIdx.x < M * C) {
      rope_pre = LoadRopePre<T>(rope, rope_cols, threadIdx.x / C, threadIdx.x % C, m);
    }
  }
  if constexpr (kEpi == Epi::kNormOut) {
    const int i = threadIdx.x / C, c = threadIdx.x % C;
    if (threadIdx.x < M * C && i < m && n0 + c < n) {
      pre_r = norm_out.resid[static_cast<size_t>(i) * n + n0 + c];
      if (norm_out.bias != nullptr) pre_add = ToF(static_cast<const T*>(norm_out.bias)[n0 + c]);
      pre_gamma = ToF(static_cast<const T*>(norm_out.gamma)[n0 + c]);
    }
  }
  float acc[M][C];
#pragma unroll
  for (int i = 0; i < M; ++i)
#pragma unroll
    for (int c = 0; c < C; ++c) acc[i][c] = 0.0f;
  const int chunks = (k + kChunk - 1) / kChunk;
  // Chunks in flight per warp: 4 for one or two rows (on an H200, 8B
  // shapes, 9% faster than 2: docs/benchmarks.md, "The skinny GEMV's loads
  // in flight"); more rows hold more registers per chunk.
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
#pragma unroll
  for (int i = 0; i < M; ++i) {
#pragma unroll
    for (int c = 0; c < C; ++c) {
      const float v = WarpSum(acc[i][c]);
      if (lane == 0) red[warp][i][c] = v;
    }
  }
  if constexpr (kNormIn) {  // the producer's sums of squares, in a fixed order
    float s[M];
#pragma unroll
    for (int i = 0; i < M; ++i) {
      s[i] = 0.0f;
#pragma unroll
      for (int j = 0; j < kPreSums; ++j) s[i] += pre_ss[i][j];
      if (i < m) {  // past kPreSums sums a thread (hidden > 4,096 at 256 threads)
        const float* part = norm_in.sumsq + static_cast<size_t>(i) * norm_in.blocks;
        for (int b = threadIdx.x + kPreSums * blockDim.x; b < norm_in.blocks; b += blockDim.x) {
          s[i] += part[b];
        }
      }
      s[i] = WarpSum(s[i]);
      if (lane == 0) row_ss[warp][i] = s[i];
    }
  }
  __syncthreads();
  float inv[M];  // the folded norm's 1 / rms per row (1 without one)
#pragma unroll
  for (int i = 0; i < M; ++i) {
    inv[i] = 1.0f;
    if constexpr (kNormIn) {
      float ss = 0.0f;
#pragma unroll
      for (int wv = 0; wv < kWarps; ++wv) ss += row_ss[wv][i];
      inv[i] = rsqrtf(ss / static_cast<float>(norm_in.hidden) + norm_in.eps);
    }
  }
  if constexpr (kSiluPairs) {
    for (int idx = threadIdx.x; idx < M * (C / 2); idx += blockDim.x) {
      const int i = idx / (C / 2), c = idx % (C / 2);
      float g = 0.0f, u = 0.0f;
#pragma unroll
      for (int wv = 0; wv < kWarps; ++wv) g += red[wv][i][c];
#pragma unroll
      for (int wv = 0; wv < kWarps; ++wv) u += red[wv][i][c + C / 2];
      g *= inv[i], u *= inv[i];  // 1 without a folded norm: the same bits
      if (i < m && n0 + c < n) {
        y[static_cast<size_t>(i) * n + n0 + c] =
            FromF<OutT>(SiluTimes(ToF(FromF<T>(g)), ToF(FromF<T>(u))));
      }
    }
  } else if constexpr (kEpi == Epi::kNormOut) {
    // Thread idx < M * C owns output (idx / C, idx % C) and loaded its
    // operands above; red[0][i][c] then holds r^2 (only that thread read
    // red[.][i][c]).
    static_assert(M * C <= kWarps * 32, "one output a thread");
    if (threadIdx.x < M * C) {
      const int i = threadIdx.x / C, c = threadIdx.x % C;
      float v = 0.0f;
#pragma unroll
      for (int wv = 0; wv < kWarps; ++wv) v += red[wv][i][c];
      float r = 0.0f;
      if (i < m && n0 + c < n) {
        const size_t at = static_cast<size_t>(i) * n + n0 + c;
        // resid + o, then + bias: LaunchAddRmsNorm's order and bits.
        r = pre_r + ToF(FromF<T>(v));
        if (norm_out.bias != nullptr) r += pre_add;
        norm_out.resid[at] = r;
        static_cast<T*>(norm_out.xg)[at] = FromF<T>(pre_gamma * r);
      }
      red[0][i][c] = r * r;
    }
    __syncthreads();
    if (threadIdx.x < m && threadIdx.x < M) {
      float ss = 0.0f;
#pragma unroll
      for (int c = 0; c < C; ++c) ss += red[0][threadIdx.x][c];
      norm_out.sumsq[static_cast<size_t>(threadIdx.x) * gridDim.x + blockIdx.x] = ss;
    }
  } else if constexpr (kEpi == Epi::kRopeKv) {
    static_assert(C == 8, "4 pairs or 8 V columns a block");
    if (threadIdx.x < M * C) {
      const int i = threadIdx.x / C, c = threadIdx.x % C;
      float v1 = 0.0f, v2 = 0.0f;
#pragma unroll
      for (int wv = 0; wv < kWarps; ++wv) v1 += red[wv][i][c];
#pragma unroll
      for (int wv = 0; wv < kWarps; ++wv) v2 += red[wv][i][(c + 4) % C];
      RopeStore<T, KvT>(rope, rope_cols, rope_pre, i, c, v1 * inv[i], v2 * inv[i]);
    }
  } else {
    for (int idx = threadIdx.x; idx < M * C; idx += blockDim.x) {
      const int i = idx / C, c = idx % C;
      float v = 0.0f;
#pragma unroll
      for (int wv = 0; wv < kWarps; ++wv) v += red[wv][i][c];
      if (i < m && n0 + c < n) y[static_cast<size_t>(i) * n + n0 + c] = FromF<OutT>(v * inv[i]);
    }
  }
}

// The columns a block owns at M rows (its C; for kSiluPairs C / 2).
constexpr int BlockCols(int m) { return m <= 4 ? 8 : 4; }

// n: y's columns (for kSiluPairs, the MLP's intermediate size: w has 2n
// rows).
template <typename T, typename OutT, int M, int C, Epi kEpi, bool kNormIn, typename KvT = T>
cudaError_t LaunchM(const void* x, const void* w, void* y, int m, int n, int k,
                    const SkinnyNormIn& in, const SkinnyNormOut& out, cudaStream_t stream,
                    const SkinnyRope& rope = {}) {
  static_assert(C == BlockCols(M), "SkinnyNormBlocks counts blocks of BlockCols columns");
  constexpr int kCols = kEpi == Epi::kSiluPairs ? C / 2 : C;
  return LaunchKernel(SkinnyGemmKernel<T, OutT, M, C, kEpi, kNormIn, KvT>, (n + kCols - 1) / kCols,
                      kWarps * 32, 0, stream, static_cast<const T*>(x), static_cast<const T*>(w),
                      static_cast<OutT*>(y), m, n, k, in, out, rope);
}

template <typename T, typename KvT>
cudaError_t DispatchRope(const void* x, const void* w, int m, int n, int k, const SkinnyNormIn* in,
                         const SkinnyRope& rope, cudaStream_t stream) {
  constexpr Epi kRope = Epi::kRopeKv;
  const SkinnyNormIn none{};
  if (in == nullptr) {
    if (m <= 1)
      return LaunchM<T, T, 1, 8, kRope, false, KvT>(x, w, nullptr, m, n, k, none, {}, stream, rope);
    return LaunchM<T, T, 2, 8, kRope, false, KvT>(x, w, nullptr, m, n, k, none, {}, stream, rope);
  }
  if (m <= 1)
    return LaunchM<T, T, 1, 8, kRope, true, KvT>(x, w, nullptr, m, n, k, *in, {}, stream, rope);
  return LaunchM<T, T, 2, 8, kRope, true, KvT>(x, w, nullptr, m, n, k, *in, {}, stream, rope);
}

template <typename T, typename OutT, Epi kEpi = Epi::kPlain>
cudaError_t Dispatch(const void* x, const void* w, void* y, int m, int n, int k,
                     const SkinnyNormIn* in, const SkinnyNormOut& out, cudaStream_t stream) {
  const SkinnyNormIn none{};
  // Folded norms (one or two rows): kNormOut always, kNormIn when given.
  if constexpr (kEpi != Epi::kNormOut) {
    if (in == nullptr) {
      if (m <= 1) return LaunchM<T, OutT, 1, 8, kEpi, false>(x, w, y, m, n, k, none, out, stream);
      if (m <= 2) return LaunchM<T, OutT, 2, 8, kEpi, false>(x, w, y, m, n, k, none, out, stream);
      if (m <= 4) return LaunchM<T, OutT, 4, 8, kEpi, false>(x, w, y, m, n, k, none, out, stream);
      return LaunchM<T, OutT, 8, 4, kEpi, false>(x, w, y, m, n, k, none, out, stream);
    }
    if (m <= 1) return LaunchM<T, OutT, 1, 8, kEpi, true>(x, w, y, m, n, k, *in, out, stream);
    return LaunchM<T, OutT, 2, 8, kEpi, true>(x, w, y, m, n, k, *in, out, stream);
  } else {
    if (m <= 1) return LaunchM<T, OutT, 1, 8, kEpi, false>(x, w, y, m, n, k, none, out, stream);
    return LaunchM<T, OutT, 2, 8, kEpi, false>(x, w, y, m, n, k, none, out, stream);
  }
}

bool NormInValid(const SkinnyNormIn* in, int m) {
  return in == nullptr || (SkinnyNormSupports(m, in->hidden) && in->sumsq != nullptr &&
                           in->blocks == SkinnyNormBlocks(m, in->hidden));
}

}  // namespace

bool SkinnyGemmSupports(int m, int k) { return m >= 1 && m <= kSkinnyGemmMaxM && k % 8 == 0; }

bool SkinnyNormSupports(int m, int n) { return m <= kSkinnyNormMaxM && SkinnyGemmSupports(m, n); }

int SkinnyNormBlocks(int m, int n) { return (n + BlockCols(m) - 1) / BlockCols(m); }

cudaError_t LaunchSkinnyGemm(const void* x, const void* w, void* y, int m, int n, int k,
                             ActType type, bool out_f32, cudaStream_t stream,
                             const SkinnyNormIn* norm_in) {
  if (!SkinnyGemmSupports(m, k) || !NormInValid(norm_in, m)) return cudaErrorInvalidValue;
  BALLAST_DISPATCH_ACT(type, T, {
    return out_f32 ? Dispatch<T, float>(x, w, y, m, n, k, norm_in, {}, stream)
                   : Dispatch<T, T>(x, w, y, m, n, k, norm_in, {}, stream);
  });
  return cudaErrorInvalidValue;
}

cudaError_t LaunchSkinnyGemmSiluMul(const void* x, const void* w_gate_up, void* y, int m, int inter,
                                    int k, ActType type, cudaStream_t stream,
                                    const SkinnyNormIn* norm_in) {
  if (!SkinnyGemmSupports(m, k) || inter <= 0 || !NormInValid(norm_in, m)) {
    return cudaErrorInvalidValue;
  }
  BALLAST_DISPATCH_ACT(type, T, {
    return Dispatch<T, T, Epi::kSiluPairs>(x, w_gate_up, y, m, inter, k, norm_in, {}, stream);
  });
  return cudaErrorInvalidValue;
}

cudaError_t LaunchSkinnyGemmNormOut(const void* x, const void* w, int m, int n, int k,
                                    const SkinnyNormOut& out, ActType type, cudaStream_t stream) {
  if (!SkinnyGemmSupports(m, k) || !SkinnyNormSupports(m, n) || out.resid == nullptr ||
      out.gamma == nullptr || out.xg == nullptr || out.sumsq == nullptr) {
    return cudaErrorInvalidValue;
  }
  BALLAST_DISPATCH_ACT(type, T, {
    return Dispatch<T, T, Epi::kNormOut>(x, w, nullptr, m, n, k, nullptr, out, stream);
  });
  return cudaErrorInvalidValue;
}

bool SkinnyRopeSupports(int m, int k, int num_heads, const PagedKv& kv) {
  return m >= 1 && m <= kSkinnyNormMaxM && SkinnyGemmSupports(m, k) && num_heads > 0 &&
         kv.num_kv_heads > 0 && kv.head_dim % 8 == 0 && kv.head_dim <= 256;
}

cudaError_t LaunchSkinnyGemmRopeKv(const void* x, const void* w, int m, int k,
                                   const SkinnyNormIn* norm_in, const SkinnyRope& rope,
                                   ActType type, cudaStream_t stream) {
  if (!SkinnyRopeSupports(m, k, rope.num_heads, rope.kv) || !NormInValid(norm_in, m) ||
      rope.q_out == nullptr || rope.inv_freq == nullptr || rope.tokens.num_tokens != m) {
    return cudaErrorInvalidValue;
  }
  const int D = rope.kv.head_dim, Hkv = rope.kv.num_kv_heads;
  // Blocks of 8 columns: (H + Hkv) D / 8 of pairs, then Hkv D / 8 of V.
  const int n = (rope.num_heads + 2 * Hkv) * D;
  BALLAST_DISPATCH_ACT(type, T, {
    switch (rope.kv.dtype) {
      case KvType::kFP8E4M3:
        return DispatchRope<T, __nv_fp8_e4m3>(x, w, m, n, k, norm_in, rope, stream);
      case KvType::kBF16:
        return DispatchRope<T, __nv_bfloat16>(x, w, m, n, k, norm_in, rope, stream);
      case KvType::kF16:
        return DispatchRope<T, __half>(x, w, m, n, k, norm_in, rope, stream);
    }
  });
  return cudaErrorInvalidValue;
}

}  // namespace ballast::engine::cuda
