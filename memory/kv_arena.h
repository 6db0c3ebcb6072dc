// KvArena: one reserved virtual range per device for the KV blocks of all
// resident models (FineServe §5 KV slab, over Prism §5-style elastic pages).
//
// The range is cut into equal slabs of `slab_bytes` (a multiple of the page
// size). A slab is UNMAPPED (no memory), EMPTY (mapped, unformatted, kept in
// a small buffer for reuse) or FORMATTED to exactly one block size, with a
// free list of its blocks (PARTIAL or FULL). Allocation takes blocks from
// the fullest PARTIAL slab of the size first, then formats an EMPTY slab,
// and only then maps ("carves") a new slab — the only driver call, one per
// slab, never per block. A slab whose last block is freed becomes EMPTY;
// EMPTY slabs beyond `free_slab_buffer` are unmapped at once, and
// ReclaimFreeSlabs() unmaps them all, returning their pages to the pool's
// budget where another model's weights can use them.
//
// Block ids: slab * kMaxBlocksPerSlab + index; address = base + slab *
// slab_bytes + index * block_bytes (O(1), no lookup). A block is contiguous,
// so kernels read it sequentially.
//
// Allocation is all or nothing: a failed request frees what it took and
// unmaps the slabs it carved. Freeing is checked in every build: each
// formatted slab records which tenant holds each block, so a double free, a
// free of a block never handed out, or one held by another tenant's
// allocator is refused with a status and frees nothing of that call (a bad
// free can therefore never corrupt a slab's use count or release a slab that
// still holds live blocks). Thread-safety: all methods thread-safe.
#pragma once

#include <array>
#include <atomic>
#include <limits>
#include <memory>
#include <set>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "memory/block_allocator.h"
#include "memory/page_pool.h"

namespace ballast::memory {

struct KvArenaOptions {
  // Slab size; a multiple of the pool's page size. Default 2 MiB. See
  // ChooseSlabBytes for the tail-waste rule.
  size_t slab_bytes = 2u << 20;
  // Virtual address space reserved for KV; bounds the slab count. Default
  // 64 GiB (reservation costs no memory).
  size_t reserve_bytes = 64ull << 30;
  // EMPTY slabs kept mapped for reuse before unmapping. Default 2.
  int free_slab_buffer = 2;
};

// One resident model's share of the arena (the KV side of the balloon).
// A tenant never holds more than limit_bytes of blocks; slabs are not carved
// for one tenant when that would leave the unmapped budget short of what
// other tenants still lack to reach their floors. Both move at runtime
// (KvArena::SetLimits). Defaults: no floor, no limit.
struct TenantLimits {
  int64_t floor_bytes = 0;
  int64_t limit_bytes = std::numeric_limits<int64_t>::max();
};

struct KvArenaStats {
  int64_t slabs_mapped = 0, slabs_empty = 0, slabs_formatted = 0;
  int64_t blocks_used = 0;
  int64_t blocks_free_formatted = 0;  // free blocks inside formatted slabs
  int64_t bytes_used = 0;             // bytes of allocated blocks
  int64_t bytes_free = 0;             // room left: formatted free + empty slabs + unmapped budget
  int64_t carves = 0;                 // slabs mapped over the arena's life
  int64_t releases = 0;               // slabs unmapped
};

// Smallest multiple of `page_bytes` (up to max_slab_bytes) whose tail waste
// for every block size is under 3%: the LCM of the block sizes when that is
// a page multiple within the cap (zero waste), else the first multiple that
// meets the bound, else max_slab_bytes.
size_t ChooseSlabBytes(const std::vector<size_t>& block_sizes, size_t page_bytes,
                       size_t max_slab_bytes);

class KvArena {
 public:
  static constexpr int64_t kMaxBlocksPerSlab = 1 << 16;
  static constexpr int kMaxBlockSizes = 64;  // distinct block sizes per arena

  // The arena keeps `pool` alive.
  static absl::StatusOr<std::unique_ptr<KvArena>> Create(std::shared_ptr<PagePool> pool,
                                                         const KvArenaOptions& options);
  ~KvArena();

  // A BlockAllocator for blocks of `block_bytes` (>= 64, <= slab_bytes);
  // one per resident model. Free its blocks before dropping it; the arena
  // must outlive it (engines hold the arena by shared_ptr).
  absl::StatusOr<std::unique_ptr<BlockAllocator>> CreateAllocator(size_t block_bytes,
                                                                  TenantLimits limits = {});
  // Changes the floor and limit of the tenant behind `allocator` (one this
  // arena created). A limit below what the tenant holds stops its growth;
  // nothing is taken away (the engine preempts to shrink).
  absl::Status SetLimits(const BlockAllocator* allocator, TenantLimits limits);
  // Unmaps every EMPTY slab; returns the bytes given back.
  int64_t ReclaimFreeSlabs();
  // Maps slabs ahead of need until free_slab_buffer EMPTY slabs are ready
  // (within the budget and the tenants' floors), so the next slab an
  // allocation needs costs no driver call. Device workers call it while
  // idle. Returns the slabs mapped.
  int Replenish();
  KvArenaStats stats() const;
  // Every FORMATTED slab's blocks in use, by slab, ascending: what must be
  // freed for each to give its pages back (PlanSlabShedding).
  std::vector<SlabBlocks> SlabsInUse() const;

  // Compaction: room for weights by moving KV blocks instead of dropping
  // them (kv_arena_compact.cc). Freed blocks give a slab back only once
  // every block in it is free, so many growing sequences leave many slabs
  // part-used; where the free blocks of the other slabs of a size can hold
  // a slab's blocks, moving them empties it with nothing shed.
  //
  // BeginDrain marks up to `slabs` formatted slabs DRAINING and returns
  // them, ascending: the ones with the fewest bytes in use first, of each
  // block size only as many as the free blocks of its other slabs can
  // take (so the moves fit without mapping anything). No allocation takes
  // a block from a draining slab. Each tenant then moves its blocks out:
  // BlockAllocator::AllocateForMove for new homes, a copy, and Free of the
  // old blocks (the last one empties the slab, which joins the EMPTY
  // buffer; ReclaimFreeSlabs unmaps it). EndDrain lifts the mark from the
  // slabs still formatted (a tenant that could not move its blocks).
  // Slabs in `exclude` (ascending) are not picked: the caller's earlier
  // drains left them part-used (blocks that could not move), and moving
  // the rest of their blocks would free nothing.
  // REQUIRES: one drain at a time (the device worker's step thread).
  std::vector<int64_t> BeginDrain(int64_t slabs, const std::vector<int64_t>& exclude = {});
  void EndDrain();
  // The slabs draining now (not yet emptied), ascending.
  std::vector<int64_t> draining() const;
  size_t slab_bytes() const { return options_.slab_bytes; }
  PagePool* pool() const { return pool_.get(); }

 private:
  class View;
  struct Slab {
    enum class State { kUnmapped, kEmpty, kFormatted } state = State::kUnmapped;
    int cls = -1;
    int used = 0;
    std::vector<uint16_t> free;  // free block indexes (formatted slabs)
    // Formatted slabs: the tenant holding each block, kNoOwner when free.
    std::vector<int32_t> owner;
    bool draining = false;  // BeginDrain: out of its class's partial set
  };
  static constexpr int32_t kNoOwner = -1;
  static constexpr int32_t kBeingFreed = -2;  // marks a block while Free validates
  struct Class {
    size_t block_bytes = 0;
    int blocks_per_slab = 0;
    int64_t used = 0;
    int64_t formatted = 0;                  // slabs formatted to this size
    std::set<std::pair<int, int>> partial;  // (-used, slab): fullest first
    // Free blocks inside this class's formatted slabs; O(1).
    int64_t free_formatted() const { return formatted * blocks_per_slab - used; }
    int views = 0;
  };

  struct Tenant {
    TenantLimits limits;
    int64_t used_bytes = 0;
    bool alive = true;
    int64_t growth_bytes = 0;  // its running sequences' next growth (set_growth_reserve)
  };

  KvArena(std::shared_ptr<PagePool> pool, const KvArenaOptions& o, uint8_t* base);
  absl::StatusOr<std::vector<BlockId>> Allocate(int cls, int tenant, int n);
  // For blocks moving out of draining slabs: `n` blocks from the class's
  // partial slabs only (never carving, never a draining slab), past the
  // tenant's limit (the old blocks are freed right after). All or nothing.
  absl::StatusOr<std::vector<BlockId>> AllocateForMove(int cls, int tenant, int n);
  // Takes one free block of `slab` (in c's partial set) for `tenant`.
  // REQUIRES: mu_ held.
  BlockId TakeBlock(Class& c, int slab, int tenant) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Free(int cls, int tenant, absl::Span<const BlockId> ids);
  // Why `id` cannot be freed by (cls, tenant), or OK. REQUIRES: mu_ held.
  absl::Status CheckFree(int cls, int tenant, BlockId id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint8_t* Address(int cls, BlockId id) const;
  int64_t Capacity(int cls, int tenant, bool max) const;
  // The growth_bytes of every other live tenant.
  int64_t GrowthOfOthers(int tenant) const ABSL_LOCKS_EXCLUDED(mu_);
  void SetGrowth(int tenant, int64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);
  // Bytes other live tenants still lack to reach their floors.
  // REQUIRES: mu_ held.
  int64_t ReservedForOthers(int tenant) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // REQUIRES: mu_ held.
  absl::StatusOr<int> TakeSlab(int cls, int tenant, std::vector<int>* carved)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleaseSlab(int slab, bool keep_in_buffer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FreeOne(int cls, BlockId id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::shared_ptr<PagePool> pool_;
  const KvArenaOptions options_;
  uint8_t* const base_;
  mutable absl::Mutex mu_;
  std::vector<Slab> slabs_ ABSL_GUARDED_BY(mu_);
  std::vector<Class> classes_ ABSL_GUARDED_BY(mu_);
  std::vector<Tenant> tenants_ ABSL_GUARDED_BY(mu_);  // one per allocator created
  std::vector<int> empty_ ABSL_GUARDED_BY(mu_);       // EMPTY slabs (buffer)
  std::vector<int> unmapped_ ABSL_GUARDED_BY(mu_);    // UNMAPPED slabs, next carve at back
  std::vector<int> draining_ ABSL_GUARDED_BY(mu_);    // BeginDrain's slabs
  KvArenaStats stats_ ABSL_GUARDED_BY(mu_);
  // Block size per class, readable without the lock (Address is hot).
  std::array<std::atomic<size_t>, kMaxBlockSizes> block_bytes_of_{};
};

}  // namespace ballast::memory
