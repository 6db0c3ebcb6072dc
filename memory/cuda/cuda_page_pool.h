// CudaPagePool: the PagePool backend over CUDA virtual memory management
// (cuMemCreate / cuMemMap / cuMemSetAccess / cuMemUnmap / cuMemRelease).
//
// Physical handles of `handle_bytes` are created once and pooled: unmapping
// returns a handle to the pool and mapping reuses one, so the steady state
// makes no cuMemCreate/cuMemRelease calls (kvcached creates a handle per
// page it maps). Driver entry points are looked up through the runtime
// (cudaGetDriverEntryPointByVersion), so the binary needs no libcuda at link
// time and Create() fails cleanly on machines without a GPU.
//
// Thread-safety: thread-safe (one mutex).
#pragma once

#include <map>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "memory/page_pool.h"

namespace ballast::memory {

struct CudaDriverCalls {
  int64_t create = 0, map = 0, set_access = 0, unmap = 0, release = 0;
};

class CudaPagePool final : public PagePool {
 public:
  // page_bytes: the mapping unit, a multiple of the device's VMM
  // granularity (2 MiB on H100). UNAVAILABLE without a usable GPU.
  static absl::StatusOr<std::unique_ptr<CudaPagePool>> Create(int device, size_t page_bytes,
                                                              int64_t budget_bytes);
  ~CudaPagePool() override;

  size_t page_bytes() const override { return page_bytes_; }
  absl::StatusOr<uint8_t*> Reserve(size_t bytes) override;
  absl::Status Map(uint8_t* addr, size_t bytes) override;
  void Unmap(uint8_t* addr, size_t bytes) override;
  absl::Status Exchange(absl::Span<const PageRange> unmap,
                        absl::Span<const PageRange> map) override;
  void SetBudget(int64_t bytes) override;
  PagePoolStats stats() const override;

  CudaDriverCalls driver_calls() const;
  // Creates handles up front so later maps make no cuMemCreate call.
  absl::Status Prewarm(size_t bytes);
  // Releases pooled (unmapped) handles back to the driver.
  void ReleasePooled();
  size_t granularity() const { return granularity_; }

 private:
  struct Driver;
  CudaPagePool(int device, size_t page_bytes, int64_t budget);
  absl::StatusOr<unsigned long long> TakeHandle() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // REQUIRES: mu_ held. MapLocked checks no budget; all or nothing.
  absl::Status MapLocked(uint8_t* addr, size_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UnmapLocked(uint8_t* addr, size_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int device_;
  const size_t page_bytes_;
  size_t granularity_ = 0;
  std::unique_ptr<Driver> drv_;
  mutable absl::Mutex mu_;
  PagePoolStats stats_ ABSL_GUARDED_BY(mu_);
  CudaDriverCalls calls_ ABSL_GUARDED_BY(mu_);
  std::vector<unsigned long long> pooled_ ABSL_GUARDED_BY(mu_);         // unmapped handles
  std::map<uint8_t*, unsigned long long> mapped_ ABSL_GUARDED_BY(mu_);  // page address -> handle
  std::vector<std::pair<uint8_t*, size_t>> reservations_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ballast::memory
