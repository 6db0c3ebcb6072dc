// An SM partition of a device: a CUDA green context (driver 12.4+) whose
// streams run their kernels on the partition's SMs only, sharing the
// primary context's memory. The engine benchmark's interference runs use it
// to measure whether giving a latency-critical model its own SMs helps
// (issue 13: "measure it, don't assume it"); docs/benchmarks.md has the
// figures.
//
// Thread-safety: Create and the destructor are not concurrent with other
// calls; NewStream may be called from any thread.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <memory>

#include "absl/status/statusor.h"

namespace ballast::engine::cuda {

class SmPartition {
 public:
  // The first `sms` SMs of `device` (rounded up to the device's partition
  // granule: 8 on sm_90), or, with `rest`, the SMs left after them. Two
  // partitions made with the same `sms`, one with `rest`, are disjoint.
  // UNAVAILABLE when the driver has no green contexts; INVALID_ARGUMENT
  // when `sms` leaves no SMs for the rest.
  static absl::StatusOr<std::unique_ptr<SmPartition>> Create(int device, int sms, bool rest);
  ~SmPartition();
  SmPartition(const SmPartition&) = delete;
  SmPartition& operator=(const SmPartition&) = delete;

  // A non-blocking stream of the partition at `priority` (as
  // cudaStreamCreateWithPriority's); the caller destroys it
  // (cudaStreamDestroy) before the partition.
  absl::StatusOr<cudaStream_t> NewStream(int priority);
  int sm_count() const { return sm_count_; }

 private:
  struct Driver;
  SmPartition() = default;

  std::unique_ptr<Driver> drv_;
  CUgreenCtx ctx_ = nullptr;
  int sm_count_ = 0;
};

}  // namespace ballast::engine::cuda
