// SessionDirectory's limits and lost-history rules: the idle TTL, the
// session count bound and lost sessions (see session_directory.h).
#include "global_scheduler/session_directory.h"

#include "gtest/gtest.h"

namespace ballast::global_scheduler {
namespace {

TurnRecord Turn(std::vector<int> prompt, std::vector<int> output = {}) {
  TurnRecord t;
  t.prompt_tokens = std::move(prompt);
  t.output_tokens = std::move(output);
  return t;
}

TEST(SessionDirectory, ExpiredSessionsFailDataLossThenFreeTheirId) {
  absl::Time now = absl::FromUnixSeconds(1000);
  SessionDirectory d([&now] { return now; });
  ASSERT_TRUE(d.Begin("s", "m").ok());
  EXPECT_TRUE(d.Commit("s", "node-a", Turn({1, 2}, {3})).ok());
  ASSERT_TRUE(d.Begin("busy", "m").ok());  // a turn in flight never expires
  now += absl::Minutes(29);
  EXPECT_TRUE(d.Expire(absl::Minutes(30)).empty());
  now += absl::Minutes(2);
  const auto expired = d.Expire(absl::Minutes(30));
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired[0].first, "s");
  EXPECT_EQ(expired[0].second, "node-a");
  auto turn = d.Begin("s", "m");
  EXPECT_EQ(turn.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(turn.status().message().find("expired"), std::string::npos) << turn.status();
  // One more idle TTL and the id starts a new session.
  now += absl::Minutes(31);
  EXPECT_TRUE(d.Expire(absl::Minutes(30)).empty());
  turn = d.Begin("s", "m");
  ASSERT_TRUE(turn.ok()) << turn.status();
  EXPECT_TRUE(turn->fresh);
  EXPECT_TRUE(turn->history.empty());
}

TEST(SessionDirectory, LostSessionsFailUntilEnded) {
  SessionDirectory d;
  auto turn = d.Begin("s", "m");
  ASSERT_TRUE(turn.ok());
  EXPECT_TRUE(turn->fresh);
  d.MarkLost("s", LostReason::kForgotten);
  for (int i = 0; i < 2; ++i) {
    auto again = d.Begin("s", "m");
    EXPECT_EQ(again.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_NE(again.status().message().find("restarted"), std::string::npos) << again.status();
    d.Abort("s");  // a failed turn keeps the tombstone
  }
  bool existed = false;
  ASSERT_TRUE(d.End("s", &existed).ok());
  EXPECT_TRUE(existed);
  EXPECT_TRUE(d.Begin("s", "m").ok());
}

TEST(SessionDirectory, BoundsTheSessionCount) {
  SessionDirectory d(absl::Now, 2);
  ASSERT_TRUE(d.Begin("a", "m").ok());
  ASSERT_TRUE(d.Begin("b", "m").ok());
  auto c = d.Begin("c", "m");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(c.status().message().find("max_sessions"), std::string::npos) << c.status();
  EXPECT_EQ(d.size(), 2);
  EXPECT_TRUE(d.Commit("a", "n", Turn({1})).ok());
  EXPECT_TRUE(d.Begin("a", "m").ok());  // existing sessions go on at the limit
}

}  // namespace
}  // namespace ballast::global_scheduler
