// PagePool: physical memory in fixed-size pages (2 MiB, the CUDA VMM
// granularity on H100) mapped into virtual ranges reserved up front, so
// the addresses KV blocks live at never change while the memory behind
// them comes and goes.
//
// Implementations: HostPagePool (below; mmap(PROT_NONE) reserve, commit by
// mprotect, release by madvise(DONTNEED)) so everything runs and is tested
// without a GPU; the CUDA VMM backend implements the same interface.
// Every map/unmap is a "driver call" and is counted, so tests and metrics
// can check that the hot path makes none.
//
// Thread-safety: implementations are thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"

namespace ballast::memory {

struct PagePoolStats {
  int64_t map_calls = 0;
  int64_t unmap_calls = 0;
  int64_t mapped_bytes = 0;
  int64_t budget_bytes = 0;
};

// [addr, addr + bytes) of a reserved range, page aligned.
struct PageRange {
  uint8_t* addr = nullptr;
  size_t bytes = 0;
};

class PagePool {
 public:
  virtual ~PagePool() = default;
  virtual size_t page_bytes() const = 0;
  // Reserves `bytes` (a multiple of page_bytes) of address space; no memory.
  virtual absl::StatusOr<uint8_t*> Reserve(size_t bytes) = 0;
  // Backs [addr, addr + bytes) with memory. RESOURCE_EXHAUSTED (and nothing
  // mapped) if that would pass the budget.
  virtual absl::Status Map(uint8_t* addr, size_t bytes) = 0;
  // Returns the memory behind [addr, addr + bytes) to the pool.
  virtual void Unmap(uint8_t* addr, size_t bytes) = 0;
  // Unmaps `unmap` and maps `map` as one step: the budget check counts the
  // unmapped bytes as free, and no other caller can map them in between
  // (parameter remapping lends some weight layers and takes others back).
  // RESOURCE_EXHAUSTED, with nothing changed, when the result would pass
  // the budget (unless it maps less than it unmaps). A failed map after the
  // unmaps: INTERNAL when the unmapped ranges were mapped again (their
  // contents lost: the caller rewrites them), DATA_LOSS when they could not
  // be. The ranges in `unmap` and `map` must be distinct.
  virtual absl::Status Exchange(absl::Span<const PageRange> unmap,
                                absl::Span<const PageRange> map) = 0;
  // Bytes that may be mapped at once (the device's share for KV).
  virtual void SetBudget(int64_t bytes) = 0;
  virtual PagePoolStats stats() const = 0;
};

// PagePool::Exchange's budget check, order and undo, for implementations:
// called with the pool's lock held, over its lock-held map (which checks no
// budget) and unmap.
absl::Status ExchangeRanges(const PagePoolStats& stats, absl::Span<const PageRange> unmap,
                            absl::Span<const PageRange> map,
                            absl::FunctionRef<absl::Status(const PageRange&)> map_locked,
                            absl::FunctionRef<void(const PageRange&)> unmap_locked);

class HostPagePool final : public PagePool {
 public:
  static absl::StatusOr<std::unique_ptr<HostPagePool>> Create(size_t page_bytes,
                                                              int64_t budget_bytes);
  ~HostPagePool() override;

  size_t page_bytes() const override { return page_bytes_; }
  absl::StatusOr<uint8_t*> Reserve(size_t bytes) override;
  absl::Status Map(uint8_t* addr, size_t bytes) override;
  void Unmap(uint8_t* addr, size_t bytes) override;
  absl::Status Exchange(absl::Span<const PageRange> unmap,
                        absl::Span<const PageRange> map) override;
  void SetBudget(int64_t bytes) override;
  PagePoolStats stats() const override;

 private:
  HostPagePool(size_t page_bytes, int64_t budget) : page_bytes_(page_bytes) {
    stats_.budget_bytes = budget;
  }
  // REQUIRES: mu_ held. MapLocked checks no budget.
  absl::Status MapLocked(uint8_t* addr, size_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UnmapLocked(uint8_t* addr, size_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  const size_t page_bytes_;
  mutable absl::Mutex mu_;
  PagePoolStats stats_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<uint8_t*, size_t>> reservations_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ballast::memory
