// CudaExecutor's KV block copies to and from host memory (session KV
// tiering, engine/kv_tiers.h). A chunk's blocks are scattered over the KV
// arena but contiguous in the host chunk, so each piece of up to
// kStagingBytes moves with one DMA between the host and a device staging
// buffer, and one kernel scatters it into (or gathers it from) the blocks
// (LaunchBlockCopy). Everything runs on the executor's stream, ordered
// after the steps that wrote the blocks and before the next step that reads
// them. Pieces alternate between two staging buffers, so the host fills
// one piece's spans while the device copies the other; the call returns
// once every copy is done.
#include <cuda_runtime.h>

#include "absl/strings/str_cat.h"
#include "engine/cuda/cuda_executor.h"
#include "engine/cuda/cuda_status.h"

namespace ballast::engine::cuda {
namespace {
constexpr size_t kStagingBytes = 16u << 20;
constexpr int kMaxSpans = 4096;
}  // namespace

absl::Status CudaExecutor::InitKvStaging() {
  for (int b = 0; b < 2; ++b) {
    if (auto s = kv_staging_[b].Allocate(kStagingBytes, "KV staging"); !s.ok()) return s;
    if (auto s = kv_spans_[b].Allocate(kMaxSpans * sizeof(BlockSpan), "KV spans"); !s.ok()) {
      return s;
    }
    BALLAST_CUDA_RETURN(cudaMallocHost(&host_spans_[b], kMaxSpans * sizeof(BlockSpan)),
                        "pinned KV spans");
    BALLAST_CUDA_RETURN(cudaEventCreateWithFlags(&kv_done_[b], cudaEventDisableTiming), "event");
    workspace_bytes_ += static_cast<int64_t>(kv_staging_[b].bytes() + kv_spans_[b].bytes());
  }
  return absl::OkStatus();
}

absl::Status CudaExecutor::StagedKvCopy(absl::Span<const KvBlockCopy> copies, bool to_host) {
  BALLAST_CUDA_RETURN(cudaSetDevice(options_.device), "cudaSetDevice");
  const char* what = to_host ? "KV copy to host" : "KV copy from host";
  size_t i = 0;
  int buf = 0;  // alternates between the two staging buffers
  while (i < copies.size()) {
    const KvBlockCopy& first = copies[i];
    if (first.bytes > kStagingBytes) {  // larger than the staging: copy it alone
      BALLAST_CUDA_RETURN(to_host ? cudaMemcpyAsync(first.host, first.block, first.bytes,
                                                    cudaMemcpyDeviceToHost, stream_)
                                  : cudaMemcpyAsync(first.block, first.host, first.bytes,
                                                    cudaMemcpyHostToDevice, stream_),
                          what);
      ++i;
      continue;
    }
    // This buffer's previous piece must be done before its spans change.
    BALLAST_CUDA_RETURN(cudaEventSynchronize(kv_done_[buf]), what);
    BlockSpan* host_spans = host_spans_[buf];
    // One piece: copies whose host bytes follow each other.
    size_t total = 0;
    int n = 0;
    while (i + n < copies.size() && n < kMaxSpans) {
      const KvBlockCopy& c = copies[i + n];
      if (c.host != first.host + total || total + c.bytes > kStagingBytes) break;
      host_spans[n] = {c.block, total, c.bytes};
      total += c.bytes;
      ++n;
    }
    auto* spans = kv_spans_[buf].get<BlockSpan>();
    auto* staging = kv_staging_[buf].get<unsigned char>();
    BALLAST_CUDA_RETURN(
        cudaMemcpyAsync(spans, host_spans, n * sizeof(BlockSpan), cudaMemcpyHostToDevice, stream_),
        what);
    if (to_host) {
      BALLAST_CUDA_RETURN(LaunchBlockCopy(staging, spans, n, /*gather=*/true, stream_), what);
      BALLAST_CUDA_RETURN(
          cudaMemcpyAsync(first.host, staging, total, cudaMemcpyDeviceToHost, stream_), what);
    } else {
      BALLAST_CUDA_RETURN(
          cudaMemcpyAsync(staging, first.host, total, cudaMemcpyHostToDevice, stream_), what);
      BALLAST_CUDA_RETURN(LaunchBlockCopy(staging, spans, n, /*gather=*/false, stream_), what);
    }
    BALLAST_CUDA_RETURN(cudaEventRecord(kv_done_[buf], stream_), what);
    buf ^= 1;
    i += n;
  }
  BALLAST_CUDA_RETURN(cudaStreamSynchronize(stream_), what);
  return absl::OkStatus();
}

absl::Status CudaExecutor::CopyKvToHost(absl::Span<const KvBlockCopy> copies) {
  return StagedKvCopy(copies, /*to_host=*/true);
}

absl::Status CudaExecutor::CopyKvFromHost(absl::Span<const KvBlockCopy> copies) {
  return StagedKvCopy(copies, /*to_host=*/false);
}

}  // namespace ballast::engine::cuda
