// WorkerPool: a fixed set of threads that run queued closures in FIFO order.
// The scheduler's blocking control-plane calls (LoadModel, EvictModel with a
// drain, DropSession) and the KV tiers' checksum verification run on one,
// so the number of threads is bounded by the pool size however much work
// is queued, instead of one thread per call. A pool may also bound its
// queue (the scheduler's Advise pool): past the bound, TrySchedule refuses
// and the caller answers at once instead of queueing without end.
//
// Thread-safety: Schedule, TrySchedule and Stop are thread-safe. Stop()
// (also run by the destructor) runs every closure already queued, then
// joins the threads; Schedule after Stop returns false and drops the
// closure.
#pragma once

#include <deque>
#include <functional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace ballast::transfer {

class WorkerPool {
 public:
  enum class ScheduleResult { kQueued, kFull, kStopped };

  // `threads` >= 1. `max_queued` > 0: at most that many closures wait for
  // a thread (TrySchedule refuses more); 0: no bound. `name`: the threads'
  // name (transfer/thread_name.h; at most 15 bytes are kept).
  explicit WorkerPool(int threads, int max_queued = 0, std::string name = "ballast-pool");
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // Queues `fn`; false (and `fn` dropped) once Stop has begun or, in a
  // bounded pool, while the queue is full.
  bool Schedule(std::function<void()> fn) ABSL_LOCKS_EXCLUDED(mu_) {
    return TrySchedule(std::move(fn)) == ScheduleResult::kQueued;
  }
  // Queues `fn`, or says why not (`fn` dropped): kFull while max_queued
  // closures wait (running ones do not count), kStopped once Stop has begun.
  ScheduleResult TrySchedule(std::function<void()> fn) ABSL_LOCKS_EXCLUDED(mu_);
  // Closures queued or running.
  int pending() const ABSL_LOCKS_EXCLUDED(mu_);
  // Blocks until nothing is queued or running (tests).
  void WaitIdle() ABSL_LOCKS_EXCLUDED(mu_);
  // Blocks until at least `n` closures are queued or running, or `timeout`
  // passed; whether they are (tests).
  bool AwaitPending(int n, absl::Duration timeout) const ABSL_LOCKS_EXCLUDED(mu_);
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Run() ABSL_LOCKS_EXCLUDED(mu_);

  const int max_queued_;  // 0: no bound
  mutable absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  int running_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace ballast::transfer
