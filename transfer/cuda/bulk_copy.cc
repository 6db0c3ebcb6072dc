#include "transfer/cuda/bulk_copy.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"

namespace ballast::transfer::cuda {
namespace {

absl::Status Copy(absl::Span<const CopyRange> ranges, cudaMemcpyKind kind,
                  const BulkCopyOptions& o) {
  const char* what = kind == cudaMemcpyHostToDevice ? "copy to device" : "copy to host";
  std::vector<cudaStream_t> streams(std::max(1, o.streams), nullptr);
  const size_t piece = std::max<size_t>(o.piece_bytes, 1);
  absl::Status st;
  for (auto& s : streams) {
    if (cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking); e != cudaSuccess) {
      st = absl::InternalError(absl::StrCat(what, ": stream: ", cudaGetErrorString(e)));
      s = nullptr;
      break;
    }
  }
  size_t i = 0;
  for (const CopyRange& r : ranges) {
    auto* d = static_cast<unsigned char*>(r.dst);
    const auto* s = static_cast<const unsigned char*>(r.src);
    for (size_t off = 0; st.ok() && off < r.bytes; off += piece, ++i) {
      const size_t n = std::min(piece, r.bytes - off);
      if (cudaError_t e = cudaMemcpyAsync(d + off, s + off, n, kind, streams[i % streams.size()]);
          e != cudaSuccess) {
        st = absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(e)));
      }
    }
  }
  for (cudaStream_t stream : streams) {  // wait for every piece queued, even after an error
    if (!stream) continue;
    if (cudaError_t e = cudaStreamSynchronize(stream); e != cudaSuccess && st.ok()) {
      st = absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(e)));
    }
    cudaStreamDestroy(stream);
  }
  return st;
}

}  // namespace

absl::Status CopyToDevice(void* device_dst, const void* host_src, size_t bytes,
                          const BulkCopyOptions& options) {
  const CopyRange r{device_dst, host_src, bytes};
  return Copy({&r, 1}, cudaMemcpyHostToDevice, options);
}

absl::Status CopyToHost(void* host_dst, const void* device_src, size_t bytes,
                        const BulkCopyOptions& options) {
  const CopyRange r{host_dst, device_src, bytes};
  return Copy({&r, 1}, cudaMemcpyDeviceToHost, options);
}

absl::Status CopyRangesToDevice(absl::Span<const CopyRange> ranges,
                                const BulkCopyOptions& options) {
  return Copy(ranges, cudaMemcpyHostToDevice, options);
}

absl::Status CopyRangesToHost(absl::Span<const CopyRange> ranges, const BulkCopyOptions& options) {
  return Copy(ranges, cudaMemcpyDeviceToHost, options);
}

}  // namespace ballast::transfer::cuda
