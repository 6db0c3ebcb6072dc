// ModelStats: per-model rates over a sliding window of one-second buckets.
#include "global_scheduler/model_stats.h"

#include "gtest/gtest.h"

namespace ballast::global_scheduler {
namespace {

TEST(ModelStats, RatesCoverTheWindowAndForgetOldSeconds) {
  ModelStats s(absl::Seconds(10));
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  EXPECT_EQ(s.Rates("m", t0).requests_per_s, 0);  // never seen
  for (int i = 0; i < 10; ++i) s.Record("m", t0 + absl::Seconds(i), 100, 20);
  s.Record("other", t0, 7, 7);
  ModelRates r = s.Rates("m", t0 + absl::Seconds(9));
  EXPECT_DOUBLE_EQ(r.requests_per_s, 1.0);  // 10 requests / 10 s
  EXPECT_DOUBLE_EQ(r.prompt_tokens_per_s, 100.0);
  EXPECT_DOUBLE_EQ(r.decode_tokens_per_s, 20.0);
  // Five seconds later the five oldest seconds have left the window.
  r = s.Rates("m", t0 + absl::Seconds(14));
  EXPECT_DOUBLE_EQ(r.requests_per_s, 0.5);
  // Several requests in one second share its bucket.
  s.Record("m", t0 + absl::Seconds(14), 10, 1);
  s.Record("m", t0 + absl::Seconds(14) + absl::Milliseconds(500), 10, 1);
  r = s.Rates("m", t0 + absl::Seconds(14));
  EXPECT_DOUBLE_EQ(r.requests_per_s, 0.7);
  EXPECT_DOUBLE_EQ(r.prompt_tokens_per_s, 52.0);  // (5 * 100 + 20) / 10
  // Long after, nothing is left; forgetting a model drops it at once.
  EXPECT_EQ(s.Rates("m", t0 + absl::Seconds(100)).requests_per_s, 0);
  EXPECT_GT(s.Rates("other", t0).requests_per_s, 0);
  s.Forget("other");
  EXPECT_EQ(s.Rates("other", t0).requests_per_s, 0);
}

}  // namespace
}  // namespace ballast::global_scheduler
