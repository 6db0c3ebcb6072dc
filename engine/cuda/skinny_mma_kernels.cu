// Skinny products on tensor cores, for decode steps of a few to 16 rows:
// y[m][n] = x[m][k] w[n][k]^T with w streamed once from HBM and the rows of
// x as the 8 (or 16) columns of mma.sync's B operand (kernels.h,
// LaunchSkinnyMma). Where the CUDA-core skinny kernel (gemv_kernels.cu)
// spends FMAs in proportion to the rows, an mma multiplies a 16x16 weight
// tile (16x32 for E4M3) by 8 rows at once, so past two rows the weight
// stream, not the arithmetic, stays the bound.
//
// Measured on an H100 (8B shape, docs/benchmarks.md, "Tensor-core skinny
// products"): FP8 decode steps of 3 to 16 rows 8-23% faster than the
// CUDA-core kernel and cuBLASLt's FP8 GEMM; over BF16 weights cuBLASLt
// stays 4-20% faster, so Gemm takes 2-byte weights here only when asked.
//
// A block owns 16 weight rows (one mma A tile); its 8 warps split K into
// interleaved chunks of 128 bytes a row. Each lane loads 16-byte pieces of
// weight rows g and g + 8 (g = lane / 4) and the same K positions of x rows
// g (and g + 8): the dot product does not depend on the order of K, so the
// lanes' registers are the fragments of a permuted K, the same permutation
// for A and B, and no shared memory staging or ldmatrix is needed. The
// warps' 16 x 16 accumulators are summed in shared memory in warp order.
//
// Operand modes (Mode):
//   k2Byte: w and x in T (BF16/FP16), m16n8k16, 4 mmas a chunk (64 K).
//   kW8A8:  w and x E4M3 (x quantized per row, LaunchQuantizeRowsFp8),
//           m16n8k32, 4 mmas a chunk (128 K); y = sum * x_scale * w_scale.
//   kW8A16: w E4M3, x in T: 16 weights a lane a chunk (64 K) converted to
//           T pairs, m16n8k16. For FP16, cvt e4m3x2 -> f16x2 (exact). For
//           BF16, bit moves: e4m3 s.eeee.mmm becomes the BF16 s.0000eeee.
//           mmm0000, the same value times 2^-120 (subnormals included), and
//           2^120 joins w_scale in the epilogue.
#include <type_traits>

#include "engine/cuda/common.cuh"
#include "engine/cuda/mma.cuh"

namespace ballast::engine::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kTileRows = 16;     // weight rows a block owns (for kSiluPairs: 8 gate, 8 up)
constexpr int kChunkBytes = 128;  // bytes of a weight row a warp covers per chunk

enum class Mode { k2Byte, kW8A8, kW8A16 };
enum class Epi { kPlain, kSiluPairs };

// mma m16n8k32 over E4M3 (sm_89+): a = {(g, 4t..4t+3), (g + 8, 4t..), (g,
// 16 + 4t..), (g + 8, 16 + 4t..)} byte quads; b = {(4t.., g), (16 + 4t..,
// g)}; d as Mma's.
__device__ __forceinline__ void MmaE4m3(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Four E4M3 bytes of q as two packed pairs of T (bytes 0, 1 into lo):
// exact halves for FP16; for BF16 each value times 2^-120 (kW8A16Scale).
template <typename T>
__device__ __forceinline__ void E4m3x4ToPairs(uint32_t q, uint32_t& lo, uint32_t& hi) {
  if constexpr (std::is_same_v<T, __half>) {
    lo = Fp8x2ToHalf2(q);
    hi = Fp8x2ToHalf2(q >> 16);
  } else {
    const uint32_t mag = q & 0x7f7f7f7fu;
    // [0, b0, 0, b1] and [0, b2, 0, b3]: each byte in the high half of a pair.
    const uint32_t s_lo = __byte_perm(q, 0u, 0x1404u) & 0x80008000u;
    const uint32_t s_hi = __byte_perm(q, 0u, 0x3424u) & 0x80008000u;
    lo = s_lo | (__byte_perm(mag, 0u, 0x1404u) >> 4);
    hi = s_hi | (__byte_perm(mag, 0u, 0x3424u) >> 4);
  }
}
template <typename T>
constexpr float kW8A16Scale = std::is_same_v<T, __half> ? 1.0f : 1.329227995784916e36f;  // 2^120

// The mmas of one 16-byte piece h of weight rows g (w0) and g + 8 (w1)
// with the same K of the x rows (xv[j][h], the x bytes beside the piece).
template <typename T, Mode kMode, int NT, int kXLoads>
__device__ __forceinline__ void MmaPiece(const uint4& w0, const uint4& w1,
                                         const uint4 (&xv)[NT][2][kXLoads], int h,
                                         float (&d)[NT][4]) {
  if constexpr (kMode == Mode::kW8A16) {
    uint32_t a[2][8];  // [row][pair]: K 2p, 2p + 1 of the piece
    const uint4* rows[2] = {&w0, &w1};
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const uint32_t q[4] = {rows[r]->x, rows[r]->y, rows[r]->z, rows[r]->w};
#pragma unroll
      for (int i = 0; i < 4; ++i) E4m3x4ToPairs<T>(q[i], a[r][2 * i], a[r][2 * i + 1]);
    }
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      const uint32_t af[4] = {a[0][2 * s], a[1][2 * s], a[0][2 * s + 1], a[1][2 * s + 1]};
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const uint32_t* xp = reinterpret_cast<const uint32_t*>(&xv[j][h][s / 2]) + 2 * (s % 2);
        Mma<T>(d[j], af, xp[0], xp[1]);
      }
    }
  } else {
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      const uint32_t* p0 = reinterpret_cast<const uint32_t*>(&w0) + 2 * s;
      const uint32_t* p1 = reinterpret_cast<const uint32_t*>(&w1) + 2 * s;
      const uint32_t af[4] = {p0[0], p1[0], p0[1], p1[1]};
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const uint32_t* xp = reinterpret_cast<const uint32_t*>(&xv[j][h][0]) + 2 * s;
        if constexpr (kMode == Mode::kW8A8) {
          MmaE4m3(d[j], af, xp[0], xp[1]);
        } else {
          Mma<T>(d[j], af, xp[0], xp[1]);
        }
      }
    }
  }
}

// One warp's 16 x (8 NT) sums over its chunks of K. wr: weight rows g and
// g + 8; xr[j]: x row g + 8 j (clamped to m - 1). A chunk is 128 bytes of
// a weight row (64 K of 2-byte weights, 128 of E4M3): lane t loads the
// 16-byte pieces at bytes 16t and 64 + 16t of rows g and g + 8, and the
// same K of its x rows. A piece of 2-byte (or E4M3 x E4M3) operands is the
// a0/a2 (b0/b1) registers of two mmas; a piece of E4M3 weights beside
// 2-byte x is 16 K, 8 converted pairs, four m16n8k16 mmas.
template <typename T, Mode kMode, int NT>
__device__ __forceinline__ void AccumulateMma(const uint8_t* const (&wr)[2],
                                              const uint8_t* const (&xr)[NT], int k,
                                              float (&d)[NT][4]) {
  constexpr int kWBytes = kMode == Mode::k2Byte ? 2 : 1;
  constexpr int kXBytes = kMode == Mode::kW8A8 ? 1 : 2;
  constexpr int kChunkK = kChunkBytes / kWBytes;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, t = lane & 3;
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) d[j][e] = 0.0f;
  const int chunks = k / kChunkK;
  // Chunks in flight a warp: 4 for 8 rows of x (4 KB of weights a warp),
  // 2 for 16 (the x registers double).
  constexpr int kUnroll = NT == 1 ? 4 : 2;
#pragma unroll kUnroll
  for (int ch = warp; ch < chunks; ch += kWarps) {
    uint4 wv[2][2];  // [row g, g + 8][piece]
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        wv[r][h] = *reinterpret_cast<const uint4*>(wr[r] + ch * kChunkBytes + 64 * h + 16 * t);
    // Piece h's first K element: ch kChunkK + (64 h + 16 t) / kWBytes.
    constexpr int kXPiece = 16 / kWBytes * kXBytes;  // x bytes beside a weight piece
    uint4 xv[NT][2][kXPiece / 16];
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int q = 0; q < kXPiece / 16; ++q) {
          const int e = ch * kChunkK + (64 * h + 16 * t) / kWBytes;
          xv[j][h][q] = *reinterpret_cast<const uint4*>(xr[j] + e * kXBytes + 16 * q);
        }
#pragma unroll
    for (int h = 0; h < 2; ++h) MmaPiece<T, kMode, NT>(wv[0][h], wv[1][h], xv, h, d);
  }
}

template <int NT>
using TileSums = float[kWarps][kTileRows][8 * NT];  // shared: each warp's sums [row][x row]

// The block's sum for (tile row r, x row i), warps in order.
template <int NT>
__device__ __forceinline__ float TileSumOf(const TileSums<NT>& red, int r, int i) {
  float v = 0.0f;
#pragma unroll
  for (int wv = 0; wv < kWarps; ++wv) v += red[wv][r][i];
  return v;
}

// Block b owns weight rows 16b..16b + 15 (kPlain) or gate rows 8b..8b + 7
// with their up rows (kSiluPairs, w [2n][k]).
template <typename T, typename OutT, Mode kMode, Epi kEpi, int NT>
__global__ void __launch_bounds__(kWarps * 32)
    SkinnyMmaKernel(const void* __restrict__ x, const float* __restrict__ x_scale,
                    const void* __restrict__ w, const float* __restrict__ w_scale,
                    OutT* __restrict__ y, int m, int n, int k) {
  constexpr bool kPairs = kEpi == Epi::kSiluPairs;
  constexpr int kXBytes = kMode == Mode::kW8A8 ? 1 : 2;
  constexpr int kWBytes = kMode == Mode::k2Byte ? 2 : 1;
  __shared__ TileSums<NT> red;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int n0 = blockIdx.x * (kPairs ? kTileRows / 2 : kTileRows);
  int rows[2];
  if constexpr (kPairs) {
    rows[0] = min(n0 + g, n - 1);
    rows[1] = n + rows[0];
  } else {
    rows[0] = min(n0 + g, n - 1);
    rows[1] = min(n0 + g + 8, n - 1);
  }
  const uint8_t* wr[2];
#pragma unroll
  for (int r = 0; r < 2; ++r)
    wr[r] = static_cast<const uint8_t*>(w) + static_cast<size_t>(rows[r]) * k * kWBytes;
  const uint8_t* xr[NT];
#pragma unroll
  for (int j = 0; j < NT; ++j)
    xr[j] =
        static_cast<const uint8_t*>(x) + static_cast<size_t>(min(g + 8 * j, m - 1)) * k * kXBytes;
  WaitPriorGrid();
  float d[NT][4];
  AccumulateMma<T, kMode, NT>(wr, xr, k, d);
  // The next kernel may start only now: triggered at the block's start
  // instead, the launches after it (norm, RoPE, attention, the next
  // product) went resident on whatever SMs had room while this product
  // still streamed, and an 8B step of 3 to 16 rows took 45-80% longer than
  // with cuBLASLt (H100, docs/benchmarks.md).
  AllowNextGrid();
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    red[warp][g][8 * j + 2 * t] = d[j][0];
    red[warp][g][8 * j + 2 * t + 1] = d[j][1];
    red[warp][g + 8][8 * j + 2 * t] = d[j][2];
    red[warp][g + 8][8 * j + 2 * t + 1] = d[j][3];
  }
  __syncthreads();
  // Row scales: E4M3 weights' w_scale (times 2^120 for BF16 W8A16), E4M3
  // x's x_scale.
  auto scaled = [&](float v, int row, int i) {
    if constexpr (kMode == Mode::kW8A8) v *= w_scale[row] * x_scale[i];
    if constexpr (kMode == Mode::kW8A16) v *= w_scale[row] * kW8A16Scale<T>;
    return v;
  };
  if constexpr (kPairs) {
    for (int idx = threadIdx.x; idx < 8 * NT * (kTileRows / 2); idx += blockDim.x) {
      const int i = idx / (kTileRows / 2), c = idx % (kTileRows / 2);
      if (i >= m || n0 + c >= n) continue;
      const float gsum = scaled(TileSumOf<NT>(red, c, i), n0 + c, i);
      const float usum = scaled(TileSumOf<NT>(red, c + 8, i), n + n0 + c, i);
      y[static_cast<size_t>(i) * n + n0 + c] =
          FromF<OutT>(SiluTimes(ToF(FromF<T>(gsum)), ToF(FromF<T>(usum))));
    }
  } else {
    for (int idx = threadIdx.x; idx < 8 * NT * kTileRows; idx += blockDim.x) {
      const int i = idx / kTileRows, r = idx % kTileRows;
      if (i >= m || n0 + r >= n) continue;
      y[static_cast<size_t>(i) * n + n0 + r] =
          FromF<OutT>(scaled(TileSumOf<NT>(red, r, i), n0 + r, i));
    }
  }
}

template <typename T, typename OutT, Mode kMode, Epi kEpi>
cudaError_t Launch(const void* x, const float* x_scale, const void* w, const float* w_scale,
                   void* y, int m, int n, int k, cudaStream_t stream) {
  constexpr int kOwned = kEpi == Epi::kSiluPairs ? kTileRows / 2 : kTileRows;
  const int blocks = (n + kOwned - 1) / kOwned;
  auto* out = static_cast<OutT*>(y);
  if (m <= 8) {
    return LaunchKernel(SkinnyMmaKernel<T, OutT, kMode, kEpi, 1>, blocks, kWarps * 32, 0, stream, x,
                        x_scale, w, w_scale, out, m, n, k);
  }
  return LaunchKernel(SkinnyMmaKernel<T, OutT, kMode, kEpi, 2>, blocks, kWarps * 32, 0, stream, x,
                      x_scale, w, w_scale, out, m, n, k);
}

}  // namespace

bool SkinnyMmaSupports(int m, int k) {
  return m >= 1 && m <= kSkinnyMmaMaxM && k > 0 && k % kSkinnyMmaKMultiple == 0;
}

cudaError_t LaunchSkinnyMma(const void* x, const void* w, void* y, int m, int n, int k,
                            ActType type, bool out_f32, cudaStream_t stream, const float* w_scale) {
  if (!SkinnyMmaSupports(m, k) || n <= 0 || (out_f32 && w_scale != nullptr)) {
    return cudaErrorInvalidValue;
  }
  BALLAST_DISPATCH_ACT(type, T, {
    if (w_scale != nullptr) {
      return Launch<T, T, Mode::kW8A16, Epi::kPlain>(x, nullptr, w, w_scale, y, m, n, k, stream);
    }
    if (out_f32) {
      return Launch<T, float, Mode::k2Byte, Epi::kPlain>(x, nullptr, w, nullptr, y, m, n, k,
                                                         stream);
    }
    return Launch<T, T, Mode::k2Byte, Epi::kPlain>(x, nullptr, w, nullptr, y, m, n, k, stream);
  });
  return cudaErrorInvalidValue;
}

cudaError_t LaunchSkinnyMmaSiluMul(const void* x, const void* w_gate_up, void* y, int m, int inter,
                                   int k, ActType type, cudaStream_t stream, const float* w_scale) {
  if (!SkinnyMmaSupports(m, k) || inter <= 0) return cudaErrorInvalidValue;
  BALLAST_DISPATCH_ACT(type, T, {
    if (w_scale != nullptr) {
      return Launch<T, T, Mode::kW8A16, Epi::kSiluPairs>(x, nullptr, w_gate_up, w_scale, y, m,
                                                         inter, k, stream);
    }
    return Launch<T, T, Mode::k2Byte, Epi::kSiluPairs>(x, nullptr, w_gate_up, nullptr, y, m, inter,
                                                       k, stream);
  });
  return cudaErrorInvalidValue;
}

cudaError_t LaunchSkinnyMmaFp8(const void* xq, const float* x_scale, const void* w,
                               const float* w_scale, void* y, int m, int n, int k, ActType type,
                               cudaStream_t stream) {
  if (!SkinnyMmaSupports(m, k) || n <= 0 || xq == nullptr || x_scale == nullptr ||
      w_scale == nullptr) {
    return cudaErrorInvalidValue;
  }
  BALLAST_DISPATCH_ACT(type, T, {
    return Launch<T, T, Mode::kW8A8, Epi::kPlain>(xq, x_scale, w, w_scale, y, m, n, k, stream);
  });
  return cudaErrorInvalidValue;
}

}  // namespace ballast::engine::cuda
