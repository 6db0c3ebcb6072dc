// PinnedBufferPool: page-aligned host buffers for KV chunk payloads,
// pinned once for DMA and recycled by size. Pinning (cudaHostRegister)
// costs several times what copying the bytes does, so a chunk read from
// SSD, or exported at the end of a turn, takes a buffer that a dropped
// chunk gave back instead of pinning fresh memory. A chunk's payload goes
// back to the pool when the chunk is destroyed (on any thread); idle
// buffers beyond `max_idle_bytes` are unpinned and freed.
//
// Thread-safety: thread-safe. Chunks may outlive the pool (their buffers
// are then freed).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "transfer/kv_chunk.h"

namespace ballast::transfer {

struct PinnedPoolStats {
  int64_t reused = 0;      // chunks given an idle buffer
  int64_t allocated = 0;   // chunks given a new (newly pinned) buffer
  int64_t idle_bytes = 0;  // held for reuse now
};

class PinnedBufferPool : public std::enable_shared_from_this<PinnedBufferPool> {
 public:
  // Pins `bytes` at `data`, returning the handle that unpins (null: not
  // pinned; the buffer is still recycled).
  using PinFn = std::function<std::shared_ptr<void>(void* data, size_t bytes)>;
  // `pin` may be null (buffers recycled unpinned, as on CPU nodes).
  static std::shared_ptr<PinnedBufferPool> Create(PinFn pin, size_t max_idle_bytes);
  ~PinnedBufferPool();  // frees the idle buffers
  PinnedBufferPool(const PinnedBufferPool&) = delete;
  PinnedBufferPool& operator=(const PinnedBufferPool&) = delete;

  // A chunk with room for `meta`'s payload (checksum unset), from an idle
  // buffer of the same size when there is one.
  std::unique_ptr<KvChunk> NewChunk(const KvChunkMeta& meta);
  PinnedPoolStats stats() const;

 private:
  struct Buffer {
    uint8_t* data = nullptr;
    size_t bytes = 0;
    std::shared_ptr<void> pin;
  };
  PinnedBufferPool(PinFn pin, size_t max_idle_bytes);
  void Return(Buffer b);

  const PinFn pin_;
  const size_t max_idle_bytes_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<size_t, std::vector<Buffer>> idle_ ABSL_GUARDED_BY(mu_);  // by size
  PinnedPoolStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ballast::transfer
