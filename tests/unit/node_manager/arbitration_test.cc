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

// Aging: r1 (SLO 1 s, queued 3.5 s, 0.4 s of prefill) is late whatever
// the order, and Moore-Hodgson alone serves it last, after r2 and r3 (both
// on time). Past 3 SLOs of waiting it goes first; then the rest are ordered
// from when it ends (0.4 s): r2 (due at 0.5) and r3 (due at 0.7) cannot
// both make it, so the longer, r2, is put behind. Not yet past 4 SLOs: as
// without aging.
TEST(Arbitration, AgingServesALongLateRequestFirst) {
  const std::vector<PendingRequest> rs = {
      {1, -3.5, -2.5, 0.40, 400},  // arrival, deadline, cost, tokens
      {2, -0.5, 0.5, 0.20, 200},
      {3, -0.3, 0.7, 0.15, 150},
  };
  const Arbitration none = Arbitrate(ArbitrationPolicy::kMooreHodgson, rs, 0.0);
  EXPECT_EQ(none.order, (std::vector<uint64_t>{2, 3, 1}));
  EXPECT_EQ(none.on_time, 2);
  const Arbitration aged = Arbitrate(ArbitrationPolicy::kMooreHodgson, rs, 0.0, {}, {}, 3);
  EXPECT_EQ(aged.order, (std::vector<uint64_t>{1, 3, 2}));
  EXPECT_EQ(aged.on_time, 1);  // r3 at 0.55
  EXPECT_EQ(aged.on_time, CountOnTime(rs, aged.order, 0.0));
  EXPECT_EQ(Arbitrate(ArbitrationPolicy::kMooreHodgson, rs, 0.0, {}, {}, 4).order, none.order);
  // Every policy puts it first, and fineserve_batch counts it in its batch.
  for (auto p :
       {ArbitrationPolicy::kFcfs, ArbitrationPolicy::kEdf, ArbitrationPolicy::kFineServeBatch}) {
    EXPECT_EQ(Arbitrate(p, rs, 0.0, {}, {}, 3).order.front(), 1u);
  }
  EXPECT_EQ(Arbitrate(ArbitrationPolicy::kFineServeBatch, rs, 0.0, {}, {}, 3).batch,
            1 + Arbitrate(ArbitrationPolicy::kFineServeBatch, {rs[1], rs[2]}, 0.4).batch);
}

// The requests aging leaves are still ordered optimally, from when the
// promoted ones end: against brute force over the rest's orders.
TEST(Arbitration, AgingKeepsMooreHodgsonOptimalForTheRest) {
  std::mt19937 rng(99);
  int promoted = 0;
  for (int trial = 0; trial < 200; ++trial) {
    const auto rs = Random(rng, 1 + trial % 8);
    const double now = 1.0, k = 1.0;  // arrivals in [0, 0.5], slack up to 1.2
    const Arbitration a = Arbitrate(ArbitrationPolicy::kMooreHodgson, rs, now, {}, {}, k);
    std::vector<PendingRequest> aged, rest;
    for (const auto& r : rs) {
      (now - r.arrival_s > k * (r.deadline_s - r.arrival_s) ? aged : rest).push_back(r);
    }
    std::sort(aged.begin(), aged.end(), [](const auto& x, const auto& y) {
      return x.arrival_s < y.arrival_s || (x.arrival_s == y.arrival_s && x.id < y.id);
    });
    promoted += static_cast<int>(aged.size());
    double after = now;
    for (size_t i = 0; i < aged.size(); ++i) {
      EXPECT_EQ(a.order[i], aged[i].id) << "trial " << trial;
      after += aged[i].cost_s;
    }
    const std::vector<uint64_t> tail(a.order.begin() + static_cast<int64_t>(aged.size()),
                                     a.order.end());
    EXPECT_EQ(CountOnTime(rest, tail, after), rest.empty() ? 0 : BruteForceBest(rest, after))
        << "trial " << trial;
    EXPECT_EQ(a.on_time, CountOnTime(rs, a.order, now));
  }
  EXPECT_GT(promoted, 50);  // the trials do exercise aging
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
