// Bulk copies between pinned host memory and device memory, spread over
// several CUDA streams in pieces (transfer/ is the one copy engine for KV
// and weights; the engine's KV block copies, which need its scatter
// kernels, build on the same streams-and-pieces scheme in
// engine/cuda/cuda_kv_copy.cc). Used to activate a model from its pinned
// host image (engine/cuda/device_weights.cc) and to save it back.
//
// Thread-safety: each call creates and destroys its own streams; calls may
// run concurrently. They return once every byte has moved.
#pragma once

#include <cstddef>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace ballast::transfer::cuda {

struct BulkCopyOptions {
  // Streams the pieces rotate over (at least 1). Default 4: on an H100 a
  // pinned 16 GB image moved at ~50 GB/s with 4, ~25 GB/s with 1.
  int streams = 4;
  // Bytes per cudaMemcpyAsync. Default 64 MiB.
  size_t piece_bytes = 64u << 20;
};

// Host (pinned) -> device.
absl::Status CopyToDevice(void* device_dst, const void* host_src, size_t bytes,
                          const BulkCopyOptions& options = {});
// Device -> host (pinned).
absl::Status CopyToHost(void* host_dst, const void* device_src, size_t bytes,
                        const BulkCopyOptions& options = {});

// Scattered ranges (an image held in host chunks, engine/host_arena.h):
// each range is copied in pieces of at most options.piece_bytes, the
// pieces of all ranges rotating over the streams.
struct CopyRange {
  void* dst = nullptr;
  const void* src = nullptr;
  size_t bytes = 0;
};
absl::Status CopyRangesToDevice(absl::Span<const CopyRange> ranges,
                                const BulkCopyOptions& options = {});
absl::Status CopyRangesToHost(absl::Span<const CopyRange> ranges,
                              const BulkCopyOptions& options = {});

}  // namespace ballast::transfer::cuda
