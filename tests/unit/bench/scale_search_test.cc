#include "bench/scale_search.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace ballast::bench {
namespace {

// Runs a search against a config whose true limit is `limit` (it meets the
// target at every scale <= limit); returns the scales it ran.
std::vector<double> Drive(ScaleSearch* s, double limit) {
  std::vector<double> runs;
  while (auto k = s->Next()) {
    runs.push_back(*k);
    s->Record(*k, *k <= limit);
    if (runs.size() > 100) break;  // a search that never ends fails below
  }
  return runs;
}

TEST(ScaleSearch, BisectsGeometricallyFromTheMiddle) {
  auto s = ScaleSearch::Create({.lo = 1, .hi = 64, .max_runs = 4});
  ASSERT_TRUE(s.ok());
  // Limit 10: 8 met, 23 missed (sqrt(8*64) = 22.6), 14 missed, 11 missed.
  EXPECT_EQ(Drive(&*s, 10), (std::vector<double>{8, 23, 14, 11}));
  EXPECT_EQ(s->highest_met(), 8);
  EXPECT_EQ(s->lowest_missed(), 11);
  EXPECT_EQ(s->runs(), 4);
}

TEST(ScaleSearch, EveryLimitInRangeEndsInsideItsBracket) {
  // Brute force over limits in and around [lo, hi]: the bracket always holds
  // the limit, the run budget is kept, and no scale runs twice.
  for (int runs = 1; runs <= 8; ++runs) {
    for (double limit = 0.5; limit < 40; limit *= 1.07) {
      auto s = ScaleSearch::Create({.lo = 1, .hi = 32, .max_runs = runs, .precision = 1.1});
      ASSERT_TRUE(s.ok());
      const auto ran = Drive(&*s, limit);
      ASSERT_LE(ran.size(), static_cast<size_t>(runs)) << limit;
      for (size_t i = 0; i < ran.size(); ++i) {
        for (size_t j = 0; j < i; ++j) EXPECT_NE(ran[i], ran[j]) << limit;
        EXPECT_GE(ran[i], 1) << limit;
        EXPECT_LE(ran[i], 32) << limit;
      }
      EXPECT_LE(s->highest_met(), limit) << limit;
      EXPECT_GT(s->lowest_missed(), limit) << limit;
      if (runs == 8 && limit >= 1 && limit < 32) {
        // Enough runs narrow any in-range limit to the precision (two
        // significant digits can leave a bracket up to one step wider).
        EXPECT_GT(s->highest_met(), 0) << limit;
        EXPECT_LE(s->lowest_missed() / s->highest_met(), 1.2) << limit;
      }
    }
  }
}

TEST(ScaleSearch, ALimitOutsideTheRangeIsConfirmedAtItsEdge) {
  auto below = ScaleSearch::Create({.lo = 2, .hi = 64, .max_runs = 10});
  ASSERT_TRUE(below.ok());
  const auto ran_below = Drive(&*below, 1);
  EXPECT_EQ(ran_below.back(), 2);  // the last run confirms LO misses
  EXPECT_EQ(below->highest_met(), 0);
  EXPECT_EQ(below->lowest_missed(), 2);

  auto above = ScaleSearch::Create({.lo = 2, .hi = 64, .max_runs = 10});
  ASSERT_TRUE(above.ok());
  const auto ran_above = Drive(&*above, 1000);
  EXPECT_EQ(ran_above.back(), 64);
  EXPECT_EQ(above->highest_met(), 64);
  EXPECT_TRUE(std::isinf(above->lowest_missed()));
}

TEST(ScaleSearch, StopsOnceTheBracketIsWithinPrecision) {
  auto s = ScaleSearch::Create({.lo = 1, .hi = 64, .max_runs = 50, .precision = 1.5});
  ASSERT_TRUE(s.ok());
  Drive(&*s, 5);
  EXPECT_LE(s->lowest_missed() / s->highest_met(), 1.5);
  EXPECT_LT(s->runs(), 10);
}

TEST(ScaleSearch, AMissBelowAMetScaleDoesNotMoveTheBracket) {
  auto s = ScaleSearch::Create({.lo = 1, .hi = 64});
  ASSERT_TRUE(s.ok());
  s->Record(8, true);
  s->Record(4, false);  // noise: not monotone
  EXPECT_EQ(s->highest_met(), 8);
  EXPECT_TRUE(std::isinf(s->lowest_missed()));
  s->Record(16, false);
  s->Record(32, true);  // met above the old miss: that miss no longer bounds
  EXPECT_EQ(s->highest_met(), 32);
  EXPECT_TRUE(std::isinf(s->lowest_missed()));
}

TEST(ScaleSearch, RejectsBadOptions) {
  EXPECT_FALSE(ScaleSearch::Create({.lo = 0, .hi = 4}).ok());
  EXPECT_FALSE(ScaleSearch::Create({.lo = 4, .hi = 4}).ok());
  EXPECT_FALSE(ScaleSearch::Create({.lo = 1, .hi = 4, .max_runs = 0}).ok());
  EXPECT_FALSE(ScaleSearch::Create({.lo = 1, .hi = 4, .precision = 1}).ok());
}

TEST(ScaleSearch, RoundsToSignificantDigits) {
  EXPECT_EQ(RoundSignificant(22.627, 2), 23);
  EXPECT_EQ(RoundSignificant(5.657, 2), 5.7);
  EXPECT_EQ(RoundSignificant(181.02, 2), 180);
  EXPECT_EQ(RoundSignificant(0.3536, 2), 0.35);
}

}  // namespace
}  // namespace ballast::bench
