// The memory ladder's KV rung order, checked against a brute-force
// statement of the rule on small random instances.
#include "memory/memory_ladder.h"

#include <algorithm>
#include <limits>
#include <random>

#include "gtest/gtest.h"

namespace ballast::memory {
namespace {

KvHolder Session(int owner, const std::string& id, int64_t recency, int64_t bytes) {
  return {KvHolder::Kind::kIdleSession, owner, id, 0, recency, bytes, {}};
}
KvHolder Running(int owner, const std::string& id, int priority, int64_t recency, int64_t bytes) {
  return {KvHolder::Kind::kRunning, owner, id, priority, recency, bytes, {}};
}

TEST(MemoryLadder, IdleSessionsFirstThenLowestPriorityNewestRunning) {
  // Two models (owners 0 and 1); alphabetical model order must not matter.
  const std::vector<KvHolder> h = {
      Running(0, "a-old-high", 9, 10, 100), Running(0, "a-new-low", 1, 50, 100),
      Session(0, "a-s-recent", 90, 10),     Running(1, "b-old-low", 1, 20, 100),
      Session(1, "b-s-stale", 5, 10),       Running(1, "b-new-high", 9, 60, 100),
  };
  // Everything, in ladder order.
  const std::vector<size_t> all = PlanKvShedding(h, 1 << 30);
  std::vector<std::string> ids;
  for (size_t i : all) ids.push_back(h[i].id);
  EXPECT_EQ(ids, (std::vector<std::string>{"b-s-stale", "a-s-recent", "a-new-low", "b-old-low",
                                           "b-new-high", "a-old-high"}));
  // Only as far as needed.
  EXPECT_EQ(PlanKvShedding(h, 15).size(), 2u);  // both sessions (10 + 10)
  EXPECT_EQ(PlanKvShedding(h, 20).size(), 2u);
  EXPECT_EQ(PlanKvShedding(h, 21).size(), 3u);  // then the low-priority newest
  EXPECT_TRUE(PlanKvShedding(h, 0).empty());
  EXPECT_TRUE(PlanKvShedding({}, 100).empty());
}

// Brute force: a plan is right if (1) it is a prefix of the ladder order
// defined pairwise and (2) it is the shortest such prefix covering the need.
TEST(MemoryLadder, MatchesThePairwiseRuleOnRandomInstances) {
  std::mt19937 rng(7);
  auto before = [](const KvHolder& a, const KvHolder& b) {  // a sheds strictly before b
    const bool ra = a.kind == KvHolder::Kind::kRunning, rb = b.kind == KvHolder::Kind::kRunning;
    if (ra != rb) return !ra;
    if (!ra) return a.recency < b.recency;
    if (a.priority != b.priority) return a.priority < b.priority;
    return a.recency > b.recency;
  };
  for (int trial = 0; trial < 500; ++trial) {
    std::vector<KvHolder> h;
    const int n = static_cast<int>(rng() % 8);
    for (int i = 0; i < n; ++i) {
      KvHolder x;
      x.kind = rng() % 2 ? KvHolder::Kind::kRunning : KvHolder::Kind::kIdleSession;
      x.owner = static_cast<int>(rng() % 3);
      x.id = std::to_string(i);
      x.priority = static_cast<int>(rng() % 3);
      x.recency = static_cast<int64_t>(rng() % 100);
      x.bytes = 1 + static_cast<int64_t>(rng() % 50);
      h.push_back(x);
    }
    const int64_t need = static_cast<int64_t>(rng() % 200);
    const std::vector<size_t> plan = PlanKvShedding(h, need);
    std::vector<bool> in(h.size(), false);
    int64_t got = 0;
    for (size_t i : plan) {
      in[i] = true;
      got += h[i].bytes;
    }
    // (1) nothing left out sheds strictly before something taken.
    for (size_t i = 0; i < h.size(); ++i) {
      if (in[i]) continue;
      for (size_t j : plan) {
        EXPECT_FALSE(before(h[i], h[j])) << "trial " << trial;
      }
    }
    // (2) covers the need (or takes everything), and the last one was needed.
    if (need <= 0) {
      EXPECT_TRUE(plan.empty());
    } else if (plan.size() < h.size()) {
      EXPECT_GE(got, need);
    }
    if (!plan.empty()) {
      EXPECT_LT(got - h[plan.back()].bytes, need);
    }
  }
}

// Slabs emptied by shedding `plan`: those whose blocks in use all belong
// to holders in the plan.
int64_t SlabsEmptied(const std::vector<KvHolder>& h, const std::vector<SlabBlocks>& in_use,
                     const std::vector<size_t>& plan) {
  int64_t emptied = 0;
  for (const SlabBlocks& u : in_use) {
    int64_t freed = 0;
    for (size_t i : plan) {
      for (const SlabBlocks& b : h[i].slabs) {
        if (b.slab == u.slab) freed += b.blocks;
      }
    }
    if (u.blocks > 0 && freed >= u.blocks) ++emptied;
  }
  return emptied;
}

KvHolder WithSlabs(KvHolder h, std::vector<SlabBlocks> slabs) {
  h.slabs = std::move(slabs);
  h.bytes = 0;
  for (const SlabBlocks& b : h.slabs) h.bytes += b.blocks;  // one byte a block
  return h;
}

std::vector<std::string> Ids(const std::vector<KvHolder>& h, const std::vector<size_t>& plan) {
  std::vector<std::string> ids;
  for (size_t i : plan) ids.push_back(h[i].id);
  return ids;
}

TEST(SlabShedding, EmptiesTheCheapestSlabsWhereTheLadderWouldShedTwice) {
  // Slab 0: n1 and o1; slab 1: n1 and o2; slab 2: m alone. The ladder
  // (newest first) sheds n1, which empties nothing, then m.
  const std::vector<KvHolder> h = {
      WithSlabs(Running(0, "n1", 0, 30, 0), {{0, 2}, {1, 2}}),
      WithSlabs(Running(1, "m", 0, 20, 0), {{2, 4}}),
      WithSlabs(Running(0, "o1", 0, 10, 0), {{0, 2}}),
      WithSlabs(Running(1, "o2", 0, 5, 0), {{1, 2}}),
  };
  const std::vector<SlabBlocks> in_use = {{0, 4}, {1, 4}, {2, 4}};
  // n1's 4 blocks free no slab: the ladder takes m too before one empties.
  EXPECT_EQ(SlabsEmptied(h, in_use, PlanKvShedding(h, 4)), 0);
  EXPECT_EQ(Ids(h, PlanKvShedding(h, 8)), (std::vector<std::string>{"n1", "m"}));
  EXPECT_EQ(Ids(h, PlanSlabShedding(h, in_use, 1)), (std::vector<std::string>{"m"}));
  // Two slabs: then slab 0 (n1 and o1, the newer oldest holder than slab 1's).
  const std::vector<size_t> two = PlanSlabShedding(h, in_use, 2);
  EXPECT_EQ(Ids(h, two), (std::vector<std::string>{"m", "n1", "o1"}));
  EXPECT_EQ(SlabsEmptied(h, in_use, two), 2);
  EXPECT_EQ(SlabsEmptied(h, in_use, PlanSlabShedding(h, in_use, 3)), 3);
  EXPECT_TRUE(PlanSlabShedding(h, in_use, 0).empty());
  // A block of someone not listed (a spared model's) keeps slab 2.
  const std::vector<SlabBlocks> foreign = {{0, 4}, {1, 4}, {2, 5}};
  const std::vector<size_t> p = PlanSlabShedding(h, foreign, 1);
  EXPECT_EQ(Ids(h, p), (std::vector<std::string>{"n1", "o1"}));
  EXPECT_EQ(SlabsEmptied(h, foreign, p), 1);
  // Only slabs 0 and 1 can empty at all.
  EXPECT_EQ(SlabsEmptied(h, foreign, PlanSlabShedding(h, foreign, 3)), 2);
}

TEST(SlabShedding, IdleSessionsAndLowPriorityGoBeforeCheaperHighPriority) {
  // Slab 0: a small high-priority sequence; slab 1: a larger low-priority
  // one; slab 2: an idle session, the largest.
  const std::vector<KvHolder> h = {
      WithSlabs(Running(0, "vip", 9, 30, 0), {{0, 1}}),
      WithSlabs(Running(0, "low", 1, 10, 0), {{1, 3}}),
      WithSlabs(Session(1, "idle", 5, 0), {{2, 8}}),
  };
  const std::vector<SlabBlocks> in_use = {{0, 1}, {1, 3}, {2, 8}};
  EXPECT_EQ(Ids(h, PlanSlabShedding(h, in_use, 2)), (std::vector<std::string>{"idle", "low"}));
}

// Holders' slab lists as the engines may give them: the same slab twice
// (merged per layer), a slab no longer in use (stale), more blocks listed
// than in use. Each holder is shed at most once and the plan ends.
TEST(SlabShedding, DuplicateStaleAndOverlistedSlabsShedEachHolderOnce) {
  const std::vector<KvHolder> h = {
      WithSlabs(Running(0, "twice", 0, 30, 0), {{0, 1}, {0, 2}}),
      WithSlabs(Running(0, "stale", 0, 20, 0), {{7, 3}, {1, 1}}),
      WithSlabs(Running(0, "over", 0, 10, 0), {{1, 5}}),
  };
  const std::vector<SlabBlocks> in_use = {{0, 3}, {1, 2}};
  const std::vector<size_t> one = PlanSlabShedding(h, in_use, 1);
  EXPECT_EQ(Ids(h, one), (std::vector<std::string>{"twice"}));
  const std::vector<size_t> all = PlanSlabShedding(h, in_use, 5);
  std::vector<size_t> sorted = all;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(std::adjacent_find(sorted.begin(), sorted.end()), sorted.end());
  EXPECT_EQ(all.size(), 3u);
  EXPECT_EQ(SlabsEmptied(h, in_use, all), 2);
}

// On small random instances: the plan never lists a holder twice; it
// empties as many slabs as asked where that many can empty at all (slabs
// holding no block of anyone unlisted); and it sheds only holders of the
// shortest prefix of the ladder's order that empties as many, so never
// more bytes than shedding in the ladder's order.
TEST(SlabShedding, EmptiesWhatCanBeEmptiedOnRandomInstances) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 1000; ++trial) {
    const int slabs = 1 + static_cast<int>(rng() % 5);
    std::vector<KvHolder> h;
    std::vector<int64_t> used(static_cast<size_t>(slabs), 0);
    const int n = static_cast<int>(rng() % 7);
    for (int i = 0; i < n; ++i) {
      std::vector<SlabBlocks> at;
      for (int s = 0; s < slabs; ++s) {
        if (rng() % 2) continue;
        at.push_back({s, 1 + static_cast<int64_t>(rng() % 3)});
        used[static_cast<size_t>(s)] += at.back().blocks;
      }
      KvHolder x = rng() % 3
                       ? Running(static_cast<int>(rng() % 2), std::to_string(i),
                                 static_cast<int>(rng() % 2), rng() % 50, 0)
                       : Session(static_cast<int>(rng() % 2), std::to_string(i), rng() % 50, 0);
      h.push_back(WithSlabs(std::move(x), std::move(at)));
    }
    std::vector<SlabBlocks> in_use;
    int64_t can_empty = 0;
    for (int s = 0; s < slabs; ++s) {
      const int64_t foreign = rng() % 4 == 0 ? 1 : 0;
      in_use.push_back({s, used[static_cast<size_t>(s)] + foreign});
      if (used[static_cast<size_t>(s)] > 0 && foreign == 0) ++can_empty;
    }
    const int64_t want = static_cast<int64_t>(rng() % (slabs + 1));
    const std::vector<size_t> plan = PlanSlabShedding(h, in_use, want);
    std::vector<size_t> sorted = plan;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(std::adjacent_find(sorted.begin(), sorted.end()), sorted.end()) << "trial " << trial;
    EXPECT_GE(SlabsEmptied(h, in_use, plan), std::min(want, can_empty)) << "trial " << trial;
    const int64_t target = std::min(want, can_empty);
    if (target == 0) {
      EXPECT_TRUE(plan.empty()) << "trial " << trial;
      continue;
    }
    const std::vector<size_t> ladder = PlanKvShedding(h, std::numeric_limits<int64_t>::max());
    std::vector<size_t> prefix;
    for (size_t i : ladder) {
      if (SlabsEmptied(h, in_use, prefix) >= target) break;
      prefix.push_back(i);
    }
    for (size_t i : plan) {
      EXPECT_NE(std::find(prefix.begin(), prefix.end(), i), prefix.end())
          << "trial " << trial << ": " << h[i].id << " is past the ladder's prefix";
    }
  }
}

}  // namespace
}  // namespace ballast::memory
