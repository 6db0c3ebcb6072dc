#include "memory/memory_ladder.h"

#include <algorithm>
#include <limits>
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
  int64_t remaining = 0;          // blocks in use not yet shed
  int64_t listed = 0;             // blocks `holders` have in it
  std::vector<size_t> holders;    // who has blocks in it
};

// The rung a holder sheds at: idle sessions 0, running sequences 1 + the
// rank of their priority among the running ones (lower gives way first).
std::vector<int> Rungs(const std::vector<KvHolder>& holders) {
  std::vector<int> priorities;
  for (const KvHolder& h : holders) {
    if (h.kind == KvHolder::Kind::kRunning) priorities.push_back(h.priority);
  }
  std::sort(priorities.begin(), priorities.end());
  priorities.erase(std::unique(priorities.begin(), priorities.end()), priorities.end());
  std::vector<int> rungs(holders.size(), 0);
  for (size_t i = 0; i < holders.size(); ++i) {
    if (holders[i].kind != KvHolder::Kind::kRunning) continue;
    rungs[i] = 1 + static_cast<int>(std::lower_bound(priorities.begin(), priorities.end(),
                                                     holders[i].priority) -
                                    priorities.begin());
  }
  return rungs;
}

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
  const std::vector<int> rungs = Rungs(holders);
  std::vector<bool> shed(holders.size(), false);
  std::vector<size_t> plan;
  int64_t emptied = 0;
  while (emptied < slabs_needed) {
    // Key (ascending): the highest rung still needed, the bytes still to
    // shed, the oldest admission still needed (newest first, negated).
    using Key = std::tuple<int, int64_t, int64_t>;
    const SlabState* best = nullptr;
    Key best_key;
    for (const auto& [id, slab] : slabs) {
      // A slab with blocks of someone not in `holders` cannot empty.
      if (slab.remaining <= 0 || slab.listed < slab.remaining) continue;
      Key key{0, 0, std::numeric_limits<int64_t>::min()};
      for (size_t i : slab.holders) {
        if (shed[i]) continue;
        std::get<0>(key) = std::max(std::get<0>(key), rungs[i]);
        std::get<1>(key) += holders[i].bytes;
        std::get<2>(key) = std::max(std::get<2>(key), -holders[i].recency);
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
