// StepDoneWaiter on the GPU: each callback runs after the stream's work
// queued before it has ended, in the order asked for, and, unlike a host
// function on the stream, a callback that has not returned holds none of
// the stream's later work. Spinning and sleeping waiters alike.
#include "engine/cuda/step_done_waiter.h"

#include <cuda_runtime.h>

#include <atomic>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/gpu/gpu_harness.h"

namespace ballast::engine::cuda {
namespace {

constexpr size_t kBytes = 512u << 20;  // one memset: ~0.2 ms on an H200

class StepDoneWaiterTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    BALLAST_SKIP_WITHOUT_GPU();
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&buf_, kBytes), cudaSuccess);
  }
  void TearDown() override {
    if (stream_) cudaStreamSynchronize(stream_);
    if (buf_) cudaFree(buf_);
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
    if (stream_) cudaStreamDestroy(stream_);
  }
  // Queues `n` memsets, then an event recorded after them.
  cudaEvent_t Work(int n) {
    for (int i = 0; i < n; ++i) EXPECT_EQ(cudaMemsetAsync(buf_, i, kBytes, stream_), cudaSuccess);
    cudaEvent_t e = nullptr;
    EXPECT_EQ(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), cudaSuccess);
    EXPECT_EQ(cudaEventRecord(e, stream_), cudaSuccess);
    events_.push_back(e);
    return e;
  }

  cudaStream_t stream_ = nullptr;
  void* buf_ = nullptr;
  std::vector<cudaEvent_t> events_;
};

TEST_P(StepDoneWaiterTest, CallbacksRunAfterTheirWorkInOrder) {
  std::vector<int> order;
  std::atomic<int> early{0};
  {
    StepDoneWaiter waiter(0, GetParam());
    for (int i = 0; i < 8; ++i) {
      const cudaEvent_t before = Work(4);
      ASSERT_EQ(waiter.NotifyAfter(stream_,
                                   [&, i, before] {
                                     if (cudaEventQuery(before) != cudaSuccess) early++;
                                     order.push_back(i);  // callbacks run on one thread
                                   }),
                cudaSuccess);
    }
  }  // the destructor runs what is still pending
  EXPECT_EQ(early.load(), 0);
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
}

TEST_P(StepDoneWaiterTest, ACallbackStillRunningHoldsNoLaterWork) {
  StepDoneWaiter waiter(0, GetParam());
  absl::Notification in_callback, release;
  Work(2);
  ASSERT_EQ(waiter.NotifyAfter(stream_,
                               [&] {
                                 in_callback.Notify();
                                 release.WaitForNotification();
                               }),
            cudaSuccess);
  const cudaEvent_t later = Work(2);
  in_callback.WaitForNotification();
  // A host function in the callback's place would hold `later` until the
  // callback returned, which it does only after this wait: it would end
  // at the deadline, not done.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  cudaError_t state = cudaErrorNotReady;
  while (state == cudaErrorNotReady && absl::Now() < deadline) {
    state = cudaEventQuery(later);
    if (state == cudaErrorNotReady) absl::SleepFor(absl::Microseconds(100));
  }
  EXPECT_EQ(state, cudaSuccess);
  release.Notify();
}

INSTANTIATE_TEST_SUITE_P(SleepingAndSpinning, StepDoneWaiterTest, ::testing::Bool());

}  // namespace
}  // namespace ballast::engine::cuda
