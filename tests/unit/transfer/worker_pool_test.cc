// WorkerPool: bounded threads, FIFO, everything queued runs before Stop
// returns, nothing runs after.
#include "transfer/worker_pool.h"

#include <atomic>
#include <set>
#include <thread>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace ballast::transfer {
namespace {

TEST(WorkerPool, RunsEverythingOnAtMostItsThreads) {
  std::atomic<int> running{0}, peak{0}, done{0};
  absl::Mutex mu;
  std::set<std::thread::id> ids;
  {
    WorkerPool pool(3);
    absl::Notification release;
    for (int i = 0; i < 40; ++i) {
      ASSERT_TRUE(pool.Schedule([&] {
        const int now = ++running;
        int p = peak.load();
        while (now > p && !peak.compare_exchange_weak(p, now)) {
        }
        {
          absl::MutexLock lock(&mu);
          ids.insert(std::this_thread::get_id());
        }
        release.WaitForNotification();
        --running;
        ++done;
      }));
    }
    release.Notify();
    pool.WaitIdle();
    EXPECT_EQ(done.load(), 40);
    EXPECT_EQ(pool.pending(), 0);
  }
  EXPECT_LE(peak.load(), 3);
  absl::MutexLock lock(&mu);
  EXPECT_LE(ids.size(), 3u);
}

TEST(WorkerPool, StopRunsWhatIsQueuedThenRefusesMore) {
  std::atomic<int> done{0};
  WorkerPool pool(1);
  for (int i = 0; i < 10; ++i) pool.Schedule([&] { ++done; });
  pool.Stop();
  EXPECT_EQ(done.load(), 10);
  EXPECT_FALSE(pool.Schedule([&] { ++done; }));
  EXPECT_EQ(done.load(), 10);
}

}  // namespace
}  // namespace ballast::transfer
