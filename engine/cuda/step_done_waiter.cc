#include "engine/cuda/step_done_waiter.h"

#include <utility>

#include "transfer/thread_name.h"

namespace ballast::engine::cuda {

StepDoneWaiter::~StepDoneWaiter() {
  std::thread thread;
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    thread = std::move(thread_);
  }
  if (thread.joinable()) thread.join();  // runs what is pending first
  absl::MutexLock lock(&mu_);
  for (cudaEvent_t e : free_) cudaEventDestroy(e);
}

cudaError_t StepDoneWaiter::NotifyAfter(cudaStream_t stream, std::function<void()> done) {
  absl::MutexLock lock(&mu_);
  cudaEvent_t event = nullptr;
  if (!free_.empty()) {
    event = free_.back();
    free_.pop_back();
  } else if (cudaError_t err = cudaEventCreateWithFlags(
                 &event, cudaEventDisableTiming | (spin_ ? 0 : cudaEventBlockingSync));
             err != cudaSuccess) {
    return err;
  }
  if (cudaError_t err = cudaEventRecord(event, stream); err != cudaSuccess) {
    free_.push_back(event);
    return err;
  }
  pending_.push_back({event, std::move(done)});
  if (!thread_.joinable()) {
    thread_ = std::thread([this] {
      transfer::NameThisThread("step-done");
      Loop();
    });
  }
  return cudaSuccess;
}

void StepDoneWaiter::Loop() {
  cudaSetDevice(device_);
  while (true) {
    Pending p;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !pending_.empty(); };
      mu_.Await(absl::Condition(&ready));
      if (pending_.empty()) return;  // stopping, nothing left to wait for
      p = std::move(pending_.front());
      pending_.pop_front();
    }
    // An error (a failed step) ends the wait too; the step's owner reads
    // it from its own wait.
    cudaEventSynchronize(p.event);
    cudaGetLastError();
    p.done();
    absl::MutexLock lock(&mu_);
    free_.push_back(p.event);
  }
}

}  // namespace ballast::engine::cuda
