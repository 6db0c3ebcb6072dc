// Skinny GEMM for decode (M <= 8 rows): y[M][N] = x[M][K] w[N][K]^T with
// the weight streamed once at close to full memory bandwidth, FP32 partial
// sums. The x rows (a few KB) stay in L1/L2. Measured (H100, 8B shapes):
// with more rows x traffic from L1 outgrows the weight stream and cuBLASLt
// wins, so larger products go there.
#include "engine/cuda/common.cuh"
#include "engine/cuda/skinny_epilogues.cuh"

namespace ballast::engine::cuda {
namespace {

using namespace skinny;  // NOLINT: this file's helpers (skinny_epilogues.cuh)

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
//
// kEpi == kRopeKv (the qkv product of a decode step, kernels.h,
// LaunchSkinnyGemmRopeKv): a block's 8 rows are 4 RoPE pairs (d, d + D/2)
// of one q or k head, or 8 consecutive V columns (skinny_epilogues.cuh,
// RopeCols); its epilogue does what LaunchRopeKvWrite does with the
// rounded product, with the same arithmetic, and y is not written.
enum class Epi { kPlain, kSiluPairs, kNormOut, kRopeKv };

template <typename T, typename OutT, int M, int C, Epi kEpi = Epi::kPlain, bool kNormIn = false,
          typename KvT = T, typename W = T>
__global__ void __launch_bounds__(kWarps * 32)
    SkinnyGemmKernel(const T* __restrict__ x, const W* __restrict__ w,
                     const float* __restrict__ w_scale, OutT* __restrict__ y, int m, int n, int k,
                     SkinnyNormIn norm_in, SkinnyNormOut norm_out, SkinnyRope rope) {
  constexpr bool kSiluPairs = kEpi == Epi::kSiluPairs;
  static_assert(!kSiluPairs || C % 2 == 0, "pairs of gate and up rows");
  __shared__ WarpSums<M, C> red;
  __shared__ float row_ss[kWarps][M];
  const int n0 = blockIdx.x * (kSiluPairs ? C / 2 : C);
  RopeCols rope_cols{};
  if constexpr (kEpi == Epi::kRopeKv) rope_cols = RopeColsOf(rope, blockIdx.x);
  const W* wr[C];
  int rows[C];
#pragma unroll
  for (int c = 0; c < C; ++c) {
    int row = kSiluPairs ? (c < C / 2 ? min(n0 + c, n - 1) : n + min(n0 + c - C / 2, n - 1))
                         : min(n0 + c, n - 1);
    if constexpr (kEpi == Epi::kRopeKv) row = RopeRow(rope, rope_cols, c);
    wr[c] = w + static_cast<size_t>(row) * k;
    rows[c] = row;
  }
  // When the next kernel may start: at once, or (E4M3 weights, two rows
  // and more) after the K loop. On an H100 (8B shape) the late trigger made
  // FP8 steps of two rows 4.7% faster (3.88 against 4.08 ms) and those of
  // one row no slower; BF16 steps of one and two rows 0.6-1.5% slower
  // (docs/benchmarks.md, "Tensor-core skinny products").
  constexpr bool kLateTrigger = sizeof(W) == 1 && M >= 2;
  if constexpr (!kLateTrigger) AllowNextGrid();
  WaitPriorGrid();
  float scale[C];  // E4M3 weights' row scales (unused for 2-byte weights)
#pragma unroll
  for (int c = 0; c < C; ++c) scale[c] = sizeof(W) == 1 ? w_scale[rows[c]] : 1.0f;
  // The epilogue's own operands first: their latency hides behind the K loop.
  NormInSums<M> sums;
  if constexpr (kNormIn) sums.Load(norm_in, m);
  RopePre rope_pre;
  if constexpr (kEpi == Epi::kRopeKv) {
    if (threadIdx.x < M * C) {
      rope_pre = LoadRopePre<T>(rope, rope_cols, threadIdx.x / C, threadIdx.x % C, m);
    }
  }
  NormOutPre out_pre;
  if constexpr (kEpi == Epi::kNormOut) out_pre = LoadNormOutPre<T, M, C>(norm_out, m, n, n0);
  float acc[M][C];
  if constexpr (sizeof(W) == 1) {
    AccumulateK<T, M, C>(x, wr, m, k, acc);
  } else {
    AccumulateK<T, M, C>(x, wr, k, acc);
  }
  if constexpr (kLateTrigger) AllowNextGrid();
  ScaleSums<W, M, C>(scale, acc);
  StoreWarpSums<M, C>(acc, red);
  if constexpr (kNormIn) sums.Reduce(norm_in, m, row_ss);
  __syncthreads();
  float inv[M];  // the folded norm's 1 / rms per row (1 without one: the same bits)
#pragma unroll
  for (int i = 0; i < M; ++i) inv[i] = kNormIn ? InvRms<M>(row_ss, norm_in, i) : 1.0f;
  if constexpr (kSiluPairs) {
    for (int idx = threadIdx.x; idx < M * (C / 2); idx += blockDim.x) {
      const int i = idx / (C / 2), c = idx % (C / 2);
      const float g = BlockSumOf<M, C>(red, i, c) * inv[i];
      const float u = BlockSumOf<M, C>(red, i, c + C / 2) * inv[i];
      if (i < m && n0 + c < n) {
        y[static_cast<size_t>(i) * n + n0 + c] =
            FromF<OutT>(SiluTimes(ToF(FromF<T>(g)), ToF(FromF<T>(u))));
      }
    }
  } else if constexpr (kEpi == Epi::kNormOut) {
    NormOutEpilogue<T, M, C>(norm_out, out_pre, red, m, n, n0);
  } else if constexpr (kEpi == Epi::kRopeKv) {
    RopeEpilogue<T, KvT, M, C>(rope, rope_cols, rope_pre, red, inv);
  } else {
    for (int idx = threadIdx.x; idx < M * C; idx += blockDim.x) {
      const int i = idx / C, c = idx % C;
      const float v = BlockSumOf<M, C>(red, i, c);
      if (i < m && n0 + c < n) y[static_cast<size_t>(i) * n + n0 + c] = FromF<OutT>(v * inv[i]);
    }
  }
}

// The columns a block owns at M rows (its C; for kSiluPairs C / 2).
constexpr int BlockCols(int m) { return m <= 4 ? 8 : 4; }

// n: y's columns (for kSiluPairs, the MLP's intermediate size: w has 2n
// rows).
template <typename T, typename OutT, int M, int C, Epi kEpi, bool kNormIn, typename KvT = T,
          typename W = T>
cudaError_t LaunchM(const void* x, const void* w, const float* w_scale, void* y, int m, int n,
                    int k, const SkinnyNormIn& in, const SkinnyNormOut& out, cudaStream_t stream,
                    const SkinnyRope& rope = {}) {
  static_assert(C == BlockCols(M), "SkinnyNormBlocks counts blocks of BlockCols columns");
  constexpr int kCols = kEpi == Epi::kSiluPairs ? C / 2 : C;
  return LaunchKernel(SkinnyGemmKernel<T, OutT, M, C, kEpi, kNormIn, KvT, W>,
                      (n + kCols - 1) / kCols, kWarps * 32, 0, stream, static_cast<const T*>(x),
                      static_cast<const W*>(w), w_scale, static_cast<OutT*>(y), m, n, k, in, out,
                      rope);
}

// Up to kSkinnyNormMaxM rows (the folded decode products; E4M3 weights are
// built for these only).
template <typename T, typename OutT, Epi kEpi, bool kNormIn, typename KvT = T, typename W = T>
cudaError_t LaunchFew(const void* x, const void* w, const float* w_scale, void* y, int m, int n,
                      int k, const SkinnyNormIn& in, const SkinnyNormOut& out, cudaStream_t stream,
                      const SkinnyRope& rope = {}) {
  if (m <= 1) {
    return LaunchM<T, OutT, 1, 8, kEpi, kNormIn, KvT, W>(x, w, w_scale, y, m, n, k, in, out, stream,
                                                         rope);
  }
  return LaunchM<T, OutT, 2, 8, kEpi, kNormIn, KvT, W>(x, w, w_scale, y, m, n, k, in, out, stream,
                                                       rope);
}

template <typename T, typename KvT, typename W>
cudaError_t DispatchRope(const void* x, const void* w, const float* w_scale, int m, int n, int k,
                         const SkinnyNormIn* in, const SkinnyRope& rope, cudaStream_t stream) {
  constexpr Epi kRope = Epi::kRopeKv;
  if (in == nullptr) {
    return LaunchFew<T, T, kRope, false, KvT, W>(x, w, w_scale, nullptr, m, n, k, {}, {}, stream,
                                                 rope);
  }
  return LaunchFew<T, T, kRope, true, KvT, W>(x, w, w_scale, nullptr, m, n, k, *in, {}, stream,
                                              rope);
}

template <typename T, typename OutT, Epi kEpi = Epi::kPlain, typename W = T>
cudaError_t Dispatch(const void* x, const void* w, const float* w_scale, void* y, int m, int n,
                     int k, const SkinnyNormIn* in, const SkinnyNormOut& out, cudaStream_t stream) {
  const SkinnyNormIn none{};
  // Unfolded products take up to 8 rows of 2-byte weights, up to
  // kSkinnyFp8WeightsMaxM of E4M3 ones.
  constexpr bool kWide = kEpi != Epi::kNormOut;
  static_assert(kSkinnyFp8WeightsMaxM == 4, "E4M3 weights take the 4-row kernel at most");
  if constexpr (kEpi != Epi::kNormOut) {  // a producer takes no folded norm in
    if (in != nullptr) {
      return LaunchFew<T, OutT, kEpi, true, T, W>(x, w, w_scale, y, m, n, k, *in, out, stream);
    }
  }
  if constexpr (kWide) {
    if (m > 2) {
      if (sizeof(W) == 1 || m <= 4) {
        return LaunchM<T, OutT, 4, 8, kEpi, false, T, W>(x, w, w_scale, y, m, n, k, none, out,
                                                         stream);
      }
      if constexpr (sizeof(W) > 1) {
        return LaunchM<T, OutT, 8, 4, kEpi, false>(x, w, w_scale, y, m, n, k, none, out, stream);
      }
    }
  }
  return LaunchFew<T, OutT, kEpi, false, T, W>(x, w, w_scale, y, m, n, k, none, out, stream);
}

bool NormInValid(const SkinnyNormIn* in, int m) {
  return in == nullptr || (SkinnyNormSupports(m, in->hidden) && in->sumsq != nullptr &&
                           in->blocks == SkinnyNormBlocks(m, in->hidden));
}

// E4M3 weights (w_scale set) take up to kSkinnyFp8WeightsMaxM rows and
// k % 16 == 0.
bool WeightsValid(const float* w_scale, int m, int k) {
  return w_scale == nullptr || SkinnyGemmFp8WeightsSupports(m, k);
}

}  // namespace

bool SkinnyGemmSupports(int m, int k) { return m >= 1 && m <= kSkinnyGemmMaxM && k % 8 == 0; }

bool SkinnyGemmFp8WeightsSupports(int m, int k) {
  return m >= 1 && m <= kSkinnyFp8WeightsMaxM && k % 16 == 0;
}

bool SkinnyNormSupports(int m, int n) { return m <= kSkinnyNormMaxM && SkinnyGemmSupports(m, n); }

int SkinnyNormBlocks(int m, int n) { return (n + BlockCols(m) - 1) / BlockCols(m); }

// The 2-byte (W = T) or E4M3 (w_scale set) instantiation of a launch.
#define BALLAST_DISPATCH_WEIGHTS(w_scale, W, ...) \
  do {                                            \
    if ((w_scale) != nullptr) {                   \
      using W = __nv_fp8_e4m3;                    \
      __VA_ARGS__;                                \
    } else {                                      \
      using W = T;                                \
      __VA_ARGS__;                                \
    }                                             \
  } while (0)

cudaError_t LaunchSkinnyGemm(const void* x, const void* w, void* y, int m, int n, int k,
                             ActType type, bool out_f32, cudaStream_t stream,
                             const SkinnyNormIn* norm_in, const float* w_scale) {
  if (!SkinnyGemmSupports(m, k) || !NormInValid(norm_in, m) || !WeightsValid(w_scale, m, k) ||
      (out_f32 && w_scale != nullptr)) {
    return cudaErrorInvalidValue;
  }
  BALLAST_DISPATCH_ACT(type, T, {
    if (out_f32) return Dispatch<T, float>(x, w, nullptr, y, m, n, k, norm_in, {}, stream);
    BALLAST_DISPATCH_WEIGHTS(w_scale, W, {
      return Dispatch<T, T, Epi::kPlain, W>(x, w, w_scale, y, m, n, k, norm_in, {}, stream);
    });
  });
  return cudaErrorInvalidValue;
}

cudaError_t LaunchSkinnyGemmSiluMul(const void* x, const void* w_gate_up, void* y, int m, int inter,
                                    int k, ActType type, cudaStream_t stream,
                                    const SkinnyNormIn* norm_in, const float* w_scale) {
  if (!SkinnyGemmSupports(m, k) || inter <= 0 || !NormInValid(norm_in, m) ||
      !WeightsValid(w_scale, m, k)) {
    return cudaErrorInvalidValue;
  }
  BALLAST_DISPATCH_ACT(type, T, {
    BALLAST_DISPATCH_WEIGHTS(w_scale, W, {
      return Dispatch<T, T, Epi::kSiluPairs, W>(x, w_gate_up, w_scale, y, m, inter, k, norm_in, {},
                                                stream);
    });
  });
  return cudaErrorInvalidValue;
}

cudaError_t LaunchSkinnyGemmNormOut(const void* x, const void* w, int m, int n, int k,
                                    const SkinnyNormOut& out, ActType type, cudaStream_t stream,
                                    const float* w_scale) {
  if (!SkinnyGemmSupports(m, k) || !SkinnyNormSupports(m, n) || out.resid == nullptr ||
      out.gamma == nullptr || out.xg == nullptr || out.sumsq == nullptr ||
      !WeightsValid(w_scale, m, k)) {
    return cudaErrorInvalidValue;
  }
  BALLAST_DISPATCH_ACT(type, T, {
    BALLAST_DISPATCH_WEIGHTS(w_scale, W, {
      return Dispatch<T, T, Epi::kNormOut, W>(x, w, w_scale, nullptr, m, n, k, nullptr, out,
                                              stream);
    });
  });
  return cudaErrorInvalidValue;
}

bool SkinnyRopeSupports(int m, int k, int num_heads, const PagedKv& kv) {
  return m >= 1 && m <= kSkinnyNormMaxM && SkinnyGemmSupports(m, k) && num_heads > 0 &&
         kv.num_kv_heads > 0 && kv.head_dim % 8 == 0 && kv.head_dim <= 256;
}

cudaError_t LaunchSkinnyGemmRopeKv(const void* x, const void* w, int m, int k,
                                   const SkinnyNormIn* norm_in, const SkinnyRope& rope,
                                   ActType type, cudaStream_t stream, const float* w_scale) {
  if (!SkinnyRopeSupports(m, k, rope.num_heads, rope.kv) || !NormInValid(norm_in, m) ||
      !WeightsValid(w_scale, m, k) || rope.q_out == nullptr || rope.inv_freq == nullptr ||
      rope.tokens.num_tokens != m) {
    return cudaErrorInvalidValue;
  }
  const int D = rope.kv.head_dim, Hkv = rope.kv.num_kv_heads;
  // Blocks of 8 columns: (H + Hkv) D / 8 of pairs, then Hkv D / 8 of V.
  const int n = (rope.num_heads + 2 * Hkv) * D;
  BALLAST_DISPATCH_ACT(type, T, {
    BALLAST_DISPATCH_WEIGHTS(w_scale, W, {
      switch (rope.kv.dtype) {
        case KvType::kFP8E4M3:
          return DispatchRope<T, __nv_fp8_e4m3, W>(x, w, w_scale, m, n, k, norm_in, rope, stream);
        case KvType::kBF16:
          return DispatchRope<T, __nv_bfloat16, W>(x, w, w_scale, m, n, k, norm_in, rope, stream);
        case KvType::kF16:
          return DispatchRope<T, __half, W>(x, w, w_scale, m, n, k, norm_in, rope, stream);
      }
    });
  });
  return cudaErrorInvalidValue;
}

#undef BALLAST_DISPATCH_WEIGHTS

}  // namespace ballast::engine::cuda
