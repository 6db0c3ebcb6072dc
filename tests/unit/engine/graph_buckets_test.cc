// The CUDA engine's graph buckets (engine/graph_buckets.h): powers of two
// up to 256 tokens, then multiples of 64; every bucket holds its step and
// pads it by less than the step (or less than double, below 256).
#include "engine/graph_buckets.h"

#include <gtest/gtest.h>

namespace ballast::engine {
namespace {

TEST(GraphBuckets, PowersOfTwoThenMultiplesOfTheStep) {
  EXPECT_EQ(GraphBucketTokens(1), 1);
  EXPECT_EQ(GraphBucketTokens(3), 4);
  EXPECT_EQ(GraphBucketTokens(129), 256);
  EXPECT_EQ(GraphBucketTokens(256), 256);
  EXPECT_EQ(GraphBucketTokens(257), 320);
  EXPECT_EQ(GraphBucketTokens(513), 576);
  EXPECT_EQ(GraphBucketTokens(1000), 1024);
  EXPECT_EQ(GraphBucketTokens(1025), 1088);
}

TEST(GraphBuckets, EveryStepFitsItsBucketWithBoundedPadding) {
  int buckets = 0, last = 0;
  for (int t = 1; t <= 4096; ++t) {
    const int b = GraphBucketTokens(t);
    ASSERT_GE(b, t);
    ASSERT_GE(b, last);  // monotone: a longer step never takes a smaller bucket
    if (t <= kGraphPow2Tokens) {
      ASSERT_LT(b, 2 * t);
    } else {
      ASSERT_LT(b - t, kGraphTokenStep);
      ASSERT_EQ(b % kGraphTokenStep, 0);
    }
    buckets += b != last;
    last = b;
  }
  // 1, 2, 4, ..., 256 (9), then 320, 384, ..., 4096 (60).
  EXPECT_EQ(buckets, 9 + (4096 - 256) / kGraphTokenStep);
}

}  // namespace
}  // namespace ballast::engine
