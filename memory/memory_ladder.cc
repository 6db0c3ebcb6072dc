#include "memory/memory_ladder.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <tuple>

namespace ballast::memory {
namespace {

// Sorts `order` (indices into holders) by the ladder: idle sessions before
// running sequences; sessions oldest first; running sequences lowest
// priority first, then newest; ties by owner, then id.
void SortByLadder(const std::vector<KvHolder>& holders, std::vector<size_t>* order) {
  auto key = [&](size_t i) {
    const KvHolder& h = holders[i];
    const bool running = h.kind == KvHolder::Kind::kRunning;
    return std::make_tuple(running, running ? h.priority : 0, running ? -h.recency : h.recency,
                           h.owner, std::cref(h.id));
  };
  std::stable_sort(order->begin(), order->end(),
                   [&](size_t a, size_t b) { return key(a) < key(b); });
}

// One formatted slab as PlanSlabShedding sees it.
struct SlabState {
  int64_t remaining = 0;        // blocks in use not yet shed
  int64_t listed = 0;           // blocks `holders` have in it
  std::vector<size_t> holders;  // who has blocks in it
};

}  // namespace

std::vector<size_t> PlanKvShedding(const std::vector<KvHolder>& holders, int64_t shortfall_bytes) {
  if (shortfall_bytes <= 0) return {};
  std::vector<size_t> order(holders.size());
  std::iota(order.begin(), order.end(), size_t{0});
  SortByLadder(holders, &order);
  std::vector<size_t> plan;
  int64_t covered = 0;
  for (size_t i : order) {
    if (covered >= shortfall_bytes) break;
    plan.push_back(i);
    covered += holders[i].bytes;
  }
  return plan;
}

std::vector<size_t> PlanSlabShedding(const std::vector<KvHolder>& holders,
                                     const std::vector<SlabBlocks>& in_use, int64_t slabs_needed) {
  if (slabs_needed <= 0) return {};
  std::map<int64_t, SlabState> slabs;  // ordered: ties go to the lower slab
  for (const SlabBlocks& u : in_use) {
    if (u.blocks > 0) slabs[u.slab].remaining = u.blocks;
  }
  for (size_t i = 0; i < holders.size(); ++i) {
    for (const SlabBlocks& b : holders[i].slabs) {
      auto it = slabs.find(b.slab);
      if (it == slabs.end()) continue;
      it->second.listed += b.blocks;
      it->second.holders.push_back(i);
    }
  }
  // Each holder's place in the ladder's order: a slab is as costly as the
  // latest-placed holder it still needs.
  std::vector<size_t> order(holders.size());
  std::iota(order.begin(), order.end(), size_t{0});
  SortByLadder(holders, &order);
  std::vector<size_t> place(holders.size());
  for (size_t k = 0; k < order.size(); ++k) place[order[k]] = k;
  std::vector<bool> shed(holders.size(), false);
  std::vector<size_t> plan;
  int64_t emptied = 0;
  while (emptied < slabs_needed) {
    // Key (ascending): the latest ladder place still needed, then the
    // bytes still to shed.
    using Key = std::pair<size_t, int64_t>;
    const SlabState* best = nullptr;
    Key best_key;
    for (const auto& [id, slab] : slabs) {
      // A slab with blocks of someone not in `holders` cannot empty.
      if (slab.remaining <= 0 || slab.listed < slab.remaining) continue;
      Key key{0, 0};
      for (size_t i : slab.holders) {
        if (shed[i]) continue;
        key.first = std::max(key.first, place[i]);
        key.second += holders[i].bytes;
      }
      if (best == nullptr || key < best_key) {
        best = &slab;
        best_key = key;
      }
    }
    if (best == nullptr) break;
    std::vector<size_t> fresh;
    for (size_t i : best->holders) {
      if (!shed[i]) fresh.push_back(i);
    }
    SortByLadder(holders, &fresh);
    for (size_t i : fresh) {
      shed[i] = true;
      plan.push_back(i);
      for (const SlabBlocks& b : holders[i].slabs) {
        auto it = slabs.find(b.slab);
        if (it == slabs.end()) continue;
        const bool was_used = it->second.remaining > 0;
        it->second.remaining -= b.blocks;
        it->second.listed -= b.blocks;
        if (was_used && it->second.remaining <= 0) ++emptied;
      }
    }
  }
  return plan;
}

}  // namespace ballast::memory
