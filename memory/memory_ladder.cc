#include "memory/memory_ladder.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <set>
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
  std::vector<size_t> holders;  // who has blocks in it, each once
};

// Every formatted slab with blocks in use, and who in `holders` has blocks
// in it (a holder listing one slab twice is counted once as a holder, and
// with all its blocks).
std::map<int64_t, SlabState> IndexSlabs(const std::vector<KvHolder>& holders,
                                        const std::vector<SlabBlocks>& in_use) {
  std::map<int64_t, SlabState> slabs;
  for (const SlabBlocks& u : in_use) {
    if (u.blocks > 0) slabs[u.slab].remaining = u.blocks;
  }
  for (size_t i = 0; i < holders.size(); ++i) {
    for (const SlabBlocks& b : holders[i].slabs) {
      auto it = slabs.find(b.slab);
      if (it == slabs.end()) continue;
      it->second.listed += b.blocks;
      std::vector<size_t>& who = it->second.holders;
      if (who.empty() || who.back() != i) who.push_back(i);
    }
  }
  for (auto& [id, slab] : slabs) {
    std::sort(slab.holders.begin(), slab.holders.end());
    slab.holders.erase(std::unique(slab.holders.begin(), slab.holders.end()), slab.holders.end());
  }
  return slabs;
}

// The slabs that could still empty, cheapest first: (latest ladder place
// still needed, bytes still to shed, slab id), kept current as holders are
// shed so that each pick costs only the slabs it touched.
class SlabQueue {
 public:
  SlabQueue(const std::vector<KvHolder>& holders, const std::map<int64_t, SlabState>& slabs,
            const std::vector<bool>& shed)
      : holders_(holders), slabs_(slabs), shed_(shed), place_(holders.size()) {
    std::vector<size_t> order(holders.size());
    std::iota(order.begin(), order.end(), size_t{0});
    SortByLadder(holders, &order);
    for (size_t k = 0; k < order.size(); ++k) place_[order[k]] = k;
    for (const auto& [id, slab] : slabs) Refresh(id);
  }

  bool empty() const { return queue_.empty(); }
  int64_t Cheapest() const { return std::get<2>(*queue_.begin()); }

  // Re-keys slab `id` after a change to it or to who is shed.
  void Refresh(int64_t id) {
    auto old = keys_.find(id);
    if (old != keys_.end()) {
      queue_.erase(old->second);
      keys_.erase(old);
    }
    const SlabState& slab = slabs_.at(id);
    // A slab with blocks of someone not in `holders` cannot empty.
    if (slab.remaining <= 0 || slab.listed < slab.remaining) return;
    Entry key{0, 0, id};
    for (size_t i : slab.holders) {
      if (shed_[i]) continue;
      std::get<0>(key) = std::max(std::get<0>(key), place_[i]);
      std::get<1>(key) += holders_[i].bytes;
    }
    queue_.insert(key);
    keys_.emplace(id, key);
  }

 private:
  using Entry = std::tuple<size_t, int64_t, int64_t>;
  const std::vector<KvHolder>& holders_;
  const std::map<int64_t, SlabState>& slabs_;
  const std::vector<bool>& shed_;
  std::vector<size_t> place_;  // each holder's place in the ladder's order
  std::set<Entry> queue_;
  std::map<int64_t, Entry> keys_;
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
  std::map<int64_t, SlabState> slabs = IndexSlabs(holders, in_use);
  std::vector<bool> shed(holders.size(), false);
  SlabQueue queue(holders, slabs, shed);
  std::vector<size_t> plan;
  int64_t emptied = 0;
  while (emptied < slabs_needed && !queue.empty()) {
    std::vector<size_t> fresh;
    for (size_t i : slabs.at(queue.Cheapest()).holders) {
      if (!shed[i]) fresh.push_back(i);
    }
    SortByLadder(holders, &fresh);
    std::set<int64_t> touched;
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
        touched.insert(b.slab);
      }
    }
    for (int64_t id : touched) queue.Refresh(id);
  }
  return plan;
}

}  // namespace ballast::memory
