// Skinny GEMM for decode (M <= 16 rows): y[M][N] = x[M][K] w[N][K]^T with
// the weight streamed once at full memory bandwidth. Each warp owns R
// output columns; its lanes walk K in 16-byte vectors (8 elements), keep
// FP32 partial sums for every row, and reduce with shuffles at the end.
// The x rows (a few KB) stay in L1/L2.
#include "engine/cuda/common.cuh"

namespace ballast::engine::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;

template <typename T, typename OutT, int M, int R>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    SkinnyGemmKernel(const T* __restrict__ x, const T* __restrict__ w, OutT* __restrict__ y, int m,
                     int n, int k) {
  const int lane = threadIdx.x & 31;
  const int n0 = (blockIdx.x * kWarpsPerBlock + (threadIdx.x >> 5)) * R;
  if (n0 >= n) return;
  const T* wr[R];
#pragma unroll
  for (int r = 0; r < R; ++r) wr[r] = w + static_cast<size_t>(min(n0 + r, n - 1)) * k;
  float acc[M][R];
#pragma unroll
  for (int i = 0; i < M; ++i)
#pragma unroll
    for (int r = 0; r < R; ++r) acc[i][r] = 0.0f;
#pragma unroll 2
  for (int k0 = lane * 8; k0 < k; k0 += 32 * 8) {
    float wf[R][8];
#pragma unroll
    for (int r = 0; r < R; ++r) Load8(wr[r] + k0, wf[r]);
#pragma unroll
    for (int i = 0; i < M; ++i) {
      float xf[8];
      Load8(x + static_cast<size_t>(i) * k + k0, xf);
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[i][r] += xf[j] * wf[r][j];
    }
  }
#pragma unroll
  for (int i = 0; i < M; ++i) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const float v = WarpSum(acc[i][r]);
      if (lane == 0 && i < m && n0 + r < n) y[static_cast<size_t>(i) * n + n0 + r] = FromF<OutT>(v);
    }
  }
}

template <typename T, typename OutT, int M, int R>
cudaError_t LaunchM(const void* x, const void* w, void* y, int m, int n, int k, cudaStream_t stream) {
  const int warps = (n + R - 1) / R;
  const int blocks = (warps + kWarpsPerBlock - 1) / kWarpsPerBlock;
  SkinnyGemmKernel<T, OutT, M, R><<<blocks, kWarpsPerBlock * 32, 0, stream>>>(
      static_cast<const T*>(x), static_cast<const T*>(w), static_cast<OutT*>(y), m, n, k);
  return cudaGetLastError();
}

template <typename T, typename OutT>
cudaError_t Dispatch(const void* x, const void* w, void* y, int m, int n, int k, cudaStream_t stream) {
  if (m <= 1) return LaunchM<T, OutT, 1, 4>(x, w, y, m, n, k, stream);
  if (m <= 2) return LaunchM<T, OutT, 2, 4>(x, w, y, m, n, k, stream);
  if (m <= 4) return LaunchM<T, OutT, 4, 4>(x, w, y, m, n, k, stream);
  if (m <= 8) return LaunchM<T, OutT, 8, 4>(x, w, y, m, n, k, stream);
  return LaunchM<T, OutT, 16, 2>(x, w, y, m, n, k, stream);
}

}  // namespace

bool SkinnyGemmSupports(int m, int k) { return m >= 1 && m <= kSkinnyGemmMaxM && k % 8 == 0; }

cudaError_t LaunchSkinnyGemm(const void* x, const void* w, void* y, int m, int n, int k,
                             ActType type, bool out_f32, cudaStream_t stream) {
  if (!SkinnyGemmSupports(m, k)) return cudaErrorInvalidValue;
  BALLAST_DISPATCH_ACT(type, T, {
    return out_f32 ? Dispatch<T, float>(x, w, y, m, n, k, stream)
                   : Dispatch<T, T>(x, w, y, m, n, k, stream);
  });
  return cudaErrorInvalidValue;
}

}  // namespace ballast::engine::cuda
