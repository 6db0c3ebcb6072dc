// BlockAllocator: the small interface through which engines get KV cache
// blocks. A block is an opaque, fixed-size, contiguous byte range holding one
// layer's K and V for a fixed number of tokens; the engine keeps the block
// tables (which blocks belong to which sequence), the allocator only the
// free/used state and the block -> address map.
//
// Implementations: HostBlockPool (a fixed pool over one buffer: host memory
// for the CPU backend, device memory for the CUDA backend's static mode) and
// the views of the elastic memory layer's slab arena (KvArena).
//
// Thread-safety: implementations are thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace ballast::memory {

using BlockId = int32_t;

// The block -> address rule as data, for device kernels that cannot call
// Address(): address(id) = base + (id >> slab_shift) * slab_bytes +
// (id & ((1 << slab_shift) - 1)) * block_bytes.
struct BlockAddressing {
  uint8_t* base = nullptr;
  int slab_shift = 31;
  size_t slab_bytes = 0;
  size_t block_bytes = 0;
};

// Blocks in one slab (slab = id >> BlockAddressing::slab_shift): a holder's,
// or all in use (KvArena::SlabsInUse).
struct SlabBlocks {
  int64_t slab = 0;
  int64_t blocks = 0;
};

// Counts `ids` by slab, adding to `out`, which stays one entry per slab,
// sorted by slab.
void CountSlabBlocks(absl::Span<const BlockId> ids, int slab_shift, std::vector<SlabBlocks>* out);

class BlockAllocator {
 public:
  virtual ~BlockAllocator() = default;

  // Allocates `n` blocks, all or nothing: on failure nothing is allocated
  // and the status is RESOURCE_EXHAUSTED.
  virtual absl::StatusOr<std::vector<BlockId>> Allocate(int n) = 0;
  // Returns blocks to the allocator, all or nothing, checked in every build
  // type: the whole span is validated before anything is freed, and on error
  // nothing of the call is freed and the message names the offending block.
  // FAILED_PRECONDITION: a block that is free (freed already, or listed
  // twice in the span). INVALID_ARGUMENT: a block this allocator cannot hold
  // right now (out of range, never handed out where the allocator cannot
  // tell it from garbage, or held through another allocator: another
  // tenant's view of the same arena). Either is a caller bug.
  virtual absl::Status Free(absl::Span<const BlockId> blocks) = 0;
  // New homes for `n` blocks moving out of slabs the arena is draining
  // (KvArena::BeginDrain): taken only from formatted slabs not draining,
  // never mapping memory, and allowed past the tenant's limit since the
  // caller frees the old blocks once their bytes are copied. All or
  // nothing: RESOURCE_EXHAUSTED when those slabs lack room. The default
  // (a pool with no slabs to drain) is UNIMPLEMENTED.
  virtual absl::StatusOr<std::vector<BlockId>> AllocateForMove(int n) {
    return absl::UnimplementedError("this block pool has no slabs to drain");
  }
  // Address of a block's first byte; O(1). Valid until the block is freed.
  virtual uint8_t* Address(BlockId id) = 0;

  virtual size_t block_bytes() const = 0;
  // Agrees with Address() for every live block.
  virtual BlockAddressing addressing() const = 0;
  virtual int64_t num_total() const = 0;
  virtual int64_t num_free() const = 0;
  // Most blocks this allocator could ever hold (the whole pool, were every
  // other user's memory free). A request needing more can never run.
  virtual int64_t num_max() const { return num_total(); }
  // The admission watermark on a pool shared by several users (the KV
  // arena): this user's running sequences' next growth in bytes, and the
  // other users' in blocks of this size (rounded up), which a newcomer
  // must leave free: their growth may preempt it. A private pool has no
  // other users (0).
  virtual void set_growth_reserve(int64_t bytes) {}
  virtual int64_t others_growth_blocks() const { return 0; }
};

}  // namespace ballast::memory
