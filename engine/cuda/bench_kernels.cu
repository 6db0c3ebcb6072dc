#include "engine/cuda/bench_kernels.h"

namespace ballast::engine::cuda {
namespace {

constexpr int kThreads = 512;
constexpr int kUnroll = 4;

__global__ void ReadAllKernel(const uint4* __restrict__ in, size_t n16, uint32_t* out) {
  const size_t stride = static_cast<size_t>(gridDim.x) * kThreads;
  uint32_t acc = 0;
  size_t i = static_cast<size_t>(blockIdx.x) * kThreads + threadIdx.x;
  for (; i + (kUnroll - 1) * stride < n16; i += kUnroll * stride) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = __ldcs(in + i + u * stride);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < n16; i += stride) {
    const uint4 v = __ldcs(in + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  __shared__ uint32_t warp_acc[kThreads / 32];
  for (int o = 16; o > 0; o /= 2) acc ^= __shfl_xor_sync(0xffffffffu, acc, o);
  if (threadIdx.x % 32 == 0) warp_acc[threadIdx.x / 32] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    uint32_t a = 0;
    for (int w = 0; w < kThreads / 32; ++w) a ^= warp_acc[w];
    out[blockIdx.x] = a;
  }
}

}  // namespace

cudaError_t LaunchReadAll(const uint4* in, size_t n16, uint32_t* out, int blocks,
                          cudaStream_t stream) {
  ReadAllKernel<<<blocks, kThreads, 0, stream>>>(in, n16, out);
  return cudaGetLastError();
}

}  // namespace ballast::engine::cuda
