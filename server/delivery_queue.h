// DeliveryQueue: runs the node's Generate streams' pumps (building the next
// message and starting its gRPC write, server/node_generate.h) on a few
// threads of a transfer::WorkerPool, off the engines' step threads.
//
// Posts are batched: Post only queues the pump and schedules a pool task
// when no task is draining the queue (or when the backlog calls for one
// more, up to the pool's size). A step that streams tokens to N streams
// thus wakes the pool about once, not N times: each wake is a futex
// syscall on the step thread and, on a busy host, lets the woken thread
// preempt it.
//
// Thread-safety: Post is thread-safe. The destructor stops the pool, which
// first runs every pump already queued; a Post that the stopping pool
// refuses runs the queue inline, so no pump is lost. No Post may begin
// once the destructor has begun (shut the gRPC server down first).
#pragma once

#include <deque>
#include <functional>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "transfer/worker_pool.h"

namespace ballast::server {

class DeliveryQueue {
 public:
  // `threads` >= 1: the most pumps that run at once.
  explicit DeliveryQueue(int threads);
  DeliveryQueue(const DeliveryQueue&) = delete;
  DeliveryQueue& operator=(const DeliveryQueue&) = delete;

  // Runs `pump` soon on a pool thread (inline if the pool is stopping).
  void Post(std::function<void()> pump) ABSL_LOCKS_EXCLUDED(mu_);

  // Pool tasks started so far (tests: bursts share tasks).
  int drains_started() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // Pumps queued while the backlog is at most this: one draining task.
  static constexpr size_t kBacklogPerDrain = 8;
  // Pumps a draining task takes at a time (others may take the rest).
  static constexpr size_t kBatch = 16;

  // A pool task: runs queued pumps until none is left.
  void Drain() ABSL_LOCKS_EXCLUDED(mu_);

  const int max_draining_;
  mutable absl::Mutex mu_;
  std::deque<std::function<void()>> ready_ ABSL_GUARDED_BY(mu_);
  int draining_ ABSL_GUARDED_BY(mu_) = 0;  // tasks scheduled or running
  int drains_started_ ABSL_GUARDED_BY(mu_) = 0;
  // Last: destroyed first, its Stop runs what is queued while the rest stands.
  transfer::WorkerPool pool_;
};

}  // namespace ballast::server
