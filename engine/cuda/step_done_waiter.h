// StepDoneWaiter: runs a callback when the work queued on a CUDA stream so
// far has ended, from a thread of its own that waits on an event recorded
// after that work. It replaces a host function on the stream
// (cudaLaunchHostFunc), which holds the stream's next work until the
// callback has run on the driver's single callback thread: with each model's
// next step already queued behind its current one (ahead steps), that hold
// delays every step.
//
// Its events are created with cudaEventBlockingSync (the thread sleeps
// while it waits) unless `spin` (the thread spins: a busy core, an earlier
// wake-up).
//
// Thread-safety: NotifyAfter may be called from any thread; callbacks run
// on the waiter's thread, in the order they were asked for.
#pragma once

#include <cuda_runtime.h>

#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace ballast::engine::cuda {

class StepDoneWaiter {
 public:
  StepDoneWaiter(int device, bool spin) : device_(device), spin_(spin) {}
  // Waits for every pending callback's work and runs the callbacks.
  ~StepDoneWaiter();

  StepDoneWaiter(const StepDoneWaiter&) = delete;
  StepDoneWaiter& operator=(const StepDoneWaiter&) = delete;

  // Runs `done` once the work queued on `stream` so far has ended (or
  // failed: the caller's own wait then returns the error). The thread
  // starts on the first call. On an error recording the event nothing is
  // queued and the error is returned; `done` has not run. REQUIRES: the
  // calling thread's current device is `device` (events are made there).
  cudaError_t NotifyAfter(cudaStream_t stream, std::function<void()> done) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Pending {
    cudaEvent_t event = nullptr;
    std::function<void()> done;
  };
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);

  const int device_;
  const bool spin_;
  absl::Mutex mu_;
  std::deque<Pending> pending_ ABSL_GUARDED_BY(mu_);
  std::vector<cudaEvent_t> free_ ABSL_GUARDED_BY(mu_);  // waited for, reusable
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_ ABSL_GUARDED_BY(mu_);  // started by the first NotifyAfter
};

}  // namespace ballast::engine::cuda
