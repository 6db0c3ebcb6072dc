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
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

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
};

// Indices into `holders`, in the order to shed them, stopping as soon as
// their bytes cover `shortfall_bytes` (all of them if they never do; none
// if shortfall_bytes <= 0).
std::vector<size_t> PlanKvShedding(const std::vector<KvHolder>& holders, int64_t shortfall_bytes);

}  // namespace ballast::memory
