#include "server/delivery_queue.h"

#include <algorithm>
#include <utility>
#include <vector>

namespace ballast::server {

DeliveryQueue::DeliveryQueue(int threads)
    : max_draining_(std::max(threads, 1)), pool_(std::max(threads, 1), 0, "node-deliver") {}

void DeliveryQueue::Post(std::function<void()> pump) {
  bool start = false;
  {
    absl::MutexLock lock(&mu_);
    ready_.push_back(std::move(pump));
    // A running task takes what is queued while it runs (checked under
    // mu_ before it ends), so another starts only for a backlog.
    start = draining_ == 0 || (draining_ < max_draining_ &&
                               ready_.size() > kBacklogPerDrain * static_cast<size_t>(draining_));
    if (start) {
      ++draining_;
      ++drains_started_;
    }
  }
  if (start && !pool_.Schedule([this] { Drain(); })) Drain();  // stopping: inline
}

int DeliveryQueue::drains_started() const {
  absl::MutexLock lock(&mu_);
  return drains_started_;
}

void DeliveryQueue::Drain() {
  std::vector<std::function<void()>> batch;
  batch.reserve(kBatch);
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (ready_.empty()) {
        --draining_;
        return;
      }
      while (!ready_.empty() && batch.size() < kBatch) {
        batch.push_back(std::move(ready_.front()));
        ready_.pop_front();
      }
    }
    for (auto& pump : batch) pump();
    batch.clear();
  }
}

}  // namespace ballast::server
