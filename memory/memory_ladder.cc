#include "memory/memory_ladder.h"

#include <algorithm>
#include <numeric>
#include <tuple>

namespace ballast::memory {

std::vector<size_t> PlanKvShedding(const std::vector<KvHolder>& holders, int64_t shortfall_bytes) {
  if (shortfall_bytes <= 0) return {};
  std::vector<size_t> order(holders.size());
  std::iota(order.begin(), order.end(), size_t{0});
  // Sort key (ascending): idle sessions before running sequences; sessions
  // oldest first; running sequences lowest priority first, then newest.
  auto key = [&](size_t i) {
    const KvHolder& h = holders[i];
    const bool running = h.kind == KvHolder::Kind::kRunning;
    return std::make_tuple(running, running ? h.priority : 0, running ? -h.recency : h.recency,
                           h.owner, std::cref(h.id));
  };
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return key(a) < key(b); });
  std::vector<size_t> plan;
  int64_t covered = 0;
  for (size_t i : order) {
    if (covered >= shortfall_bytes) break;
    plan.push_back(i);
    covered += holders[i].bytes;
  }
  return plan;
}

}  // namespace ballast::memory
