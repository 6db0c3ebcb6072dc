#include "global_scheduler/routing_waiters.h"

#include <algorithm>
#include <utility>

#include "transfer/thread_name.h"

namespace ballast::global_scheduler {
namespace {
// The longest a cancelled waiter stays parked.
constexpr absl::Duration kCancelCheck = absl::Milliseconds(250);
}  // namespace

RoutingWaiters::RoutingWaiters(const ClusterState* cluster)
    : cluster_(cluster), thread_([this] {
        transfer::NameThisThread("sched-waiters");
        Loop();
      }) {}

RoutingWaiters::~RoutingWaiters() { Stop(); }

void RoutingWaiters::Park(uint64_t seen_version, absl::Time deadline,
                          std::function<bool()> cancelled, std::function<void()> wake) {
  {
    absl::MutexLock lock(&mu_);
    if (!stop_ && cluster_->RoutingVersion() == seen_version) {
      waiters_.push_back({seen_version, deadline, std::move(cancelled), std::move(wake)});
      return;
    }
  }
  wake();
}

void RoutingWaiters::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

int RoutingWaiters::parked() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(waiters_.size());
}

void RoutingWaiters::TakeDue(uint64_t version, absl::Time now, std::list<Waiter>* due) {
  for (auto it = waiters_.begin(); it != waiters_.end();) {
    if (stop_ || it->version != version || now >= it->deadline || it->cancelled()) {
      auto next = std::next(it);
      due->splice(due->end(), waiters_, it);
      it = next;
    } else {
      ++it;
    }
  }
}

void RoutingWaiters::Loop() {
  absl::MutexLock lock(&mu_);
  while (true) {
    const uint64_t version = cluster_->RoutingVersion();
    std::list<Waiter> due;
    TakeDue(version, absl::Now(), &due);
    if (!due.empty()) {
      mu_.Unlock();
      for (Waiter& w : due) w.wake();
      mu_.Lock();
      continue;
    }
    if (stop_) return;
    if (waiters_.empty()) {
      // Nothing to watch: sleep until a Park or Stop.
      auto wanted = [this]()
                        ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !waiters_.empty(); };
      mu_.Await(absl::Condition(&wanted));
      continue;
    }
    absl::Time next = absl::Now() + kCancelCheck;
    for (const Waiter& w : waiters_) next = std::min(next, w.deadline);
    mu_.Unlock();
    cluster_->WaitForRoutingChange(version, std::max(absl::ZeroDuration(), next - absl::Now()));
    mu_.Lock();
  }
}

}  // namespace ballast::global_scheduler
