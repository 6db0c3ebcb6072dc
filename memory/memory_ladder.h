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

namespace ballast::memory {

// One thing holding KV that could be given back.
// Blocks one holder has in one slab of the KV arena.
struct SlabBlocks {
  int64_t slab = 0;
  int64_t blocks = 0;
};

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
// that is cheapest to empty (the lowest rung among the holders it still
// needs, then the fewest bytes, then their newest admission first), and
// sheds all of its holders, until `slabs_needed` slabs are empty.
// `in_use` is every formatted slab's blocks in use, by anyone (blocks of a
// holder missing from `holders` keep their slab). Returns indices into
// `holders` in the order to shed them (each rung's own order within a
// slab); fewer slabs than needed where no more can be emptied (none if
// slabs_needed <= 0).
std::vector<size_t> PlanSlabShedding(const std::vector<KvHolder>& holders,
                                     const std::vector<SlabBlocks>& in_use, int64_t slabs_needed);

}  // namespace ballast::memory
