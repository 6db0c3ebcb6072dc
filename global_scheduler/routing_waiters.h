// RoutingWaiters: requests that wait for a replica of their model without
// holding a thread. A waiter is parked with the routing version it saw
// (ClusterState::RoutingVersion), its deadline and a cancellation check;
// its `wake` is called exactly once, on the waiters' own thread, when the
// cluster's routing version differs from the one it saw, its deadline has
// passed, `cancelled()` turns true (checked at least every 250 ms), or the
// waiters stop. The woken request routes again (and may park again).
//
// This replaces a blocking wait per request: the scheduler's routing pool
// is bounded, and requests waiting for a cold model must not hold its
// threads while requests for ready models queue behind them.
//
// Thread-safety: Park and Stop are thread-safe. `wake` runs without the
// waiters' lock held and may call Park again.
#pragma once

#include <functional>
#include <list>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "global_scheduler/cluster_state.h"

namespace ballast::global_scheduler {

class RoutingWaiters {
 public:
  // `cluster` must outlive this object.
  explicit RoutingWaiters(const ClusterState* cluster);
  ~RoutingWaiters();  // Stop()
  RoutingWaiters(const RoutingWaiters&) = delete;
  RoutingWaiters& operator=(const RoutingWaiters&) = delete;

  // Parks a waiter (see above); wakes it at once if the version already
  // changed or the waiters stopped.
  void Park(uint64_t seen_version, absl::Time deadline, std::function<bool()> cancelled,
            std::function<void()> wake);
  // Wakes every waiter and ends the thread; later Parks wake at once.
  void Stop();
  // Waiters parked now (tests, metrics).
  int parked() const;

 private:
  struct Waiter {
    uint64_t version;
    absl::Time deadline;
    std::function<bool()> cancelled;
    std::function<void()> wake;
  };
  void Loop();
  // Moves the waiters that are due into `due`. REQUIRES: mu_ held.
  void TakeDue(uint64_t version, absl::Time now, std::list<Waiter>* due)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ClusterState* const cluster_;
  mutable absl::Mutex mu_;
  std::list<Waiter> waiters_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace ballast::global_scheduler
