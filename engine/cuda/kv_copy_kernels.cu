// Scatter/gather of KV blocks to and from one contiguous staging buffer:
// the host side then moves a chunk with one large DMA instead of one
// cudaMemcpy per block (engine/cuda/cuda_kv_copy.cc).
#include "engine/cuda/kernels.h"

namespace ballast::engine::cuda {
namespace {

template <bool kGather>
__global__ void BlockCopyKernel(unsigned char* __restrict__ staging,
                                const BlockSpan* __restrict__ spans) {
  const BlockSpan s = spans[blockIdx.x];
  unsigned char* src = kGather ? s.block : staging + s.offset;
  unsigned char* dst = kGather ? staging + s.offset : s.block;
  const bool aligned = ((reinterpret_cast<size_t>(src) | reinterpret_cast<size_t>(dst) |
                         static_cast<size_t>(s.bytes)) &
                        15) == 0;
  if (aligned) {
    const uint4* in = reinterpret_cast<const uint4*>(src);
    uint4* out = reinterpret_cast<uint4*>(dst);
    for (size_t i = threadIdx.x; i < s.bytes / 16; i += blockDim.x) out[i] = in[i];
  } else {
    for (size_t i = threadIdx.x; i < s.bytes; i += blockDim.x) dst[i] = src[i];
  }
}

__global__ void BlockMoveKernel(const BlockMove* __restrict__ moves) {
  const BlockMove m = moves[blockIdx.x];
  const bool aligned = ((reinterpret_cast<size_t>(m.from) | reinterpret_cast<size_t>(m.to) |
                         static_cast<size_t>(m.bytes)) &
                        15) == 0;
  if (aligned) {
    const uint4* in = reinterpret_cast<const uint4*>(m.from);
    uint4* out = reinterpret_cast<uint4*>(m.to);
    for (size_t i = threadIdx.x; i < m.bytes / 16; i += blockDim.x) out[i] = in[i];
  } else {
    for (size_t i = threadIdx.x; i < m.bytes; i += blockDim.x) m.to[i] = m.from[i];
  }
}

}  // namespace

cudaError_t LaunchBlockMove(const BlockMove* moves, int n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  BlockMoveKernel<<<n, 256, 0, stream>>>(moves);
  return cudaGetLastError();
}

cudaError_t LaunchBlockCopy(unsigned char* staging, const BlockSpan* spans, int n, bool gather,
                            cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  if (gather) {
    BlockCopyKernel<true><<<n, 256, 0, stream>>>(staging, spans);
  } else {
    BlockCopyKernel<false><<<n, 256, 0, stream>>>(staging, spans);
  }
  return cudaGetLastError();
}

}  // namespace ballast::engine::cuda
