#include "memory/page_pool.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"

namespace ballast::memory {

absl::StatusOr<std::unique_ptr<HostPagePool>> HostPagePool::Create(size_t page_bytes,
                                                                   int64_t budget_bytes) {
  if (page_bytes == 0 || page_bytes % 4096 != 0) {
    return absl::InvalidArgumentError("page size must be a positive multiple of 4 KiB");
  }
  return std::unique_ptr<HostPagePool>(new HostPagePool(page_bytes, budget_bytes));
}

HostPagePool::~HostPagePool() {
  absl::MutexLock lock(&mu_);
  for (auto& [p, n] : reservations_) munmap(p, n);
}

absl::StatusOr<uint8_t*> HostPagePool::Reserve(size_t bytes) {
  if (bytes == 0 || bytes % page_bytes_ != 0) {
    return absl::InvalidArgumentError("reservation must be a positive multiple of the page size");
  }
  void* p = mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot reserve ", bytes, " bytes: ", std::strerror(errno)));
  }
  absl::MutexLock lock(&mu_);
  reservations_.push_back({static_cast<uint8_t*>(p), bytes});
  return static_cast<uint8_t*>(p);
}

absl::Status HostPagePool::Map(uint8_t* addr, size_t bytes) {
  absl::MutexLock lock(&mu_);
  if (stats_.mapped_bytes + static_cast<int64_t>(bytes) > stats_.budget_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("page pool: mapping ", bytes, " bytes would pass the budget (",
                     stats_.mapped_bytes, " of ", stats_.budget_bytes, " mapped)"));
  }
  return MapLocked(addr, bytes);
}

absl::Status HostPagePool::MapLocked(uint8_t* addr, size_t bytes) {
  if (mprotect(addr, bytes, PROT_READ | PROT_WRITE) != 0) {
    return absl::InternalError(absl::StrCat("mprotect: ", std::strerror(errno)));
  }
  stats_.mapped_bytes += static_cast<int64_t>(bytes);
  ++stats_.map_calls;
  return absl::OkStatus();
}

void HostPagePool::Unmap(uint8_t* addr, size_t bytes) {
  absl::MutexLock lock(&mu_);
  UnmapLocked(addr, bytes);
}

void HostPagePool::UnmapLocked(uint8_t* addr, size_t bytes) {
  // Drop the pages (the next Map sees zeros) and make the range unusable.
  madvise(addr, bytes, MADV_DONTNEED);
  mprotect(addr, bytes, PROT_NONE);
  stats_.mapped_bytes -= static_cast<int64_t>(bytes);
  ++stats_.unmap_calls;
}

absl::Status ExchangeRanges(const PagePoolStats& stats, absl::Span<const PageRange> unmap,
                            absl::Span<const PageRange> map,
                            absl::FunctionRef<absl::Status(const PageRange&)> map_locked,
                            absl::FunctionRef<void(const PageRange&)> unmap_locked) {
  int64_t after = stats.mapped_bytes;
  for (const PageRange& r : unmap) after -= static_cast<int64_t>(r.bytes);
  for (const PageRange& r : map) after += static_cast<int64_t>(r.bytes);
  // Over the budget already (a workspace charge lowered it): an exchange
  // that maps less than it unmaps still goes through.
  if (after > stats.budget_bytes && after > stats.mapped_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("page pool: the exchange would map ", after,
                                                     " bytes, past the budget of ",
                                                     stats.budget_bytes));
  }
  for (const PageRange& r : unmap) unmap_locked(r);
  for (size_t i = 0; i < map.size(); ++i) {
    if (absl::Status st = map_locked(map[i]); !st.ok()) {
      for (size_t j = 0; j < i; ++j) unmap_locked(map[j]);
      bool back = true;
      for (const PageRange& r : unmap) back &= map_locked(r).ok();
      return back ? absl::InternalError(
                        absl::StrCat("page pool: exchange: ", st.message(),
                                     "; the unmapped ranges are mapped again, contents lost"))
                  : absl::DataLossError(
                        absl::StrCat("page pool: exchange: ", st.message(),
                                     "; the unmapped ranges could not be mapped again"));
    }
  }
  return absl::OkStatus();
}

absl::Status HostPagePool::Exchange(absl::Span<const PageRange> unmap,
                                    absl::Span<const PageRange> map) {
  absl::MutexLock lock(&mu_);
  return ExchangeRanges(
      stats_, unmap, map,
      [this](const PageRange& r)
          ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return MapLocked(r.addr, r.bytes); },
      [this](const PageRange& r)
          ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { UnmapLocked(r.addr, r.bytes); });
}

void HostPagePool::SetBudget(int64_t bytes) {
  absl::MutexLock lock(&mu_);
  stats_.budget_bytes = bytes;
}

PagePoolStats HostPagePool::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

}  // namespace ballast::memory
