// WorkerPool: bounded threads, FIFO, everything queued runs before Stop
// returns, nothing runs after; a bounded queue refuses past its bound.
#include "transfer/worker_pool.h"

#include <pthread.h>

#include <atomic>
#include <set>
#include <string>
#include <thread>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "transfer/thread_name.h"

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

// Two waiting closures fill a queue of 2 (the running one does not count):
// the next is refused kFull and dropped; once the queue drains it takes
// closures again; after Stop, kStopped.
TEST(WorkerPool, ABoundedQueueRefusesWhenFull) {
  using Result = WorkerPool::ScheduleResult;
  std::atomic<int> done{0};
  WorkerPool pool(1, /*max_queued=*/2);
  absl::Notification started, release;
  ASSERT_EQ(pool.TrySchedule([&] {
    started.Notify();
    release.WaitForNotification();
    ++done;
  }),
            Result::kQueued);
  started.WaitForNotification();  // running: the queue is empty again
  EXPECT_EQ(pool.TrySchedule([&] { ++done; }), Result::kQueued);
  EXPECT_EQ(pool.TrySchedule([&] { ++done; }), Result::kQueued);
  EXPECT_EQ(pool.TrySchedule([&] { done += 100; }), Result::kFull);
  EXPECT_FALSE(pool.Schedule([&] { done += 100; }));
  release.Notify();
  pool.WaitIdle();
  EXPECT_EQ(done.load(), 3);
  EXPECT_EQ(pool.TrySchedule([&] { ++done; }), Result::kQueued);
  pool.Stop();
  EXPECT_EQ(done.load(), 4);
  EXPECT_EQ(pool.TrySchedule([&] { ++done; }), Result::kStopped);
}

// The calling thread's name, as top -H shows it.
std::string ThreadName() {
  char name[32] = {};
  pthread_getname_np(pthread_self(), name, sizeof(name));
  return name;
}

// The pool's threads carry its name (cut to Linux's 15 bytes), so top -H
// tells the daemon's pools apart.
TEST(WorkerPool, ThreadsCarryThePoolsName) {
  std::string seen;
  {
    WorkerPool pool(1, 0, "node-deliver");
    ASSERT_TRUE(pool.Schedule([&] { seen = ThreadName(); }));
  }  // Stop ran it and joined
  EXPECT_EQ(seen, "node-deliver");
  {
    WorkerPool pool(1, 0, "a-name-longer-than-fifteen");
    ASSERT_TRUE(pool.Schedule([&] { seen = ThreadName(); }));
  }
  EXPECT_EQ(seen, std::string("a-name-longer-than-fifteen").substr(0, kMaxThreadName));
  std::thread t([&] {
    NameThisThread("step-cuda:0");
    seen = ThreadName();
  });
  t.join();
  EXPECT_EQ(seen, "step-cuda:0");
}

}  // namespace
}  // namespace ballast::transfer
