// HostArena: host memory set aside once, when a node starts, and lent in
// fixed-size chunks to models' host weight copies (engine::HostWeights).
//
// Why: pinning host memory for DMA (cudaHostAlloc) takes seconds for
// gigabytes and holds up the process's other CUDA calls meanwhile. On an
// H100 the first eviction of an 8B model pinned 16 GB in 6-8 s; every
// model on the node stalled, heartbeats were missed and the scheduler
// marked the node dead (docs/benchmarks.md, "The same factorial on an
// H100"). A node therefore pins its whole host-copy budget before it
// serves and never pins again.
//
// An image is a list of chunks, not one range, so the arena never
// fragments: any free chunks will do (only the last chunk of an image is
// partly used). HostChunks::ForEachPiece splits a byte range of an image
// into the chunks' pieces, for copies.
//
// Memory comes from a HostSlabSource: the CUDA backend's pinned slabs
// (engine/gpu_backend.h, CreatePinnedHostArena), plain heap memory in
// tests.
//
// Thread-safety: HostArena is thread-safe. It must outlive the chunks it
// lent; holders keep a shared_ptr to it. HostChunks is a plain value.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace ballast::engine {

// An image's bytes: chunk i holds bytes [i * chunk_bytes, (i + 1) *
// chunk_bytes) of it. `bytes` is the image's size (<= chunks * chunk_bytes).
struct HostChunks {
  std::vector<uint8_t*> chunks;
  size_t chunk_bytes = 0;
  size_t bytes = 0;

  // Calls fn(uint8_t* host, size_t image_offset, size_t n) for each piece
  // of [offset, offset + n) that lies in one chunk, in order. The range
  // must lie within the image.
  template <typename Fn>
  void ForEachPiece(size_t offset, size_t n, Fn&& fn) const {
    const size_t end = offset + n;
    while (offset < end) {
      const size_t in_chunk = offset % chunk_bytes;
      const size_t len = std::min(end - offset, chunk_bytes - in_chunk);
      fn(chunks[offset / chunk_bytes] + in_chunk, offset, len);
      offset += len;
    }
  }
};

// Where an arena's memory comes from: `allocate` returns `bytes` of host
// memory or an error; `release` gives back what allocate returned.
struct HostSlabSource {
  std::function<absl::StatusOr<void*>(size_t bytes)> allocate;
  std::function<void(void*)> release;
};

struct HostArenaOptions {
  // Bytes lent at most; rounded down to whole chunks. Must hold one chunk.
  int64_t bytes = 0;
  // Size of each chunk. Default 64 MiB (the copy engine's piece size, so
  // a bulk copy's pieces are whole chunks).
  size_t chunk_bytes = 64u << 20;
  // Memory is allocated in slabs of this many bytes (a multiple of
  // chunk_bytes; the last slab may be smaller). Default 1 GiB: large
  // allocations pin fastest, small ones fail more gracefully.
  size_t slab_bytes = 1u << 30;
};

class HostArena {
 public:
  // Allocates all of the arena's memory now. An allocation failure frees
  // what was allocated and returns its status.
  static absl::StatusOr<std::shared_ptr<HostArena>> Create(const HostArenaOptions& options,
                                                           HostSlabSource source);
  ~HostArena();
  HostArena(const HostArena&) = delete;
  HostArena& operator=(const HostArena&) = delete;

  // Chunks for an image of `bytes` (at least 1), or RESOURCE_EXHAUSTED
  // when fewer are free. Give them back with Give.
  absl::StatusOr<HostChunks> Take(size_t bytes);
  void Give(const HostChunks& image);

  size_t chunk_bytes() const { return chunk_bytes_; }
  int64_t capacity_bytes() const { return capacity_; }
  int64_t free_bytes() const;

 private:
  HostArena(size_t chunk_bytes, HostSlabSource source)
      : chunk_bytes_(chunk_bytes), source_(std::move(source)) {}

  const size_t chunk_bytes_;
  const HostSlabSource source_;
  int64_t capacity_ = 0;
  std::vector<void*> slabs_;  // set in Create, released in the destructor
  mutable absl::Mutex mu_;
  std::vector<uint8_t*> free_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ballast::engine
