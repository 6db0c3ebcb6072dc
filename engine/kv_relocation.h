// KV relocation: the engine's half of KV compaction (memory/kv_arena.h,
// BeginDrain). The arena marks slabs draining; each model moves the blocks
// its tables hold there to new blocks elsewhere, so the slabs empty and
// give their pages back (to another model's weights) with no sequence
// preempted and no session dropped. Bookkeeping only: the bytes move
// through a caller's copy function (the executor's MoveKvBlocks), so the
// rule is unit-tested over host memory.
//
// Thread-safety: thread-compatible; the engine's step thread calls it with
// no step in flight.
#pragma once

#include <cstdint>
#include <functional>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/executor.h"
#include "engine/kv_cache.h"
#include "memory/block_allocator.h"

namespace ballast::engine {

using KvMoveFn = std::function<absl::Status(absl::Span<const KvBlockMove>)>;

// Moves every block of `tables` that lies in one of `slabs` (ascending
// slab numbers of `allocator`'s addressing) to a block from
// allocator->AllocateForMove, copies the bytes with `copy`, rewrites the
// tables and frees the old blocks. All or nothing: on an error (no room,
// a failed copy) the new blocks are freed and the tables are unchanged.
// Returns the bytes moved (0 where none lay there, or where the allocator
// is not slab-addressed). A block listed twice (in one table or two) is a
// caller bug: FAILED_PRECONDITION, nothing moved.
absl::StatusOr<int64_t> RelocateBlocks(absl::Span<SequenceKv* const> tables,
                                       absl::Span<const int64_t> slabs,
                                       memory::BlockAllocator* allocator, const KvMoveFn& copy);

}  // namespace ballast::engine
