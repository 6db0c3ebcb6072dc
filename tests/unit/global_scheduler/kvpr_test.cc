// KVPR placement against brute-force optimal placement on small instances
// (Prism Appendix A.2 bound), and the migration threshold against flapping.
#include "global_scheduler/kvpr.h"

#include <algorithm>
#include <cmath>
#include <iostream>
#include <random>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace ballast::global_scheduler {
namespace {

double BruteForceOptimal(const std::vector<ModelDemand>& models,
                         const std::vector<DeviceCapacity>& devices) {
  const size_t nm = models.size(), nd = devices.size();
  std::vector<int> assign(nm, 0);
  double best = INFINITY;
  while (true) {
    best = std::min(best, MaxKvpr(models, devices, assign));
    size_t i = 0;
    while (i < nm && ++assign[i] == static_cast<int>(nd)) assign[i++] = 0;
    if (i == nm) break;
  }
  return best;
}

TEST(Kvpr, GreedyIsWithinTheAppendixBoundOfOptimal) {
  std::mt19937 rng(99);
  std::uniform_real_distribution<double> demand(0.1, 10.0), weight(0.0, 0.3);
  double worst_ratio = 0;
  int additive_violations = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const int nd = 2 + trial % 2, nm = 3 + trial % 5;  // up to 3 devices, 7 models
    std::vector<DeviceCapacity> devices(nd, {"g", 1000});
    std::vector<ModelDemand> models;
    double single_max = 0;
    for (int m = 0; m < nm; ++m) {
      ModelDemand d{absl::StrCat("m", m), demand(rng), static_cast<int64_t>(1000 * weight(rng))};
      single_max = std::max(single_max, d.demand / (1000.0 - static_cast<double>(d.weight_bytes)));
      models.push_back(d);
    }
    const KvprPlacement p = PlaceKvpr(models, devices, 0.0);
    const double opt = BruteForceOptimal(models, devices);
    ASSERT_TRUE(std::isfinite(opt));
    EXPECT_NEAR(p.max_kvpr, MaxKvpr(models, devices, p.device_of), 1e-12);
    // Appendix A.2's conclusion: greedy <= 2 x OPT (Graham-style). Its
    // intermediate additive form (OPT + the largest single-model pressure)
    // does not hold exactly once weights differ: it failed on 8 of these
    // 400 instances, so it is only counted, not asserted.
    EXPECT_LE(p.max_kvpr, 2 * opt + 1e-12) << "trial " << trial;
    additive_violations += p.max_kvpr > opt + single_max + 1e-12;
    EXPECT_GE(p.max_kvpr, opt - 1e-12);
    worst_ratio = std::max(worst_ratio, p.max_kvpr / opt);
  }
  RecordProperty("worst_greedy_over_optimal", std::to_string(worst_ratio));
  std::cout << "greedy/optimal max KVPR: worst " << worst_ratio << "; additive-bound violations "
            << additive_violations << "/400\n";
}

TEST(Kvpr, HighDemandModelsGetLowDemandNeighbours) {
  std::vector<DeviceCapacity> devices = {{"g0", 1000}, {"g1", 1000}};
  std::vector<ModelDemand> models = {
      {"big1", 10, 100}, {"big2", 9, 100}, {"small1", 1, 100}, {"small2", 1, 100}};
  const auto p = PlaceKvpr(models, devices, 0.0);
  EXPECT_NE(p.device_of[0], p.device_of[1]);  // complementary: bigs apart
  EXPECT_EQ(p.migrations, 0);
}

TEST(Kvpr, ThresholdPreventsFlappingUnderOscillatingLoad) {
  // Two models swap the top demand every round (+-8%); a third is steady.
  std::vector<DeviceCapacity> devices = {{"g0", 1000}, {"g1", 1000}};
  std::vector<ModelDemand> with = {{"a", 5, 100}, {"b", 5, 100}, {"c", 5, 100}};
  std::vector<ModelDemand> without = with;
  int flaps_with = 0, flaps_without = 0;
  for (int round = 0; round < 20; ++round) {
    const double hi = 5 * 1.08, lo = 5 * 0.92;
    with[0].demand = without[0].demand = round % 2 ? hi : lo;
    with[1].demand = without[1].demand = round % 2 ? lo : hi;
    const auto pw = PlaceKvpr(with, devices, 0.2);
    const auto po = PlaceKvpr(without, devices, 0.0);
    if (round > 0) {
      flaps_with += pw.migrations;
      flaps_without += po.migrations;
    }
    for (size_t i = 0; i < with.size(); ++i) {
      with[i].current_device = pw.device_of[i];
      without[i].current_device = po.device_of[i];
    }
  }
  EXPECT_EQ(flaps_with, 0);
  EXPECT_GT(flaps_without, 0);  // without a threshold the placement keeps moving
}

TEST(Kvpr, ModelsThatFitNowhereStayUnplaced) {
  std::vector<DeviceCapacity> devices = {{"g0", 1000}};
  std::vector<ModelDemand> models = {{"huge", 1, 2000}, {"ok", 1, 100}};
  const auto p = PlaceKvpr(models, devices, 0.0);
  EXPECT_EQ(p.device_of[0], -1);
  EXPECT_EQ(p.device_of[1], 0);
  EXPECT_DOUBLE_EQ(KvDemand(100, 50, 2048, 0.05), 150 * 2048 / 0.05);
}

// The step budget: "tight" (TPOT 11 ms, 2 ms steps) has the highest
// demand and goes first, to g0; "big" (a 20 ms step) would go beside it by
// memory pressure alone (g1 holds a model with more demand per free byte),
// but 2 + 20 ms exceeds tight's 11 ms, so with the budget it goes to g1,
// where 20 + 3 ms is within the 100 ms of both.
TEST(Kvpr, StepBudgetKeepsABigStepAwayFromATightTpot) {
  std::vector<DeviceCapacity> devices = {{"g0", 1000}, {"g1", 1000}};
  std::vector<ModelDemand> models = {{"tight", 10, 100, -1, 0.002, 0.011},
                                     {"busy", 9, 500, -1, 0.003, 0.100},
                                     {"big", 1, 100, -1, 0.020, 0.100}};
  const auto plain = PlaceKvpr(models, devices, 0.0);
  EXPECT_EQ(plain.device_of[0], plain.device_of[2]);  // memory alone: big beside tight
  const auto budgeted = PlaceKvpr(models, devices, 0.0, 1.0);
  EXPECT_NE(budgeted.device_of[0], budgeted.device_of[2]);
  EXPECT_EQ(budgeted.device_of[1], budgeted.device_of[2]);
  // Where the budget holds nowhere (a TPOT below every step), KVPR decides.
  models[2].tpot_s = 0.001;
  EXPECT_EQ(PlaceKvpr(models, devices, 0.0, 1.0).device_of, plain.device_of);
  // A current placement that breaks the budget is not kept for its KVPR.
  for (size_t i = 0; i < models.size(); ++i) models[i].current_device = plain.device_of[i];
  models[2].tpot_s = 0.100;
  const auto moved = PlaceKvpr(models, devices, 0.5, 1.0);
  EXPECT_NE(moved.device_of[0], moved.device_of[2]);
  EXPECT_GT(moved.migrations, 0);
}

// A device's fixed load (models that do not move) counts: its weights take
// room and its demand adds pressure.
TEST(Kvpr, FixedLoadCountsAgainstADevice) {
  std::vector<DeviceCapacity> devices = {{"g0", 1000}, {"g1", 1000}};
  std::vector<ModelDemand> models = {{"a", 1, 300}};
  devices[0].fixed_weight_bytes = 800;  // a replicated model's weights
  EXPECT_EQ(PlaceKvpr(models, devices, 0.0).device_of[0], 1);
  devices[0].fixed_weight_bytes = 0;
  devices[1].fixed_demand = 50;  // a tensor-parallel part's demand
  EXPECT_EQ(PlaceKvpr(models, devices, 0.0).device_of[0], 0);
  EXPECT_DOUBLE_EQ(MaxKvpr(models, devices, {0}), 50.0 / 1000);
}

}  // namespace
}  // namespace ballast::global_scheduler
