// Tensor-core skinny GEMM for decode batches of a few rows:
// y[M][N] = x[M][K] w[N][K]^T with w streamed once, as the CUDA-core skinny
// kernel (gemv_kernels.cu) does for one or two rows. Past two rows that
// kernel's FMAs outgrow the weight stream; here the weight rows are the
// MMA's 16-row A operand and up to 16 tokens its N side, so the arithmetic
// is a few tensor-core instructions per 16-byte load.
//
// Layout. A block covers 16 weight rows and its 8 warps split K: warp w
// takes the 64-element steps w * kU .. w * kU + kU - 1, then jumps
// 8 * kU steps. In each step lane (g = lane / 4, t = lane % 4) loads 32
// bytes of weight rows g and g + 8 at k = 16t and 32 bytes of token g's x
// row at the same k. An MMA sums over its 16 k in any order as long as A
// and B agree, so each 16-byte half is used as the fragments' k pairs
// {2t, 2t + 8} of one m16n8k16 and those of the next: 4 MMAs per step and
// token tile, with no shuffles and no shared memory in the loop. The
// warps' partial sums are reduced in shared memory in a fixed order, so a
// token's result does not depend on the other rows of the launch (but
// differs from cuBLASLt's and the CUDA-core kernel's by rounding).
//
// Measured on an H200 (docs/benchmarks.md, "Decode GEMMs on tensor
// cores"): two 16-byte loads a lane and row, two steps in flight, plain
// loads; one 16-byte load (with or without L1::no_allocate / L2::256B
// hints), more steps in flight or 64-byte runs a lane were slower.
#include "engine/cuda/common.cuh"
#include "engine/cuda/mma.cuh"

namespace ballast::engine::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kStepK = 64;  // K elements a warp covers per step (32 bytes a lane and row)
constexpr int kU = 2;       // steps a warp loads before it multiplies

// NT: 8-token tiles (M <= 8 * NT).
template <typename T, typename OutT, int NT>
__global__ void __launch_bounds__(kWarps * 32)
    SkinnyMmaKernel(const T* __restrict__ x, const T* __restrict__ w, OutT* __restrict__ y, int m,
                    int n, int k) {
  __shared__ float red[kWarps][NT][4][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int r0 = blockIdx.x * 16;
  // Rows g and g + 8 (clamped: rows past n are computed and discarded).
  const T* w_lo = w + static_cast<size_t>(min(r0 + g, n - 1)) * k + 16 * t;
  const T* w_hi = w + static_cast<size_t>(min(r0 + g + 8, n - 1)) * k + 16 * t;
  const int steps = k / kStepK;
  AllowNextGrid();
  // The weights are no earlier kernel's output: start this warp's first
  // step into L2 while the kernel producing x finishes.
  if (warp * kU < steps) {
    PrefetchL2(w_lo + warp * kU * kStepK);
    PrefetchL2(w_hi + warp * kU * kStepK);
  }
  WaitPriorGrid();
  const T* xr[NT];
  bool has[NT];
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    has[j] = j * 8 + g < m;
    xr[j] = x + static_cast<size_t>(has[j] ? j * 8 + g : 0) * k + 16 * t;
  }
  float acc[NT][4] = {};
  const uint4 zero = make_uint4(0, 0, 0, 0);
  for (int s0 = warp * kU; s0 < steps; s0 += kWarps * kU) {
    uint4 a[kU][2][2], b[kU][2][NT];  // [step][16-byte half][row g, g + 8 | token tile]
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const bool in = s0 + u < steps;
      const int at = (s0 + u) * kStepK;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        a[u][h][0] = in ? *reinterpret_cast<const uint4*>(w_lo + at + 8 * h) : zero;
        a[u][h][1] = in ? *reinterpret_cast<const uint4*>(w_hi + at + 8 * h) : zero;
#pragma unroll
        for (int j = 0; j < NT; ++j)
          b[u][h][j] = in && has[j] ? *reinterpret_cast<const uint4*>(xr[j] + at + 8 * h) : zero;
      }
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint4 lo = a[u][h][0], hi = a[u][h][1];
        const uint32_t first[4] = {lo.x, hi.x, lo.y, hi.y};
        const uint32_t second[4] = {lo.z, hi.z, lo.w, hi.w};
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          Mma<T>(acc[j], first, b[u][h][j].x, b[u][h][j].y);
          Mma<T>(acc[j], second, b[u][h][j].z, b[u][h][j].w);
        }
      }
    }
  }
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) red[warp][j][e][lane] = acc[j][e];
  __syncthreads();
  // acc[j][e] of lane (g, t): weight row r0 + g (+ 8 for e >= 2), token
  // 8j + 2t (+ 1 for odd e).
  for (int idx = threadIdx.x; idx < NT * 4 * 32; idx += blockDim.x) {
    const int ln = idx % 32, e = (idx / 32) % 4, j = idx / 128;
    float v = 0.0f;
#pragma unroll
    for (int wv = 0; wv < kWarps; ++wv) v += red[wv][j][e][ln];
    const int row = r0 + (ln >> 2) + (e >= 2 ? 8 : 0);
    const int tok = j * 8 + 2 * (ln & 3) + (e & 1);
    if (tok < m && row < n) y[static_cast<size_t>(tok) * n + row] = FromF<OutT>(v);
  }
}

template <typename T, typename OutT, int NT>
cudaError_t LaunchTiles(const void* x, const void* w, void* y, int m, int n, int k,
                        cudaStream_t stream) {
  return LaunchKernel(SkinnyMmaKernel<T, OutT, NT>, (n + 15) / 16, kWarps * 32, 0, stream,
                      static_cast<const T*>(x), static_cast<const T*>(w), static_cast<OutT*>(y), m,
                      n, k);
}

template <typename T, typename OutT>
cudaError_t Dispatch(const void* x, const void* w, void* y, int m, int n, int k,
                     cudaStream_t stream) {
  static_assert(kSkinnyMmaGemmMaxM <= 16, "Dispatch instantiates up to 2 token tiles");
  if (m <= 8) return LaunchTiles<T, OutT, 1>(x, w, y, m, n, k, stream);
  return LaunchTiles<T, OutT, 2>(x, w, y, m, n, k, stream);
}

}  // namespace

bool SkinnyMmaGemmSupports(int m, int k) {
  return m >= 1 && m <= kSkinnyMmaGemmMaxM && k > 0 && k % kStepK == 0;
}

cudaError_t LaunchSkinnyMmaGemm(const void* x, const void* w, void* y, int m, int n, int k,
                                ActType type, bool out_f32, cudaStream_t stream) {
  if (!SkinnyMmaGemmSupports(m, k) || n <= 0) return cudaErrorInvalidValue;
  BALLAST_DISPATCH_ACT(type, T, {
    return out_f32 ? Dispatch<T, float>(x, w, y, m, n, k, stream)
                   : Dispatch<T, T>(x, w, y, m, n, k, stream);
  });
  return cudaErrorInvalidValue;
}

}  // namespace ballast::engine::cuda
