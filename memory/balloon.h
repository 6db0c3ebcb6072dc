// Balloon: one device's memory budget, shared by every resident model's
// weights, KV and workspace (Prism §5). It owns the device's PagePool, whose
// budget is the device memory less the workspace the engines charged, and
// the KV slab arena over that pool. Weights are mapped from the same pool
// (MapWeights), so a page freed by KV can hold another model's weights and
// the reverse, with no static split between them.
//
// Address space outlives the models: a weight range reserved for one model
// is kept when the model leaves and reused (first fit) by the next, so
// activation maps pages into existing address space rather than reserving
// afresh.
//
// Everything here is all or nothing: a MapWeights that cannot get all its
// pages maps none (RESOURCE_EXHAUSTED); the caller reclaims (empty KV slabs
// first, then asks engines to shed KV, see DeviceWorker) and retries. The
// balloon lives in the node process, so no other process races for pages.
//
// Thread-safety: all methods thread-safe. WeightPages may outlive the
// caller's handle to the balloon (they hold it).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "memory/kv_arena.h"
#include "memory/page_pool.h"

namespace ballast::memory {

struct BalloonOptions {
  // Device memory the balloon manages (weights + KV + workspace).
  int64_t memory_bytes = 0;
  // The KV arena's slab size and ready-slab buffer (KvArenaOptions).
  size_t slab_bytes = 2u << 20;
  int free_slab_buffer = 2;
};

struct BalloonStats {
  int64_t memory_bytes = 0;
  int64_t workspace_bytes = 0;         // charged by engines, outside the pool
  int64_t weight_bytes = 0;            // mapped for weights
  int64_t kv_mapped_bytes = 0;         // mapped by the KV arena (slabs, buffer included)
  int64_t free_bytes = 0;              // budget not mapped
  int64_t weight_ranges_reserved = 0;  // address ranges kept for reuse
};

class Balloon;

// One model's weight pages: [data(), data() + bytes()) mapped until this
// object is destroyed, when the pages go back to the balloon.
//
// Parameter remapping (memory/remap_plan.h) lends some of them to KV:
// Lend unmaps the whole pages inside a byte extent (a weight layer) and
// returns them to the balloon's budget; Restore maps them again (their
// contents are lost: the caller copies the layer back from its host copy).
// Pages a lent extent shares with a neighbour stay mapped.
// Thread-compatible: Lend/Restore/lent_bytes from one thread at a time
// (the device's step thread).
class WeightPages {
 public:
  ~WeightPages();
  WeightPages(const WeightPages&) = delete;
  WeightPages& operator=(const WeightPages&) = delete;
  uint8_t* data() const { return addr_; }
  size_t bytes() const { return bytes_; }

  // Unmaps the pages wholly inside [offset, offset + len); returns the
  // bytes given back (0 if none or already lent). OUT_OF_RANGE past bytes().
  absl::StatusOr<int64_t> Lend(size_t offset, size_t len);
  // Maps again the pages Lend(offset, len) gave back; returns the bytes
  // mapped (0 if none were lent). RESOURCE_EXHAUSTED, nothing mapped, when
  // the budget lacks room.
  absl::StatusOr<int64_t> Restore(size_t offset, size_t len);
  // Lends the extents of `lend` and restores those of `restore` as one
  // step (PagePool::Exchange): no other model can take the pages lent here
  // before the restores map theirs. Extents already lent (in `lend`) or not
  // lent (in `restore`) are skipped, as are repeats. Returns the bytes lent
  // less the bytes mapped; RESOURCE_EXHAUSTED, nothing changed, when the
  // budget lacks room; OUT_OF_RANGE for an extent past bytes();
  // INVALID_ARGUMENT for one in both lists; INTERNAL or DATA_LOSS after a
  // driver failure (PagePool::Exchange: the lent extents' contents are
  // lost, and with DATA_LOSS their pages too).
  struct Extent {
    size_t offset = 0;
    size_t len = 0;
  };
  absl::StatusOr<int64_t> Exchange(absl::Span<const Extent> lend, absl::Span<const Extent> restore);
  // Bytes lent now.
  int64_t lent_bytes() const;
  // Bytes Lend(offset, len) would give back (its whole pages).
  int64_t LendableBytes(size_t offset, size_t len) const {
    return static_cast<int64_t>(InnerPages(offset, len).second);
  }

 private:
  friend class Balloon;
  WeightPages(std::shared_ptr<Balloon> owner, uint8_t* addr, size_t bytes, size_t range)
      : owner_(std::move(owner)), addr_(addr), bytes_(bytes), range_(range) {}
  // The page-aligned part of [offset, offset + len): {start, bytes}.
  std::pair<size_t, size_t> InnerPages(size_t offset, size_t len) const;
  std::shared_ptr<Balloon> owner_;
  uint8_t* addr_;
  size_t bytes_;                   // reserved for the weights (a page multiple)
  size_t range_;                   // reserved range this lives in
  std::map<size_t, size_t> lent_;  // unmapped: page-aligned offset -> bytes
};

class Balloon : public std::enable_shared_from_this<Balloon> {
 public:
  static absl::StatusOr<std::shared_ptr<Balloon>> Create(std::shared_ptr<PagePool> pool,
                                                         const BalloonOptions& options);
  ~Balloon();

  const std::shared_ptr<KvArena>& arena() const { return arena_; }
  PagePool* pool() const { return pool_.get(); }
  size_t page_bytes() const { return pool_->page_bytes(); }

  // Maps `bytes` (rounded up to pages) for a model's weights.
  // RESOURCE_EXHAUSTED, with nothing mapped, when the budget lacks room.
  absl::StatusOr<std::unique_ptr<WeightPages>> MapWeights(size_t bytes);
  // Sets what `tenant`'s engine allocated outside the pool (activations,
  // GEMM workspace); 0 forgets it. The pool's budget is memory less the
  // sum. It may drop below what is mapped: KV then stops growing until the
  // engines give blocks back.
  void SetWorkspace(const std::string& tenant, int64_t bytes);
  // Budget not mapped: what a MapWeights can take now.
  int64_t FreeBytes() const;
  // Budget less what is mapped, negative when the budget has dropped below
  // it (SetWorkspace): what must be unmapped before FreeBytes covers more.
  int64_t HeadroomBytes() const;
  BalloonStats stats() const;

 private:
  friend class WeightPages;
  // WeightPages::Exchange's page moves, with the weight accounting.
  absl::Status ExchangeWeightPages(absl::Span<const PageRange> unmap,
                                   absl::Span<const PageRange> map);
  Balloon(std::shared_ptr<PagePool> pool, const BalloonOptions& options)
      : pool_(std::move(pool)), options_(options) {}
  // `lent`: the parts already unmapped (WeightPages::Lend).
  void ReturnWeights(uint8_t* addr, size_t bytes, size_t range,
                     const std::map<size_t, size_t>& lent);
  // REQUIRES: mu_ held.
  void UpdateBudget() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::shared_ptr<PagePool> pool_;
  const BalloonOptions options_;
  std::shared_ptr<KvArena> arena_;
  mutable absl::Mutex mu_;
  std::map<std::string, int64_t> workspace_ ABSL_GUARDED_BY(mu_);
  int64_t weight_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t ranges_ ABSL_GUARDED_BY(mu_) = 0;
  // Reserved, unmapped weight ranges by size: reused by the next model.
  std::multimap<size_t, uint8_t*> free_ranges_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ballast::memory
