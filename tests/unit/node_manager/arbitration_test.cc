// Arbitration policies: Moore-Hodgson is optimal (fewest deadline misses)
// against brute force over all orders; FineServe's batch respects its
// anchor; FCFS/EDF order as documented.
#include "node_manager/arbitration.h"

#include <algorithm>
#include <random>

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

}  // namespace
}  // namespace ballast::node_manager
