#include "transfer/worker_pool.h"

#include <algorithm>
#include <utility>

#include "transfer/thread_name.h"

namespace ballast::transfer {

WorkerPool::WorkerPool(int threads, int max_queued, std::string name)
    : max_queued_(std::max(max_queued, 0)) {
  threads_.reserve(static_cast<size_t>(std::max(threads, 1)));
  for (int i = 0; i < std::max(threads, 1); ++i) {
    threads_.emplace_back([this, name] {
      NameThisThread(name);
      Run();
    });
  }
}

WorkerPool::~WorkerPool() { Stop(); }

WorkerPool::ScheduleResult WorkerPool::TrySchedule(std::function<void()> fn) {
  absl::MutexLock lock(&mu_);
  if (stopping_) return ScheduleResult::kStopped;
  if (max_queued_ > 0 && static_cast<int>(queue_.size()) >= max_queued_) {
    return ScheduleResult::kFull;
  }
  queue_.push_back(std::move(fn));
  return ScheduleResult::kQueued;
}

int WorkerPool::pending() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(queue_.size()) + running_;
}

void WorkerPool::WaitIdle() {
  absl::MutexLock lock(&mu_);
  auto idle = [this]()
                  ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return queue_.empty() && running_ == 0; };
  mu_.Await(absl::Condition(&idle));
}

bool WorkerPool::AwaitPending(int n, absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto reached = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return static_cast<int>(queue_.size()) + running_ >= n;
  };
  return mu_.AwaitWithTimeout(absl::Condition(&reached), timeout);
}

void WorkerPool::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (auto& t : threads_) {
    if (t.joinable()) t.join();
  }
}

void WorkerPool::Run() {
  while (true) {
    std::function<void()> fn;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !queue_.empty() || stopping_; };
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty()) return;  // stopping, and everything queued has run
      fn = std::move(queue_.front());
      queue_.pop_front();
      ++running_;
    }
    fn();
    absl::MutexLock lock(&mu_);
    --running_;
  }
}

}  // namespace ballast::transfer
