// The memory ladder: which KV a device gives back, and in what order, when
// it needs memory (an activating model's weights, a running sequence's next
// block). Written once here, used by every caller (today DeviceWorker's
// activation path; remapping will add its rungs here), and unit-tested
// without engines: holders are plain data.
//
// The rungs, taken in order and only as far as needed (ARCHITECTURE.md):
//   1. free slabs (the caller reclaims them before asking this plan);
//   2. idle session KV, least recently used first, across all models on
//      the device (with tiering this demotes it; today it is dropped and
//      recomputed from the session's token history);
//   3. running sequences, lowest priority first, then the newest (largest
//      recency) first, across all models; they are preempted and recompute
//      later with the same output.
// (Remapped weight layers and idle-model eviction slot in between 2 and 3
// when they land.) Ties: lower owner index, then id, so the plan is
// deterministic.
//
// PlanSlabShedding is the same ladder for room that only whole slabs make.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "memory/block_allocator.h"

namespace ballast::memory {

// One thing holding KV that could be given back.
struct KvHolder {
  enum class Kind { kIdleSession, kRunning };
  Kind kind = Kind::kRunning;
  int owner = 0;        // which model (an index the caller chose)
  std::string id;       // session id or request id, opaque here
  int priority = 0;     // lower gives way first (running sequences)
  int64_t recency = 0;  // larger = more recent (last use / admission), one clock per device
  int64_t bytes = 0;    // KV bytes freed by giving it back
  // Where its blocks lie, one entry per slab (PlanSlabShedding only).
  std::vector<SlabBlocks> slabs;
};

// Indices into `holders`, in the order to shed them, stopping as soon as
// their bytes cover `shortfall_bytes` (all of them if they never do; none
// if shortfall_bytes <= 0).
std::vector<size_t> PlanKvShedding(const std::vector<KvHolder>& holders, int64_t shortfall_bytes);

// For room that only whole slabs make (weights mapped from the pool): freed
// blocks give a slab back only once every block in it is free, and with
// many sequences growing at once each slab holds blocks of many of them, so
// shedding by PlanKvShedding's order until slabs empty can shed several
// times the room it makes. This plan picks whole slabs instead: again and
// again, of the slabs every block of which belongs to `holders`, the one
// whose holders still needed all come earliest in the ladder's order (the
// latest of them earliest; then the fewest bytes), and sheds those
// holders, until `slabs_needed` slabs are empty. So it sheds a subset of
// the shortest prefix of the ladder's order that would empty as many
// slabs: never more bytes, and nobody the ladder would have spared.
// `in_use` is every formatted slab's blocks in use, by anyone (blocks of a
// holder missing from `holders` keep their slab). Returns indices into
// `holders` in the order to shed them (each rung's own order within a
// slab); fewer slabs than needed where no more can be emptied (none if
// slabs_needed <= 0).
std::vector<size_t> PlanSlabShedding(const std::vector<KvHolder>& holders,
                                     const std::vector<SlabBlocks>& in_use, int64_t slabs_needed);

}  // namespace ballast::memory
