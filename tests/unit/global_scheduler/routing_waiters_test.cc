// RoutingWaiters: a parked request is woken exactly once — by a routing
// change, its deadline, its cancellation or Stop — on the waiters' thread,
// and many parked requests hold no thread of their own.
#include "global_scheduler/routing_waiters.h"

#include <atomic>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace ballast::global_scheduler {
namespace {

v1::RegisterNodeRequest NodeWith(const std::string& id, const std::string& model) {
  v1::RegisterNodeRequest r;
  r.set_node_id(id);
  r.set_address("127.0.0.1:1");
  auto* m = r.add_models();
  m->set_name(model);
  m->set_state(v1::MODEL_STATE_READY);
  return r;
}

const auto kNever = [] { return false; };

TEST(RoutingWaiters, ARoutingChangeWakesEveryWaiterOnce) {
  ClusterState cluster(absl::Seconds(3), [] { return absl::Now(); });
  RoutingWaiters waiters(&cluster);
  constexpr int kWaiters = 200;
  std::atomic<int> woken{0};
  absl::Notification all;
  const uint64_t v = cluster.RoutingVersion();
  for (int i = 0; i < kWaiters; ++i) {
    waiters.Park(v, absl::Now() + absl::Minutes(1), kNever, [&] {
      if (++woken == kWaiters) all.Notify();
    });
  }
  EXPECT_EQ(waiters.parked(), kWaiters);
  EXPECT_EQ(woken.load(), 0);
  ASSERT_TRUE(cluster.Register(NodeWith("n1", "m")).ok());  // a replica appears
  ASSERT_TRUE(all.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_EQ(waiters.parked(), 0);
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(woken.load(), kWaiters);  // once each
}

TEST(RoutingWaiters, AStaleVersionWakesAtOnce) {
  ClusterState cluster(absl::Seconds(3), [] { return absl::Now(); });
  RoutingWaiters waiters(&cluster);
  const uint64_t v = cluster.RoutingVersion();
  ASSERT_TRUE(cluster.Register(NodeWith("n1", "m")).ok());
  bool woken = false;
  waiters.Park(v, absl::Now() + absl::Minutes(1), kNever, [&] { woken = true; });
  EXPECT_TRUE(woken);  // on the caller's thread, before Park returns
}

TEST(RoutingWaiters, DeadlineAndCancellationWake) {
  ClusterState cluster(absl::Seconds(3), [] { return absl::Now(); });
  RoutingWaiters waiters(&cluster);
  const uint64_t v = cluster.RoutingVersion();
  absl::Notification by_deadline, by_cancel;
  const absl::Time t0 = absl::Now();
  waiters.Park(v, t0 + absl::Milliseconds(100), kNever, [&] { by_deadline.Notify(); });
  std::atomic<bool> cancelled{false};
  waiters.Park(
      v, t0 + absl::Minutes(1), [&] { return cancelled.load(); }, [&] { by_cancel.Notify(); });
  ASSERT_TRUE(by_deadline.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_GE(absl::Now() - t0, absl::Milliseconds(100));
  EXPECT_FALSE(by_cancel.HasBeenNotified());
  cancelled = true;
  const absl::Time t1 = absl::Now();
  ASSERT_TRUE(by_cancel.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_LT(absl::Now() - t1, absl::Seconds(1));  // checked every 250 ms
}

TEST(RoutingWaiters, StopWakesTheParkedAndLaterParks) {
  ClusterState cluster(absl::Seconds(3), [] { return absl::Now(); });
  RoutingWaiters waiters(&cluster);
  const uint64_t v = cluster.RoutingVersion();
  std::atomic<int> woken{0};
  for (int i = 0; i < 3; ++i)
    waiters.Park(v, absl::Now() + absl::Minutes(1), kNever, [&] { ++woken; });
  waiters.Stop();
  EXPECT_EQ(woken.load(), 3);
  waiters.Park(v, absl::Now() + absl::Minutes(1), kNever, [&] { ++woken; });
  EXPECT_EQ(woken.load(), 4);
}

}  // namespace
}  // namespace ballast::global_scheduler
