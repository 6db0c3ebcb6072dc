// Tensor-core skinny GEMM for decode batches of a few to 32 rows:
// y[M][N] = x[M][K] w[N][K]^T with w streamed once, as the CUDA-core skinny
// kernel (gemv_kernels.cu) does for one or two rows. Past two rows that
// kernel's FMAs and its x traffic (each of its blocks covers only a few
// weight rows) outgrow the weight stream, and cuBLASLt's general kernels
// read the weights well below bandwidth at these shapes; here the weight
// rows are the MMA's 16-row A operand and up to 32 tokens its N side, so
// the arithmetic is a few tensor-core instructions per 16-byte load.
//
// Layout. A block covers kRows x 16 weight rows (kRows = 1 or 2 row tiles
// per warp) and its 8 warps split K: warp w takes the 32-element steps
// w * kU, w * kU + 1, ..., then jumps 8 * kU steps. In each step lane
// (g = lane / 4, t = lane % 4) loads 16 bytes of weight rows g and g + 8 at
// k = 8t and 16 bytes of token g's x row at the same k. An MMA sums over
// its 16 k in any order as long as A and B agree, so the 8 elements are
// used as the fragments' k pairs {2t, 2t + 8} of one m16n8k16 and those of
// the next: 2 MMAs per step and token tile, with no shuffles and no shared
// memory. Each warp's partial sums are reduced across the 8 warps in
// shared memory in a fixed order, so a row's result does not depend on
// the grid (but differs from cuBLASLt's and the CUDA-core kernel's by
// rounding).
#include "engine/cuda/common.cuh"
#include "engine/cuda/mma.cuh"

namespace ballast::engine::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kStepK = 32;  // K elements a warp covers per step (16 bytes a lane)
constexpr int kU = 4;       // steps a warp loads before it multiplies

// 16 bytes of weights that no kernel of the step writes: read around L1.
__device__ __forceinline__ uint4 LoadWeights(const void* p) {
  uint4 r;
  asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
      : "l"(p));
  return r;
}

// kRows: 16-row tiles per warp; NT: 8-token tiles (M <= 8 * NT).
template <typename T, typename OutT, int kRows, int NT>
__global__ void __launch_bounds__(kWarps * 32)
    SkinnyMmaKernel(const T* __restrict__ x, const T* __restrict__ w, OutT* __restrict__ y, int m,
                    int n, int k) {
  __shared__ float red[kWarps][kRows][NT][4][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int r0 = blockIdx.x * kRows * 16;
  const T* wr[kRows][2];  // rows g and g + 8 of each tile (clamped: rows past n are discarded)
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    wr[r][0] = w + static_cast<size_t>(min(r0 + r * 16 + g, n - 1)) * k + 8 * t;
    wr[r][1] = w + static_cast<size_t>(min(r0 + r * 16 + g + 8, n - 1)) * k + 8 * t;
  }
  const int steps = k / kStepK;
  AllowNextGrid();
  // The weights are no earlier kernel's output: start this warp's first
  // loads into L2 while the kernel producing x finishes.
#pragma unroll
  for (int u = 0; u < kU; u += 2) {
    if (warp * kU + u < steps) {
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        PrefetchL2(wr[r][0] + (warp * kU + u) * kStepK);
        PrefetchL2(wr[r][1] + (warp * kU + u) * kStepK);
      }
    }
  }
  WaitPriorGrid();
  const T* xr[NT];
  bool has[NT];
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    has[j] = j * 8 + g < m;
    xr[j] = x + static_cast<size_t>(has[j] ? j * 8 + g : 0) * k + 8 * t;
  }
  float acc[kRows][NT][4] = {};
  const uint4 zero = make_uint4(0, 0, 0, 0);
  for (int s0 = warp * kU; s0 < steps; s0 += kWarps * kU) {
    uint4 a[kU][kRows][2], b[kU][NT];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const bool in = s0 + u < steps;
      const int at = (s0 + u) * kStepK;
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        a[u][r][0] = in ? LoadWeights(wr[r][0] + at) : zero;
        a[u][r][1] = in ? LoadWeights(wr[r][1] + at) : zero;
      }
#pragma unroll
      for (int j = 0; j < NT; ++j)
        b[u][j] = in && has[j] ? *reinterpret_cast<const uint4*>(xr[j] + at) : zero;
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const uint32_t lo[4] = {a[u][r][0].x, a[u][r][1].x, a[u][r][0].y, a[u][r][1].y};
        const uint32_t hi[4] = {a[u][r][0].z, a[u][r][1].z, a[u][r][0].w, a[u][r][1].w};
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          Mma<T>(acc[r][j], lo, b[u][j].x, b[u][j].y);
          Mma<T>(acc[r][j], hi, b[u][j].z, b[u][j].w);
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) red[warp][r][j][e][lane] = acc[r][j][e];
  __syncthreads();
  // acc[r][j][e] of lane (g, t): weight row r0 + 16r + g (+ 8 for e >= 2),
  // token 8j + 2t (+ 1 for odd e).
  for (int idx = threadIdx.x; idx < kRows * NT * 4 * 32; idx += blockDim.x) {
    const int ln = idx % 32, e = (idx / 32) % 4, j = (idx / 128) % NT, r = idx / (128 * NT);
    float v = 0.0f;
#pragma unroll
    for (int wv = 0; wv < kWarps; ++wv) v += red[wv][r][j][e][ln];
    const int row = r0 + r * 16 + (ln >> 2) + (e >= 2 ? 8 : 0);
    const int tok = j * 8 + 2 * (ln & 3) + (e & 1);
    if (tok < m && row < n) y[static_cast<size_t>(tok) * n + row] = FromF<OutT>(v);
  }
}

template <typename T, typename OutT, int kRows, int NT>
cudaError_t LaunchTiles(const void* x, const void* w, void* y, int m, int n, int k,
                        cudaStream_t stream) {
  constexpr int kBlockRows = kRows * 16;
  return LaunchKernel(SkinnyMmaKernel<T, OutT, kRows, NT>, (n + kBlockRows - 1) / kBlockRows,
                      kWarps * 32, 0, stream, static_cast<const T*>(x), static_cast<const T*>(w),
                      static_cast<OutT*>(y), m, n, k);
}

template <typename T, typename OutT, int kRows>
cudaError_t DispatchTokens(const void* x, const void* w, void* y, int m, int n, int k,
                           cudaStream_t stream) {
  if (m <= 8) return LaunchTiles<T, OutT, kRows, 1>(x, w, y, m, n, k, stream);
  if (m <= 16) return LaunchTiles<T, OutT, kRows, 2>(x, w, y, m, n, k, stream);
  return LaunchTiles<T, OutT, kRows, 4>(x, w, y, m, n, k, stream);
}

template <typename T, typename OutT>
cudaError_t Dispatch(const void* x, const void* w, void* y, int m, int n, int k, int row_tiles,
                     cudaStream_t stream) {
  if (row_tiles == 2) return DispatchTokens<T, OutT, 2>(x, w, y, m, n, k, stream);
  return DispatchTokens<T, OutT, 1>(x, w, y, m, n, k, stream);
}

}  // namespace

bool SkinnyMmaGemmSupports(int m, int k) {
  return m >= 1 && m <= kSkinnyMmaGemmMaxM && k > 0 && k % kStepK == 0;
}

int SkinnyMmaDefaultRowTiles(int m) { return m <= 8 ? 1 : 2; }

cudaError_t LaunchSkinnyMmaGemm(const void* x, const void* w, void* y, int m, int n, int k,
                                ActType type, bool out_f32, cudaStream_t stream, int row_tiles) {
  if (!SkinnyMmaGemmSupports(m, k) || n <= 0) return cudaErrorInvalidValue;
  if (row_tiles <= 0) row_tiles = SkinnyMmaDefaultRowTiles(m);
  if (row_tiles > 2) return cudaErrorInvalidValue;
  BALLAST_DISPATCH_ACT(type, T, {
    return out_f32 ? Dispatch<T, float>(x, w, y, m, n, k, row_tiles, stream)
                   : Dispatch<T, T>(x, w, y, m, n, k, row_tiles, stream);
  });
  return cudaErrorInvalidValue;
}

}  // namespace ballast::engine::cuda
