#include "node_manager/arbitration_log.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_set.h"

namespace ballast::node_manager {

const char* ArbitrationChangeName(ArbitrationChange c) {
  switch (c) {
    case ArbitrationChange::kQueued:
      return "queued";
    case ArbitrationChange::kLate:
      return "late";
    case ArbitrationChange::kOnTime:
      return "on_time";
    case ArbitrationChange::kKvRefused:
      return "kv_refused";
    case ArbitrationChange::kKvFits:
      return "kv_fits";
    case ArbitrationChange::kRejected:
      return "rejected";
    case ArbitrationChange::kLeft:
      return "left";
  }
  return "?";
}

std::vector<ArbitrationEvent> ArbitrationTracker::Decide(
    double now_s, const std::vector<ArbitrationEntry>& queued) {
  std::vector<ArbitrationEvent> out;
  absl::flat_hash_set<std::string> present;
  for (const ArbitrationEntry& e : queued) {
    present.insert(e.id);
    auto [it, fresh] = seen_.try_emplace(e.id, Seen{e, now_s});
    const ArbitrationEntry before = it->second.last;
    it->second.last = e;
    if (fresh) {
      out.push_back({ArbitrationChange::kQueued, e, 0});
    } else if (e.late != before.late) {
      out.push_back({e.late ? ArbitrationChange::kLate : ArbitrationChange::kOnTime, e, 0});
    }
    if (e.kv_refused != (fresh ? false : before.kv_refused)) {
      out.push_back(
          {e.kv_refused ? ArbitrationChange::kKvRefused : ArbitrationChange::kKvFits, e, 0});
    }
    if (e.rejected) {
      out.push_back({ArbitrationChange::kRejected, e, now_s - it->second.first_s});
      seen_.erase(it);
    }
  }
  // The requests no longer queued, in the order they were first seen.
  std::vector<std::pair<double, std::string>> gone;
  for (const auto& [id, s] : seen_) {
    if (!present.contains(id)) gone.emplace_back(s.first_s, id);
  }
  std::sort(gone.begin(), gone.end());
  for (const auto& [first, id] : gone) {
    auto it = seen_.find(id);
    out.push_back({ArbitrationChange::kLeft, it->second.last, now_s - first});
    seen_.erase(it);
  }
  return out;
}

}  // namespace ballast::node_manager
