// WorkerPool: a fixed set of threads that run queued closures in FIFO order.
// The scheduler's blocking control-plane calls (LoadModel, EvictModel with a
// drain, DropSession) and the KV tiers' checksum verification run on one,
// so the number of threads is bounded by the pool size however much work
// is queued, instead of one thread per call.
//
// Thread-safety: Schedule and Stop are thread-safe. Stop() (also run by the
// destructor) runs every closure already queued, then joins the threads;
// Schedule after Stop returns false and drops the closure.
#pragma once

#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace ballast::transfer {

class WorkerPool {
 public:
  // `threads` >= 1.
  explicit WorkerPool(int threads);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // Queues `fn`; false (and `fn` dropped) once Stop has begun.
  bool Schedule(std::function<void()> fn) ABSL_LOCKS_EXCLUDED(mu_);
  // Closures queued or running.
  int pending() const ABSL_LOCKS_EXCLUDED(mu_);
  // Blocks until nothing is queued or running (tests).
  void WaitIdle() ABSL_LOCKS_EXCLUDED(mu_);
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Run() ABSL_LOCKS_EXCLUDED(mu_);

  mutable absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  int running_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace ballast::transfer
