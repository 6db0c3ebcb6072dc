// FP8 (E4M3) weights: per-row quantization (weights at load, activations
// before each FP8 product) and the skinny decode GEMM over E4M3 weights (one
// scale per output channel) and E4M3 activations (one scale per token).
#include <cuda_fp8.h>

#include "engine/cuda/common.cuh"
#include "engine/cuda/skinny_epilogues.cuh"

namespace ballast::engine::cuda {
namespace {

// One block per row of [rows][cols] (common.cuh's QuantizeRowInBlock;
// engine/weights.cc does the same on the host, the CPU reference).
template <typename S>
__global__ void QuantizeRowsKernel(const S* __restrict__ src, int cols,
                                   __nv_fp8_e4m3* __restrict__ dst, float* __restrict__ scales) {
  __shared__ float scratch[32];
  AllowNextGrid();
  WaitPriorGrid();
  const size_t base = static_cast<size_t>(blockIdx.x) * cols;
  QuantizeRowInBlock(src + base, cols, dst + base, scales + blockIdx.x, scratch);
}

template <typename S>
cudaError_t LaunchQuantize(const void* src, int rows, int cols, void* dst, float* scales,
                           cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  return LaunchKernel(QuantizeRowsKernel<S>, rows, 256, 0, stream, static_cast<const S*>(src), cols,
                      static_cast<__nv_fp8_e4m3*>(dst), scales);
}

using skinny::BlockSumOf;
using skinny::kWarps;
using skinny::StoreWarpSums;
using skinny::WarpSums;
constexpr int kChunk = 32 * 16;  // K elements a warp covers per step (16 bytes of w a lane)

// As gemv_kernels.cu's SkinnyGemmKernel, over E4M3 weights and E4M3
// activations (LaunchQuantizeRowsFp8's output, so the product is cuBLASLt's
// FP8 path up to the order of the FP32 sums): a block owns C output
// columns, its warps split K into interleaved 512-element chunks, each lane
// keeping C 16-byte weight loads in flight (x's rows, a few KB, stay in
// L1/L2). y = sum * x_scale[i] * w_scale[n].
template <typename OutT, int M, int C>
__global__ void __launch_bounds__(kWarps * 32)
    SkinnyFp8Kernel(const __nv_fp8_e4m3* __restrict__ xq, const float* __restrict__ x_scale,
                    const __nv_fp8_e4m3* __restrict__ w, const float* __restrict__ w_scale,
                    OutT* __restrict__ y, int m, int n, int k) {
  __shared__ WarpSums<M, C> red;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int n0 = blockIdx.x * C;
  AllowNextGrid();
  // The weights are no earlier kernel's output: start their stream (each
  // warp's first chunk into L2) while the kernel producing x finishes.
  if (warp * kChunk + lane * 16 < k) {
#pragma unroll
    for (int c = 0; c < C; ++c)
      PrefetchL2(w + static_cast<size_t>(min(n0 + c, n - 1)) * k + warp * kChunk + lane * 16);
  }
  WaitPriorGrid();
  const __nv_fp8_e4m3* wr[C];
#pragma unroll
  for (int c = 0; c < C; ++c) wr[c] = w + static_cast<size_t>(min(n0 + c, n - 1)) * k;
  float acc[M][C];
  skinny::AccumulateK<__nv_fp8_e4m3, M, C>(xq, wr, m, k, acc);
  StoreWarpSums<M, C>(acc, red);
  __syncthreads();
  for (int idx = threadIdx.x; idx < M * C; idx += blockDim.x) {
    const int i = idx / C, c = idx % C;
    const float v = BlockSumOf<M, C>(red, i, c);
    if (i < m && n0 + c < n) {
      y[static_cast<size_t>(i) * n + n0 + c] = FromF<OutT>(v * x_scale[i] * w_scale[n0 + c]);
    }
  }
}

template <typename OutT, int M, int C>
cudaError_t LaunchFp8M(const void* xq, const float* x_scale, const void* w, const float* w_scale,
                       void* y, int m, int n, int k, cudaStream_t stream) {
  return LaunchKernel(SkinnyFp8Kernel<OutT, M, C>, (n + C - 1) / C, kWarps * 32, 0, stream,
                      static_cast<const __nv_fp8_e4m3*>(xq), x_scale,
                      static_cast<const __nv_fp8_e4m3*>(w), w_scale, static_cast<OutT*>(y), m, n,
                      k);
}

static_assert(kSkinnyGemmMaxM <= 8, "DispatchFp8 instantiates up to 8 rows");

template <typename OutT>
cudaError_t DispatchFp8(const void* xq, const float* x_scale, const void* w, const float* w_scale,
                        void* y, int m, int n, int k, cudaStream_t stream) {
  if (m <= 1) return LaunchFp8M<OutT, 1, 8>(xq, x_scale, w, w_scale, y, m, n, k, stream);
  if (m <= 2) return LaunchFp8M<OutT, 2, 8>(xq, x_scale, w, w_scale, y, m, n, k, stream);
  if (m <= 4) return LaunchFp8M<OutT, 4, 8>(xq, x_scale, w, w_scale, y, m, n, k, stream);
  return LaunchFp8M<OutT, 8, 4>(xq, x_scale, w, w_scale, y, m, n, k, stream);
}

}  // namespace

cudaError_t LaunchQuantizeRowsFp8(const void* src, SrcType src_type, int rows, int cols, void* dst,
                                  float* scales, cudaStream_t stream) {
  switch (src_type) {
    case SrcType::kF32:
      return LaunchQuantize<float>(src, rows, cols, dst, scales, stream);
    case SrcType::kBF16:
      return LaunchQuantize<__nv_bfloat16>(src, rows, cols, dst, scales, stream);
    case SrcType::kF16:
      return LaunchQuantize<__half>(src, rows, cols, dst, scales, stream);
  }
  return cudaErrorInvalidValue;
}

bool SkinnyGemmFp8Supports(int m, int k) { return m >= 1 && m <= kSkinnyGemmMaxM && k % 16 == 0; }

cudaError_t LaunchSkinnyGemmFp8(const void* xq, const float* x_scale, const void* w,
                                const float* w_scale, void* y, int m, int n, int k, ActType type,
                                bool out_f32, cudaStream_t stream) {
  if (!SkinnyGemmFp8Supports(m, k)) return cudaErrorInvalidValue;
  if (out_f32) return DispatchFp8<float>(xq, x_scale, w, w_scale, y, m, n, k, stream);
  BALLAST_DISPATCH_ACT(type, T,
                       { return DispatchFp8<T>(xq, x_scale, w, w_scale, y, m, n, k, stream); });
  return cudaErrorInvalidValue;
}

}  // namespace ballast::engine::cuda
