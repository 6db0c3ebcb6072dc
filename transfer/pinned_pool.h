// PinnedBufferPool: page-aligned host buffers for KV chunk payloads,
// pinned for DMA and recycled by size. Pinning (cudaHostRegister) costs
// far more than copying the bytes (a turn's export of a few tens of MiB
// stalled a GPU's step thread for hundreds of ms), so it never happens on
// the caller's thread: a new buffer is handed out unpinned (copies into it
// still work, through the driver's staging) and a background thread pins
// it; a chunk read from SSD, received from a peer or exported at the end of
// a turn usually takes a buffer a dropped chunk gave back, already pinned.
// A chunk's payload goes back to the pool when the chunk is destroyed (on
// any thread); idle buffers beyond `max_idle_bytes` are unpinned and freed.
//
// Thread-safety: thread-safe. Chunks may outlive the pool (their buffers
// are then freed).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "transfer/kv_chunk.h"

namespace ballast::transfer {

struct PinnedPoolStats {
  int64_t reused = 0;      // chunks given an idle buffer
  int64_t allocated = 0;   // chunks given a new buffer
  int64_t pinned = 0;      // buffers pinned by the background thread
  int64_t idle_bytes = 0;  // held for reuse now
};

class PinnedBufferPool : public std::enable_shared_from_this<PinnedBufferPool> {
 public:
  // Pins `bytes` at `data`, returning the handle that unpins (null: not
  // pinned; the buffer is still recycled).
  using PinFn = std::function<std::shared_ptr<void>(void* data, size_t bytes)>;
  // `pin` may be null (nothing pinned, as on CPU nodes; no thread).
  static std::shared_ptr<PinnedBufferPool> Create(PinFn pin, size_t max_idle_bytes);
  ~PinnedBufferPool();  // stops the pinning thread, frees the idle buffers
  PinnedBufferPool(const PinnedBufferPool&) = delete;
  PinnedBufferPool& operator=(const PinnedBufferPool&) = delete;

  // A chunk with room for `meta`'s payload (checksum unset), from an idle
  // buffer of the same size when there is one. Never pins on this thread.
  std::unique_ptr<KvChunk> NewChunk(const KvChunkMeta& meta);
  // Returns once every buffer handed out so far is pinned (tests).
  void WaitPinned();
  PinnedPoolStats stats() const;

 private:
  // One buffer, shared by the chunk using it, the idle list and the
  // pinning thread. Destruction unpins, then frees.
  struct Buffer {
    Buffer(uint8_t* d, size_t n) : data(d), bytes(n) {}
    ~Buffer();
    uint8_t* const data;
    const size_t bytes;
    absl::Mutex mu;
    std::shared_ptr<void> pin ABSL_GUARDED_BY(mu);
  };
  PinnedBufferPool(PinFn pin, size_t max_idle_bytes);
  void Return(std::shared_ptr<Buffer> b);
  void PinLoop();

  const PinFn pin_;
  const size_t max_idle_bytes_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<size_t, std::vector<std::shared_ptr<Buffer>>> idle_
      ABSL_GUARDED_BY(mu_);                                        // by size
  std::deque<std::weak_ptr<Buffer>> to_pin_ ABSL_GUARDED_BY(mu_);  // new buffers
  bool pinning_ ABSL_GUARDED_BY(mu_) = false;                      // the thread is pinning one now
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  PinnedPoolStats stats_ ABSL_GUARDED_BY(mu_);
  std::thread pinner_;  // started by Create when pin_ is set
};

}  // namespace ballast::transfer
