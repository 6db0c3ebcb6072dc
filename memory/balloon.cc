#include "memory/balloon.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace ballast::memory {

absl::StatusOr<std::shared_ptr<Balloon>> Balloon::Create(std::shared_ptr<PagePool> pool,
                                                         const BalloonOptions& o) {
  if (o.memory_bytes <= 0) return absl::InvalidArgumentError("balloon: memory_bytes must be > 0");
  KvArenaOptions ko;
  ko.slab_bytes = o.slab_bytes;
  ko.free_slab_buffer = o.free_slab_buffer;
  // Address space for the whole device, rounded up to slabs.
  ko.reserve_bytes =
      (static_cast<size_t>(o.memory_bytes) + o.slab_bytes - 1) / o.slab_bytes * o.slab_bytes;
  auto arena = KvArena::Create(pool, ko);
  if (!arena.ok()) return arena.status();
  std::shared_ptr<Balloon> b(new Balloon(std::move(pool), o));
  b->arena_ = std::move(*arena);
  absl::MutexLock lock(&b->mu_);
  b->UpdateBudget();
  return b;
}

Balloon::~Balloon() = default;  // reservations are released with the pool

WeightPages::~WeightPages() { owner_->ReturnWeights(addr_, bytes_, range_); }

absl::StatusOr<std::unique_ptr<WeightPages>> Balloon::MapWeights(size_t bytes) {
  const size_t page = pool_->page_bytes();
  const size_t need = std::max<size_t>(page, (bytes + page - 1) / page * page);
  uint8_t* addr = nullptr;
  size_t range = 0;
  {
    absl::MutexLock lock(&mu_);
    // First fit among kept ranges.
    auto it = free_ranges_.lower_bound(need);
    if (it != free_ranges_.end()) {
      range = it->first;
      addr = it->second;
      free_ranges_.erase(it);
    }
  }
  if (addr == nullptr) {
    auto r = pool_->Reserve(need);
    if (!r.ok()) return r.status();
    addr = *r;
    range = need;
    absl::MutexLock lock(&mu_);
    ++ranges_;
  }
  if (absl::Status st = pool_->Map(addr, need); !st.ok()) {
    absl::MutexLock lock(&mu_);
    free_ranges_.emplace(range, addr);  // nothing mapped: keep the range
    return absl::ResourceExhaustedError(
        absl::StrCat("weights need ", need, " bytes; ", st.message()));
  }
  {
    absl::MutexLock lock(&mu_);
    weight_bytes_ += static_cast<int64_t>(need);
  }
  return std::unique_ptr<WeightPages>(new WeightPages(shared_from_this(), addr, need, range));
}

void Balloon::ReturnWeights(uint8_t* addr, size_t bytes, size_t range) {
  pool_->Unmap(addr, bytes);
  absl::MutexLock lock(&mu_);
  weight_bytes_ -= static_cast<int64_t>(bytes);
  free_ranges_.emplace(range, addr);
}

void Balloon::SetWorkspace(const std::string& tenant, int64_t bytes) {
  absl::MutexLock lock(&mu_);
  if (bytes <= 0) {
    workspace_.erase(tenant);
  } else {
    workspace_[tenant] = bytes;
  }
  UpdateBudget();
}

void Balloon::UpdateBudget() {
  int64_t ws = 0;
  for (const auto& [t, b] : workspace_) ws += b;
  pool_->SetBudget(std::max<int64_t>(0, options_.memory_bytes - ws));
}

int64_t Balloon::FreeBytes() const {
  const PagePoolStats ps = pool_->stats();
  return std::max<int64_t>(0, ps.budget_bytes - ps.mapped_bytes);
}

BalloonStats Balloon::stats() const {
  const PagePoolStats ps = pool_->stats();
  BalloonStats s;
  s.memory_bytes = options_.memory_bytes;
  absl::MutexLock lock(&mu_);
  for (const auto& [t, b] : workspace_) s.workspace_bytes += b;
  s.weight_bytes = weight_bytes_;
  s.kv_mapped_bytes = ps.mapped_bytes - weight_bytes_;
  s.free_bytes = std::max<int64_t>(0, ps.budget_bytes - ps.mapped_bytes);
  s.weight_ranges_reserved = ranges_;
  return s;
}

}  // namespace ballast::memory
