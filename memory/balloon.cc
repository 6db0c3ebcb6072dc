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

WeightPages::~WeightPages() { owner_->ReturnWeights(addr_, bytes_, range_, lent_); }

std::pair<size_t, size_t> WeightPages::InnerPages(size_t offset, size_t len) const {
  const size_t page = owner_->page_bytes();
  const size_t start = (offset + page - 1) / page * page;
  const size_t end = (offset + len) / page * page;
  return {start, end > start ? end - start : 0};
}

absl::StatusOr<int64_t> WeightPages::Lend(size_t offset, size_t len) {
  const Extent e{offset, len};
  return Exchange({&e, 1}, {});
}

absl::StatusOr<int64_t> WeightPages::Restore(size_t offset, size_t len) {
  const Extent e{offset, len};
  auto net = Exchange({}, {&e, 1});
  if (!net.ok()) return net.status();
  return -*net;
}

absl::StatusOr<int64_t> WeightPages::Exchange(absl::Span<const Extent> lend,
                                              absl::Span<const Extent> restore) {
  std::vector<PageRange> unmap, map;
  std::map<size_t, size_t> lent, restored;  // start -> bytes
  int64_t net = 0;
  for (const Extent& e : lend) {
    if (e.offset > bytes_ || e.len > bytes_ - e.offset) {
      return absl::OutOfRangeError(absl::StrCat("weight extent [", e.offset, ", ", e.offset + e.len,
                                                ") is past the model's ", bytes_, " bytes"));
    }
    const auto [start, n] = InnerPages(e.offset, e.len);
    if (n == 0 || lent_.count(start) || !lent.emplace(start, n).second) continue;
    unmap.push_back({addr_ + start, n});
    net += static_cast<int64_t>(n);
  }
  for (const Extent& e : restore) {
    const auto [start, n] = InnerPages(e.offset, e.len);
    if (n > 0 && lent.count(start)) {
      return absl::InvalidArgumentError(absl::StrCat("weight extent at ", e.offset,
                                                     " is both lent and restored in one exchange"));
    }
    auto it = lent_.find(start);
    if (n == 0 || it == lent_.end() || !restored.emplace(start, it->second).second) continue;
    map.push_back({addr_ + start, it->second});
    net -= static_cast<int64_t>(it->second);
  }
  absl::Status st = owner_->ExchangeWeightPages(unmap, map);
  // DATA_LOSS: the pool could not map the lent ranges again; they stay
  // counted as lent, so that nothing unmaps them twice.
  if (st.ok() || absl::IsDataLoss(st)) lent_.insert(lent.begin(), lent.end());
  if (!st.ok()) return st;
  for (const auto& [start, n] : restored) lent_.erase(start);
  return net;
}

int64_t WeightPages::lent_bytes() const {
  int64_t n = 0;
  for (const auto& [off, b] : lent_) n += static_cast<int64_t>(b);
  return n;
}

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

void Balloon::ReturnWeights(uint8_t* addr, size_t bytes, size_t range,
                            const std::map<size_t, size_t>& lent) {
  // Unmap what is still mapped: the gaps between the lent parts.
  size_t at = 0;
  int64_t mapped = 0;
  auto unmap = [&](size_t from, size_t to) {
    if (to <= from) return;
    pool_->Unmap(addr + from, to - from);
    mapped += static_cast<int64_t>(to - from);
  };
  for (const auto& [off, n] : lent) {
    unmap(at, off);
    at = off + n;
  }
  unmap(at, bytes);
  absl::MutexLock lock(&mu_);
  weight_bytes_ -= mapped;
  free_ranges_.emplace(range, addr);
}

absl::Status Balloon::ExchangeWeightPages(absl::Span<const PageRange> unmap,
                                          absl::Span<const PageRange> map) {
  if (absl::Status st = pool_->Exchange(unmap, map); !st.ok()) {
    return absl::Status(st.code(), absl::StrCat("remapping weight pages: ", st.message()));
  }
  int64_t delta = 0;
  for (const PageRange& r : unmap) delta -= static_cast<int64_t>(r.bytes);
  for (const PageRange& r : map) delta += static_cast<int64_t>(r.bytes);
  absl::MutexLock lock(&mu_);
  weight_bytes_ += delta;
  return absl::OkStatus();
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

int64_t Balloon::FreeBytes() const { return std::max<int64_t>(0, HeadroomBytes()); }

int64_t Balloon::HeadroomBytes() const {
  const PagePoolStats ps = pool_->stats();
  return ps.budget_bytes - ps.mapped_bytes;
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
