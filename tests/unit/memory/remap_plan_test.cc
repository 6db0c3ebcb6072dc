// Parameter remapping's decisions: nested, spread layer sets, Mirage's timing
// constraints (eq. 4 and 5) checked against a brute-force simulation of the
// slot pipeline, donor order and reversion order.
#include "memory/remap_plan.h"

#include <algorithm>
#include <iterator>

#include "gtest/gtest.h"

namespace ballast::memory {
namespace {

TEST(RemapPlan, StreamedLayersAreNestedAndSpread) {
  EXPECT_EQ(StreamedLayers(8, 2), (std::vector<int>{0, 4}));  // Mirage's example
  EXPECT_EQ(StreamedLayers(32, 3), (std::vector<int>{0, 8, 16}));
  EXPECT_EQ(StreamedLayers(32, 4), (std::vector<int>{0, 8, 16, 24}));
  EXPECT_EQ(StreamedLayers(5, 5), (std::vector<int>{0, 1, 2, 3, 4}));
  EXPECT_TRUE(StreamedLayers(4, 5).empty());
  EXPECT_TRUE(StreamedLayers(4, 0).empty());
  EXPECT_TRUE(LendOrder(0).empty());
  const std::vector<int> order = LendOrder(32);
  EXPECT_EQ(std::vector<int>(order.begin(), order.begin() + 10),
            (std::vector<int>{0, 16, 8, 24, 4, 20, 12, 28, 2, 18}));
  for (int n = 1; n <= 80; ++n) {
    std::vector<int> all = LendOrder(n);
    std::sort(all.begin(), all.end());
    ASSERT_EQ(static_cast<int>(all.size()), n);
    for (int l = 0; l < n; ++l) ASSERT_EQ(all[static_cast<size_t>(l)], l) << n;  // each once
    std::vector<int> before;
    for (int m = 1; m <= n; ++m) {
      const std::vector<int> l = StreamedLayers(n, m);
      ASSERT_EQ(static_cast<int>(l.size()), m);
      // One more layer streamed keeps every layer streamed before: a
      // lend copies nothing back.
      EXPECT_TRUE(std::includes(l.begin(), l.end(), before.begin(), before.end())) << n << " " << m;
      before = l;
      int lo = n, hi = 0;
      for (int k = 0; k < m; ++k) {
        const int gap = (k + 1 < m ? l[k + 1] : n) - l[k];
        lo = std::min(lo, gap);
        hi = std::max(hi, gap);
      }
      EXPECT_LE(hi, 2 * lo + 1) << n << " " << m;
      if (n % m == 0 && (m & (m - 1)) == 0) {
        EXPECT_EQ(hi, lo) << n << " " << m;
      }
    }
  }
}

TEST(RemapPlan, SlotsFollowMirageEquations) {
  // n = 40, T_T = T_c: one slot while Mirage's eq. 4 holds and every gap
  // between streamed layers leaves a layer to hide a copy; α = 16 streams
  // layers 0 and 1 (no layer between); then two slots, while every copy
  // (the pass's last ones included) has a layer to hide behind.
  EXPECT_EQ(SlotsFor(40, 15, 1.0, 1.0), 1);
  EXPECT_EQ(SlotsFor(40, 16, 1.0, 1.0), 2);
  EXPECT_EQ(SlotsFor(40, 37, 1.0, 1.0), 2);
  EXPECT_EQ(SlotsFor(40, 38, 1.0, 1.0), 0);  // layer 39's reload would have no layer left
  EXPECT_EQ(SlotsFor(40, 39, 1.0, 1.0), 0);
  EXPECT_EQ(SlotsFor(40, 0, 1.0, 1.0), 0);
  // Transfer 4x slower than a layer's compute: eq. 4 holds to α = 7
  // (4·8 = 32 <= 32) and every gap of 5 layers hides a copy. α = 8 adds
  // layer 2 and needs two slots: eq. 5 holds (4·10 = 40 <= 40) and each
  // copy has 4 layers between its slot's readers, but the copies queue on
  // the one engine and the reload of layer 2 ends a layer after the pass.
  EXPECT_EQ(SlotsFor(40, 7, 4.0, 1.0), 1);
  EXPECT_EQ(SlotsFor(40, 8, 4.0, 1.0), 0);
  EXPECT_EQ(SlotsFor(40, 9, 4.0, 1.0), 0);
  EXPECT_EQ(MaxAlpha(40, 4.0, 1.0, 40), 7);
  EXPECT_EQ(MaxAlpha(40, 4.0, 1.0, 5), 5);
  EXPECT_EQ(MaxAlpha(40, 100.0, 1.0, 40), 0);
  // T_T = 2 T_c: one slot to α = 7, two from 8 to 14.
  EXPECT_EQ(SlotsFor(40, 7, 2.0, 1.0), 1);
  EXPECT_EQ(SlotsFor(40, 8, 2.0, 1.0), 2);
  EXPECT_EQ(SlotsFor(40, 14, 2.0, 1.0), 2);
  EXPECT_EQ(SlotsFor(40, 15, 2.0, 1.0), 0);
  const StreamingPlan p = PlanStreaming(40, 13, 2.0, 1.0);
  EXPECT_EQ(p.slots, 2);
  EXPECT_EQ(p.streamed, StreamedLayers(40, 15));
  EXPECT_EQ(p.Lent().size(), 13u);
  EXPECT_EQ(p.Lent().front(), p.streamed[2]);
  EXPECT_EQ(PlanStreaming(40, 8, 4.0, 1.0), StreamingPlan{});
}

// Lending a layer more lends its pages and copies nothing back; taking one
// back copies that layer only (the lent sets are nested, slot changes
// aside: a second slot's home stops being lent).
TEST(RemapPlan, OneLayerMoreOrLessMovesOneLayer) {
  auto plan = [](int n, int alpha, int slots) {
    StreamingPlan p;
    p.alpha = alpha;
    p.slots = slots;
    p.streamed = StreamedLayers(n, alpha + slots);
    return p;
  };
  for (int n : {16, 32, 40, 80}) {
    for (int slots = 1; slots <= 2; ++slots) {
      for (int a = 1; a + slots + 1 <= n; ++a) {
        const std::vector<int> was = plan(n, a, slots).Lent(), now = plan(n, a + 1, slots).Lent();
        ASSERT_EQ(now.size(), was.size() + 1);
        // Everything lent at α stays lent at α + 1: the lend copies none
        // back, and the revert from α + 1 copies back the one layer.
        EXPECT_TRUE(std::includes(now.begin(), now.end(), was.begin(), was.end()))
            << n << " " << slots << " " << a;
      }
    }
  }
  // A second slot's home is the one layer the change of slot count moves.
  const std::vector<int> one = plan(32, 4, 1).Lent(), two = plan(32, 5, 2).Lent();
  std::vector<int> back;
  std::set_difference(one.begin(), one.end(), two.begin(), two.end(), std::back_inserter(back));
  EXPECT_EQ(back, (std::vector<int>{4}));
}

// The pipeline the executors run (engine/executor.h): streamed layer k uses
// slot k % β; its copy into the slot starts once the slot's previous
// layer is computed and the previous copy is done (one copy engine);
// layer l computes once layer l-1 is done and its weights are in; a pass
// ends once the slots hold their home layers again (the join). Returns
// the steady-state time of one pass over the layers (after warm-up).
double SimulatedStep(int n, const StreamingPlan& p, double tt, double tc) {
  const int m = static_cast<int>(p.streamed.size());
  std::vector<int> slot_of(n, -1);
  for (int k = 0; k < m; ++k) slot_of[p.streamed[k]] = k;
  std::vector<double> slot_free(p.slots, 0.0), loaded(m, 0.0);
  double copy_engine = 0, t = 0, first = 0;
  const int passes = 6;
  for (int pass = 0; pass < passes; ++pass) {
    if (pass == passes - 1) first = t;
    for (int l = 0; l < n; ++l) {
      const int k = slot_of[l];
      if (k >= 0) t = std::max(t, loaded[k]);
      t += tc;
      if (k >= 0) {
        const int s = k % p.slots;
        slot_free[s] = t;
        const int next = k + p.slots < m ? k + p.slots : s;  // the home layer, next pass
        const double start = std::max(slot_free[s], copy_engine);
        copy_engine = start + tt;
        loaded[next] = copy_engine;
      }
    }
    for (int s = 0; s < p.slots; ++s) t = std::max(t, loaded[s]);  // the step joins its copies
  }
  return t - first;
}

TEST(RemapPlan, WhereTheConstraintHoldsStreamingAddsNoStall) {
  for (int n : {8, 16, 32, 40}) {
    for (double ratio : {0.5, 1.0, 2.0, 4.0, 8.0}) {
      for (int a = 1; a < n; ++a) {
        const StreamingPlan p = PlanStreaming(n, a, ratio, 1.0);
        if (p.slots == 0) continue;
        EXPECT_NEAR(SimulatedStep(n, p, ratio, 1.0), n * 1.0, 1e-9)
            << "n " << n << " T_T/T_c " << ratio << " alpha " << a << " slots " << p.slots;
      }
    }
  }
  // Past α_max with one slot, the step stalls.
  StreamingPlan tight;
  tight.alpha = 20;
  tight.slots = 1;
  tight.streamed = StreamedLayers(40, 21);
  EXPECT_GT(SimulatedStep(40, tight, 4.0, 1.0), 40.0);
}

TEST(RemapPlan, BusyModelsShareOneCopyLink) {
  StreamingPlan one;  // α = 1 through one slot: layer 4 copied in, layer 0 back
  one.alpha = 1;
  one.slots = 1;
  one.streamed = StreamedLayers(8, 2);
  StreamingPlan four = PlanStreaming(8, 4, 0.1, 1.0);
  ASSERT_EQ(four.slots, 2);
  EXPECT_EQ(CopiesPerStep(StreamingPlan{}), 0);
  EXPECT_EQ(CopiesPerStep(one), 2);
  EXPECT_EQ(CopiesPerStep(four), 6);
  // 2 copies of 2.5 ms against 8 layers of 1 ms: the link is busy 62.5%.
  EXPECT_DOUBLE_EQ(LinkShare(8, one, 2.5, 1.0), 0.625);
  EXPECT_DOUBLE_EQ(LinkShare(8, StreamingPlan{}, 2.5, 1.0), 0.0);
  EXPECT_DOUBLE_EQ(LinkShare(8, one, 2.5, 0.0), 0.0);  // unknown T_c
  EXPECT_DOUBLE_EQ(SharedTransfer(2.5, 0.0), 2.5);
  EXPECT_DOUBLE_EQ(SharedTransfer(2.5, 0.625), 2.5 / 0.375);
  EXPECT_LT(SharedTransfer(2.5, 1.0), 0.0);
  // Alone the model may lend one layer; beside a model taking 62.5% of
  // the link, none (a copy takes 6.7 ms, and the slot's gap is 3 ms).
  EXPECT_EQ(MaxAlpha(8, SharedTransfer(2.5, 0.0), 1.0, 4), 1);
  EXPECT_EQ(MaxAlpha(8, SharedTransfer(2.5, 0.625), 1.0, 4), 0);
  // Whatever the others take, a plan within the cap keeps the link's
  // load at most 1 (so the busy models' copies together keep up).
  for (int n : {8, 16, 32, 40}) {
    for (double ratio : {0.05, 0.2, 1.0, 4.0}) {
      for (double others : {0.0, 0.1, 0.4, 0.7, 0.95}) {
        const double tt = SharedTransfer(ratio, others);
        for (int a = 1; a <= MaxAlpha(n, tt, 1.0, n - 2); ++a) {
          const StreamingPlan p = PlanStreaming(n, a, tt, 1.0);
          ASSERT_GT(p.slots, 0);
          EXPECT_LE(LinkShare(n, p, ratio, 1.0) + others, 1.0 + 1e-12)
              << "n " << n << " T_T/T_c " << ratio << " others " << others << " alpha " << a;
        }
      }
    }
  }
}

RemapCandidate Model(int owner, bool active, int priority, int64_t last, int alpha, int cap) {
  return {owner, active, priority, last, alpha, cap, 100};
}

// What is still lendable is each model's layers up to its cap not lent
// yet; a model past its cap (the stall correction lowered it) adds none
// rather than taking from the others, and so does one with no layer size
// (a model that does not remap).
TEST(RemapPlan, LendableBytesCountEveryModelUpToItsCap) {
  std::vector<RemapCandidate> m = {Model(0, true, 0, 90, 0, 4), Model(1, false, 5, 10, 0, 2),
                                   Model(2, false, 1, 20, 0, 2)};
  EXPECT_EQ(LendableBytes(m), 800);
  m[0].alpha = 1;
  m[1].alpha = 2;
  EXPECT_EQ(LendableBytes(m), 300 + 0 + 200);
  m[0].alpha = 6;  // over its cap by 2
  EXPECT_EQ(LendableBytes(m), 200);
  m[2].layer_bytes = 0;
  EXPECT_EQ(LendableBytes(m), 0);
  // A shortfall past every cap lends all of it: nothing is left.
  std::vector<RemapCandidate> all = {Model(0, true, 0, 90, 1, 4), Model(1, false, 5, 10, 0, 2)};
  const int64_t before = LendableBytes(all);
  const std::vector<int> lent = PlanRemap(all, int64_t{1} << 20);
  int64_t planned = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    planned += (lent[i] - all[i].alpha) * all[i].layer_bytes;
    all[i].alpha = lent[i];
  }
  EXPECT_EQ(planned, before);
  EXPECT_EQ(LendableBytes(all), 0);
}

TEST(RemapPlan, InactiveLowestPriorityMruGiveFirstAndTakeBackLast) {
  const std::vector<RemapCandidate> m = {
      Model(0, true, 0, 90, 0, 4),   // the busy model
      Model(1, false, 5, 10, 0, 2),  // inactive, high priority
      Model(2, false, 1, 20, 0, 2),  // inactive, low priority, older
      Model(3, false, 1, 30, 0, 2),  // inactive, low priority, most recent
  };
  EXPECT_EQ(DonorOrder(m), (std::vector<size_t>{3, 2, 1, 0}));
  EXPECT_EQ(PlanRemap(m, 150), (std::vector<int>{0, 0, 0, 2}));
  EXPECT_EQ(PlanRemap(m, 201), (std::vector<int>{0, 0, 1, 2}));
  EXPECT_EQ(PlanRemap(m, 601), (std::vector<int>{1, 2, 2, 2}));
  EXPECT_EQ(PlanRemap(m, 100000), (std::vector<int>{4, 2, 2, 2}));  // every cap reached
  EXPECT_EQ(PlanRemap(m, 0), (std::vector<int>{0, 0, 0, 0}));
  EXPECT_EQ(RevertNext(m), -1);
  std::vector<RemapCandidate> r = m;
  const std::vector<int> a = PlanRemap(m, 601);
  for (size_t i = 0; i < r.size(); ++i) r[i].alpha = a[i];
  EXPECT_EQ(RevertNext(r), 0);  // the busy model's layers come back first
  r[0].alpha = 0;
  EXPECT_EQ(RevertNext(r), 1);
  r[1].alpha = 0;
  EXPECT_EQ(RevertNext(r), 2);
}

TEST(RemapPlan, StallCorrectionLowersTcAfterAWindowOfStallsAndRecoversSlowly) {
  StallCorrection f;
  constexpr int w = StallCorrection::kWindow;
  // A window judges only once full.
  for (int i = 0; i + 1 < w; ++i) EXPECT_FALSE(f.Observe(0.4));
  EXPECT_DOUBLE_EQ(f.factor, 1.0);
  EXPECT_TRUE(f.Observe(0.4));  // mean 0.4 > kHigh: T_c x 0.6
  EXPECT_DOUBLE_EQ(f.factor, 0.6);
  EXPECT_EQ(f.steps, 0);
  // Between kLow and kHigh: no change.
  for (int i = 0; i < w; ++i) EXPECT_FALSE(f.Observe(0.05));
  EXPECT_DOUBLE_EQ(f.factor, 0.6);
  // A clean window recovers by kRecover, never past 1.
  for (int i = 0; i < w; ++i) f.Observe(0.0);
  EXPECT_DOUBLE_EQ(f.factor, 0.75);
  for (int round = 0; round < 4; ++round) {
    for (int i = 0; i < w; ++i) f.Observe(0.0);
  }
  EXPECT_DOUBLE_EQ(f.factor, 1.0);
  // Shares are clamped to [0, 1], and the factor never falls below kMin.
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < w; ++i) f.Observe(7.0);
  }
  EXPECT_DOUBLE_EQ(f.factor, StallCorrection::kMin);
  // A new plan starts the window again.
  f.Observe(0.9);
  f.Restart();
  for (int i = 0; i + 1 < w; ++i) f.Observe(0.0);
  EXPECT_EQ(f.steps, w - 1);
  EXPECT_DOUBLE_EQ(f.factor, StallCorrection::kMin);
}

}  // namespace
}  // namespace ballast::memory
