// The memory ladder's KV rung order, checked against a brute-force
// statement of the rule on small random instances.
#include "memory/memory_ladder.h"

#include <random>

#include "gtest/gtest.h"

namespace ballast::memory {
namespace {

KvHolder Session(int owner, const std::string& id, int64_t recency, int64_t bytes) {
  return {KvHolder::Kind::kIdleSession, owner, id, 0, recency, bytes};
}
KvHolder Running(int owner, const std::string& id, int priority, int64_t recency, int64_t bytes) {
  return {KvHolder::Kind::kRunning, owner, id, priority, recency, bytes};
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

}  // namespace
}  // namespace ballast::memory
