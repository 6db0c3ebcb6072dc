// CudaExecutor's KV block copies to and from host memory (session KV
// tiering, engine/kv_tiers.h): on the executor's stream, so they are
// ordered after the steps that wrote the blocks and before the next step
// that reads them, then one synchronization per call.
#include <cuda_runtime.h>

#include "engine/cuda/cuda_executor.h"
#include "engine/cuda/cuda_status.h"

namespace ballast::engine::cuda {

absl::Status CudaExecutor::CopyKvToHost(absl::Span<const KvBlockCopy> copies) {
  BALLAST_CUDA_RETURN(cudaSetDevice(options_.device), "cudaSetDevice");
  for (const KvBlockCopy& c : copies) {
    BALLAST_CUDA_RETURN(cudaMemcpyAsync(c.host, c.block, c.bytes, cudaMemcpyDeviceToHost, stream_),
                        "KV copy to host");
  }
  BALLAST_CUDA_RETURN(cudaStreamSynchronize(stream_), "KV copy to host");
  return absl::OkStatus();
}

absl::Status CudaExecutor::CopyKvFromHost(absl::Span<const KvBlockCopy> copies) {
  BALLAST_CUDA_RETURN(cudaSetDevice(options_.device), "cudaSetDevice");
  for (const KvBlockCopy& c : copies) {
    BALLAST_CUDA_RETURN(cudaMemcpyAsync(c.block, c.host, c.bytes, cudaMemcpyHostToDevice, stream_),
                        "KV copy from host");
  }
  BALLAST_CUDA_RETURN(cudaStreamSynchronize(stream_), "KV copy from host");
  return absl::OkStatus();
}

}  // namespace ballast::engine::cuda
