// Arbitration policies: Moore-Hodgson is optimal (fewest deadline misses)
// against brute force over all orders; FineServe's batch respects its
// anchor; FCFS/EDF order as documented. ArbitrationTracker reports each
// change once.
#include "node_manager/arbitration.h"

#include <algorithm>
#include <random>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "node_manager/arbitration_log.h"

#include "gtest/gtest.h"

namespace ballast::node_manager {
namespace {

std::vector<PendingRequest> Random(std::mt19937& rng, int n) {
  std::uniform_real_distribution<double> cost(0.01, 0.3), slack(0.0, 1.2), arrive(0.0, 0.5);
  std::vector<PendingRequest> v;
  for (int i = 0; i < n; ++i) {
    PendingRequest r;
    r.id = static_cast<uint64_t>(i + 1);
    r.arrival_s = arrive(rng);
    r.cost_s = cost(rng);
    r.deadline_s = r.arrival_s + slack(rng);
    r.tokens = static_cast<int>(r.cost_s * 1000);
    v.push_back(r);
  }
  return v;
}

int BruteForceBest(const std::vector<PendingRequest>& rs, double now) {
  std::vector<uint64_t> order;
  for (const auto& r : rs) order.push_back(r.id);
  std::sort(order.begin(), order.end());
  int best = 0;
  do {
    best = std::max(best, CountOnTime(rs, order, now));
  } while (std::next_permutation(order.begin(), order.end()));
  return best;
}

TEST(Arbitration, MooreHodgsonMatchesBruteForce) {
  std::mt19937 rng(12345);
  for (int trial = 0; trial < 300; ++trial) {
    const int n = 1 + trial % 8 + (trial % 50 == 0 ? 1 : 0);  // n <= 9
    const auto rs = Random(rng, n);
    const Arbitration a = Arbitrate(ArbitrationPolicy::kMooreHodgson, rs, 0.0);
    ASSERT_EQ(a.order.size(), rs.size());
    // Its own estimate is achieved by the order it returns ...
    EXPECT_EQ(CountOnTime(rs, a.order, 0.0), a.on_time) << "trial " << trial;
    // ... and no order does better.
    EXPECT_EQ(a.on_time, BruteForceBest(rs, 0.0)) << "trial " << trial << " n " << n;
  }
}

TEST(Arbitration, MooreHodgsonBeatsEdfAndFcfsWhenOverloaded) {
  std::mt19937 rng(7);
  int mh = 0, edf = 0, fcfs = 0;
  for (int trial = 0; trial < 200; ++trial) {
    const auto rs = Random(rng, 30);
    mh += Arbitrate(ArbitrationPolicy::kMooreHodgson, rs, 0.0).on_time;
    edf += Arbitrate(ArbitrationPolicy::kEdf, rs, 0.0).on_time;
    fcfs += Arbitrate(ArbitrationPolicy::kFcfs, rs, 0.0).on_time;
  }
  EXPECT_GT(mh, edf);
  EXPECT_GT(mh, fcfs);
}

TEST(Arbitration, EveryPolicyServesEveryRequestOnce) {
  std::mt19937 rng(3);
  const auto rs = Random(rng, 40);
  for (auto p : {ArbitrationPolicy::kFcfs, ArbitrationPolicy::kEdf,
                 ArbitrationPolicy::kMooreHodgson, ArbitrationPolicy::kFineServeBatch}) {
    auto order = Arbitrate(p, rs, 0.0).order;
    std::sort(order.begin(), order.end());
    ASSERT_EQ(order.size(), rs.size());
    for (size_t i = 0; i < order.size(); ++i) EXPECT_EQ(order[i], i + 1);  // nothing dropped
  }
}

TEST(Arbitration, FineServeBatchMeetsItsAnchorAndSetsHopelessAside) {
  std::vector<PendingRequest> rs = {
      {1, 0.0, 0.50, 0.20, 200},  // feasible
      {2, 0.0, 0.30, 0.10, 100},  // anchor (earliest deadline)
      {3, 0.0, 0.05, 0.10, 100},  // cannot finish alone: set aside
      {4, 0.0, 0.90, 0.25, 250},  // longest: removed first
  };
  const Arbitration a = Arbitrate(ArbitrationPolicy::kFineServeBatch, rs, 0.0);
  // Whole batch {2,1,4} takes 0.55 > 0.30: drop 4 (0.30, not < 0.30), then 1.
  ASSERT_EQ(a.batch, 1);
  EXPECT_EQ(a.order, (std::vector<uint64_t>{2, 1, 4, 3}));
  // Batch limits trim in deadline order.
  BatchLimits lim;
  lim.max_tokens = 150;
  std::vector<PendingRequest> easy = {{1, 0, 5, 0.1, 100}, {2, 0, 6, 0.1, 100}};
  const Arbitration b = Arbitrate(ArbitrationPolicy::kFineServeBatch, easy, 0.0, lim);
  EXPECT_EQ(b.batch, 1);
  EXPECT_EQ(b.order, (std::vector<uint64_t>{1, 2}));
}

TEST(Arbitration, PolicyNamesParse) {
  EXPECT_EQ(*ParseArbitrationPolicy("moore_hodgson"), ArbitrationPolicy::kMooreHodgson);
  EXPECT_EQ(*ParseArbitrationPolicy("fineserve_batch"), ArbitrationPolicy::kFineServeBatch);
  EXPECT_FALSE(ParseArbitrationPolicy("lifo").ok());
}

ArbitrationEntry Entry(const std::string& id, bool late, bool kv_refused, bool rejected = false) {
  return ArbitrationEntry{
      .id = id, .model = "m", .late = late, .kv_refused = kv_refused, .rejected = rejected};
}

// Events as "id:event" strings, with a left or rejected one's queued time.
std::vector<std::string> Names(const std::vector<ArbitrationEvent>& events) {
  std::vector<std::string> out;
  for (const ArbitrationEvent& ev : events) {
    std::string s = absl::StrCat(ev.entry.id, ":", ArbitrationChangeName(ev.change));
    if (ev.change == ArbitrationChange::kLeft || ev.change == ArbitrationChange::kRejected) {
      absl::StrAppend(&s, "@", static_cast<int>(ev.queued_s * 1000 + 0.5), "ms");
    }
    out.push_back(std::move(s));
  }
  return out;
}

TEST(ArbitrationTracker, ReportsEachChangeOnce) {
  ArbitrationTracker t;
  using V = std::vector<std::string>;
  EXPECT_EQ(Names(t.Decide(10.0, {Entry("a", false, false), Entry("b", true, true)})),
            (V{"a:queued", "b:queued", "b:kv_refused"}));
  // Nothing changed: nothing to report.
  EXPECT_EQ(Names(t.Decide(10.5, {Entry("a", false, false), Entry("b", true, true)})), V{});
  EXPECT_EQ(Names(t.Decide(11.0, {Entry("a", true, false), Entry("b", false, false)})),
            (V{"a:late", "b:on_time", "b:kv_fits"}));
  // a left (admitted), queued 2.5 s from its first decision; c is new.
  EXPECT_EQ(Names(t.Decide(12.5, {Entry("b", false, false), Entry("c", false, false)})),
            (V{"c:queued", "a:left@2500ms"}));
  EXPECT_EQ(Names(t.Decide(
                13.0, {Entry("b", false, false, /*rejected=*/true), Entry("c", false, false)})),
            (V{"b:rejected@3000ms"}));
  // An empty queue: the rest left; a rejected one is not reported again.
  EXPECT_EQ(Names(t.Decide(14.0, {})), (V{"c:left@1500ms"}));
  EXPECT_EQ(Names(t.Decide(15.0, {})), V{});
  // A request seen again after it left is new.
  EXPECT_EQ(Names(t.Decide(16.0, {Entry("a", false, false)})), V{"a:queued"});
}

}  // namespace
}  // namespace ballast::node_manager
