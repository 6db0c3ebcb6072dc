#include "memory/kv_arena.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace ballast::memory {

size_t ChooseSlabBytes(const std::vector<size_t>& block_sizes, size_t page_bytes,
                       size_t max_slab_bytes) {
  size_t lcm = page_bytes;
  for (size_t b : block_sizes) {
    lcm = std::lcm(lcm, b);
    if (lcm > max_slab_bytes) break;
  }
  if (lcm <= max_slab_bytes) return lcm;  // zero tail waste
  for (size_t s = page_bytes; s <= max_slab_bytes; s += page_bytes) {
    bool ok = true;
    for (size_t b : block_sizes)
      ok = ok && b <= s && static_cast<double>(s % b) < 0.03 * static_cast<double>(s);
    if (ok) return s;
  }
  return max_slab_bytes;
}

// The per-model BlockAllocator: a block size class of the arena.
class KvArena::View final : public BlockAllocator {
 public:
  View(KvArena* arena, int cls, int tenant, size_t block_bytes)
      : arena_(arena), cls_(cls), tenant_(tenant), block_bytes_(block_bytes) {}
  ~View() override {
    absl::MutexLock lock(&arena_->mu_);
    --arena_->classes_[cls_].views;
    arena_->tenants_[tenant_].alive = false;
    arena_->tenants_[tenant_].growth_bytes = 0;
  }
  absl::StatusOr<std::vector<BlockId>> Allocate(int n) override {
    return arena_->Allocate(cls_, tenant_, n);
  }
  absl::StatusOr<std::vector<BlockId>> AllocateForMove(int n) override {
    return arena_->AllocateForMove(cls_, tenant_, n);
  }
  absl::Status Free(absl::Span<const BlockId> blocks) override {
    return arena_->Free(cls_, tenant_, blocks);
  }
  uint8_t* Address(BlockId id) override { return arena_->Address(cls_, id); }
  size_t block_bytes() const override { return block_bytes_; }
  BlockAddressing addressing() const override {
    static_assert(kMaxBlocksPerSlab == 1 << 16, "slab_shift below");
    return {arena_->base_, 16, arena_->options_.slab_bytes, block_bytes_};
  }
  int64_t num_total() const override { return arena_->Capacity(cls_, tenant_, false); }
  int64_t num_free() const override {
    return std::max<int64_t>(0, arena_->Capacity(cls_, tenant_, false) - UsedBlocks());
  }
  int64_t num_max() const override { return arena_->Capacity(cls_, tenant_, true); }
  void set_growth_reserve(int64_t bytes) override { arena_->SetGrowth(tenant_, bytes); }
  int64_t others_growth_blocks() const override {
    const auto b = static_cast<int64_t>(block_bytes_);
    return (arena_->GrowthOfOthers(tenant_) + b - 1) / b;
  }
  int tenant() const { return tenant_; }

 private:
  int64_t UsedBlocks() const {
    absl::MutexLock lock(&arena_->mu_);
    return arena_->tenants_[tenant_].used_bytes / static_cast<int64_t>(block_bytes_);
  }
  KvArena* arena_;
  int cls_;
  int tenant_;
  size_t block_bytes_;
};

absl::StatusOr<std::unique_ptr<KvArena>> KvArena::Create(std::shared_ptr<PagePool> pool,
                                                         const KvArenaOptions& o) {
  if (o.slab_bytes == 0 || o.slab_bytes % pool->page_bytes() != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "slab_bytes ", o.slab_bytes, " must be a multiple of the page size ", pool->page_bytes()));
  }
  const size_t slabs = o.reserve_bytes / o.slab_bytes;
  if (slabs == 0 || slabs > static_cast<size_t>(INT32_MAX / kMaxBlocksPerSlab)) {
    return absl::InvalidArgumentError("reserve_bytes / slab_bytes must be between 1 and 32767");
  }
  auto base = pool->Reserve(slabs * o.slab_bytes);
  if (!base.ok()) return base.status();
  return std::unique_ptr<KvArena>(new KvArena(std::move(pool), o, *base));
}

KvArena::KvArena(std::shared_ptr<PagePool> pool, const KvArenaOptions& o, uint8_t* base)
    : pool_(std::move(pool)), options_(o), base_(base) {
  const int n = static_cast<int>(o.reserve_bytes / o.slab_bytes);
  slabs_.resize(n);
  for (int i = n - 1; i >= 0; --i) unmapped_.push_back(i);  // carve from the low end
}

KvArena::~KvArena() {
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < slabs_.size(); ++i) {
    if (slabs_[i].state != Slab::State::kUnmapped) {
      pool_->Unmap(base_ + i * options_.slab_bytes, options_.slab_bytes);
    }
  }
}

absl::StatusOr<std::unique_ptr<BlockAllocator>> KvArena::CreateAllocator(size_t block_bytes,
                                                                         TenantLimits limits) {
  if (block_bytes < 64 || block_bytes > options_.slab_bytes ||
      options_.slab_bytes / block_bytes > static_cast<size_t>(kMaxBlocksPerSlab)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "block size ", block_bytes, " does not fit slabs of ", options_.slab_bytes, " bytes"));
  }
  absl::MutexLock lock(&mu_);
  int cls = -1;
  for (size_t i = 0; i < classes_.size(); ++i)
    if (classes_[i].block_bytes == block_bytes) cls = static_cast<int>(i);
  if (cls < 0) {
    if (classes_.size() >= static_cast<size_t>(kMaxBlockSizes)) {
      return absl::ResourceExhaustedError("KV arena: too many distinct block sizes");
    }
    block_bytes_of_[classes_.size()].store(block_bytes);
    Class c;
    c.block_bytes = block_bytes;
    c.blocks_per_slab = static_cast<int>(options_.slab_bytes / block_bytes);
    classes_.push_back(c);
    cls = static_cast<int>(classes_.size()) - 1;
  }
  ++classes_[cls].views;
  tenants_.push_back(Tenant{limits, 0, true});
  return std::unique_ptr<BlockAllocator>(
      new View(this, cls, static_cast<int>(tenants_.size()) - 1, block_bytes));
}

absl::Status KvArena::SetLimits(const BlockAllocator* allocator, TenantLimits limits) {
  const auto* view = dynamic_cast<const View*>(allocator);
  if (view == nullptr) return absl::InvalidArgumentError("allocator is not a KV arena view");
  if (limits.floor_bytes < 0 || limits.limit_bytes < limits.floor_bytes) {
    return absl::InvalidArgumentError("tenant limits need 0 <= floor_bytes <= limit_bytes");
  }
  absl::MutexLock lock(&mu_);
  tenants_[view->tenant()].limits = limits;
  return absl::OkStatus();
}

int64_t KvArena::GrowthOfOthers(int tenant) const {
  absl::MutexLock lock(&mu_);
  int64_t g = 0;
  for (size_t u = 0; u < tenants_.size(); ++u) {
    if (static_cast<int>(u) != tenant && tenants_[u].alive) g += tenants_[u].growth_bytes;
  }
  return g;
}

void KvArena::SetGrowth(int tenant, int64_t bytes) {
  absl::MutexLock lock(&mu_);
  tenants_[static_cast<size_t>(tenant)].growth_bytes = std::max<int64_t>(0, bytes);
}

int64_t KvArena::ReservedForOthers(int tenant) const {
  int64_t r = 0;
  for (size_t u = 0; u < tenants_.size(); ++u) {
    const Tenant& t = tenants_[u];
    if (static_cast<int>(u) == tenant || !t.alive) continue;
    r += std::max<int64_t>(0, t.limits.floor_bytes - t.used_bytes);
  }
  return r;
}

absl::StatusOr<int> KvArena::TakeSlab(int cls, int tenant, std::vector<int>* carved) {
  int slab;
  if (!empty_.empty()) {
    slab = empty_.back();
    empty_.pop_back();
    --stats_.slabs_empty;
  } else {
    if (unmapped_.empty()) return absl::ResourceExhaustedError("KV arena: address range exhausted");
    const PagePoolStats ps = pool_->stats();
    const int64_t reserved = ReservedForOthers(tenant);
    if (reserved > 0 &&
        ps.mapped_bytes + static_cast<int64_t>(options_.slab_bytes) + reserved > ps.budget_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat("KV arena: other models' floors reserve ",
                                                       reserved, " bytes of the budget"));
    }
    slab = unmapped_.back();
    absl::Status st =
        pool_->Map(base_ + static_cast<size_t>(slab) * options_.slab_bytes, options_.slab_bytes);
    if (!st.ok()) return st;
    unmapped_.pop_back();
    carved->push_back(slab);
    ++stats_.carves;
    ++stats_.slabs_mapped;
  }
  Slab& s = slabs_[slab];
  const Class& c = classes_[cls];
  s.state = Slab::State::kFormatted;
  s.cls = cls;
  s.used = 0;
  s.free.resize(c.blocks_per_slab);
  for (int i = 0; i < c.blocks_per_slab; ++i)
    s.free[i] = static_cast<uint16_t>(c.blocks_per_slab - 1 - i);
  s.owner.assign(static_cast<size_t>(c.blocks_per_slab), kNoOwner);
  ++stats_.slabs_formatted;
  classes_[cls].partial.insert({0, slab});
  ++classes_[cls].formatted;
  return slab;
}

void KvArena::ReleaseSlab(int slab, bool keep_in_buffer) {
  Slab& s = slabs_[slab];
  if (s.state == Slab::State::kFormatted) {
    classes_[s.cls].partial.erase({-s.used, slab});
    --classes_[s.cls].formatted;
    --stats_.slabs_formatted;
  } else if (s.state == Slab::State::kEmpty) {
    empty_.erase(std::find(empty_.begin(), empty_.end(), slab));
    --stats_.slabs_empty;
  }
  s.cls = -1;
  s.used = 0;
  s.free.clear();
  s.owner.clear();
  s.draining = false;
  if (keep_in_buffer && static_cast<int>(empty_.size()) < options_.free_slab_buffer) {
    s.state = Slab::State::kEmpty;
    empty_.push_back(slab);
    ++stats_.slabs_empty;
    return;
  }
  pool_->Unmap(base_ + static_cast<size_t>(slab) * options_.slab_bytes, options_.slab_bytes);
  s.state = Slab::State::kUnmapped;
  unmapped_.push_back(slab);
  --stats_.slabs_mapped;
  ++stats_.releases;
}

absl::StatusOr<std::vector<BlockId>> KvArena::Allocate(int cls, int tenant, int n) {
  absl::MutexLock lock(&mu_);
  std::vector<BlockId> out;
  std::vector<int> carved;
  Class& c = classes_[cls];
  Tenant& owner = tenants_[tenant];
  const int64_t want = static_cast<int64_t>(std::max(n, 0)) * static_cast<int64_t>(c.block_bytes);
  if (owner.used_bytes + want > owner.limits.limit_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("KV arena: ", n, " blocks of ", c.block_bytes,
                                                     " bytes would pass this model's limit of ",
                                                     owner.limits.limit_bytes, " bytes"));
  }
  out.reserve(static_cast<size_t>(std::max(n, 0)));
  while (static_cast<int>(out.size()) < n) {
    int slab;
    if (!c.partial.empty()) {
      slab = c.partial.begin()->second;  // the fullest slab with room
    } else {
      auto taken = TakeSlab(cls, tenant, &carved);
      if (!taken.ok()) {
        // All or nothing: give back what this call took, unmap what it carved.
        for (BlockId b : out) FreeOne(cls, b);
        for (int s : carved) {
          if (slabs_[s].state != Slab::State::kUnmapped) ReleaseSlab(s, /*keep_in_buffer=*/false);
        }
        return absl::ResourceExhaustedError(absl::StrCat("KV arena: ", n, " blocks of ",
                                                         c.block_bytes, " bytes do not fit (",
                                                         taken.status().message(), ")"));
      }
      slab = *taken;
    }
    out.push_back(TakeBlock(c, slab, tenant));
  }
  owner.used_bytes += want;
  return out;
}

BlockId KvArena::TakeBlock(Class& c, int slab, int tenant) {
  Slab& s = slabs_[slab];
  c.partial.erase({-s.used, slab});
  const uint16_t idx = s.free.back();
  s.free.pop_back();
  s.owner[idx] = tenant;
  ++s.used;
  if (!s.free.empty()) c.partial.insert({-s.used, slab});
  ++c.used;
  ++stats_.blocks_used;
  return static_cast<BlockId>(slab * kMaxBlocksPerSlab + idx);
}

void KvArena::FreeOne(int cls, BlockId id) {
  const int slab = static_cast<int>(id / kMaxBlocksPerSlab);
  Slab& s = slabs_[slab];
  Class& c = classes_[cls];
  c.partial.erase({-s.used, slab});
  const auto idx = static_cast<uint16_t>(id % kMaxBlocksPerSlab);
  s.free.push_back(idx);
  s.owner[idx] = kNoOwner;
  --s.used;
  --c.used;
  --stats_.blocks_used;
  if (s.used == 0) {
    ReleaseSlab(slab, /*keep_in_buffer=*/true);
  } else if (!s.draining) {
    c.partial.insert({-s.used, slab});
  }
}

absl::Status KvArena::CheckFree(int cls, int tenant, BlockId id) const {
  const int64_t slab = id < 0 ? -1 : id / kMaxBlocksPerSlab;
  const int64_t idx = id < 0 ? -1 : id % kMaxBlocksPerSlab;
  const Slab* s = slab >= 0 && slab < static_cast<int64_t>(slabs_.size()) ? &slabs_[slab] : nullptr;
  if (s == nullptr || s->state != Slab::State::kFormatted || s->cls != cls ||
      idx >= static_cast<int64_t>(s->owner.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV arena: free of block ", id, ", which is not a block of ",
                     classes_[cls].block_bytes, " bytes in a formatted slab"));
  }
  const int32_t owner = s->owner[idx];
  if (owner == kNoOwner || owner == kBeingFreed) {
    return absl::FailedPreconditionError(
        absl::StrCat("KV arena: free of block ", id, ", which is not allocated (double free)"));
  }
  if (owner != tenant) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV arena: free of block ", id, ", which another model's allocator holds"));
  }
  return absl::OkStatus();
}

absl::Status KvArena::Free(int cls, int tenant, absl::Span<const BlockId> ids) {
  absl::MutexLock lock(&mu_);
  // Validate the whole span before freeing anything. Each valid block is
  // marked kBeingFreed so a block listed twice reads as a double free; on
  // error the marks are undone and nothing changes.
  for (size_t i = 0; i < ids.size(); ++i) {
    absl::Status st = CheckFree(cls, tenant, ids[i]);
    if (!st.ok()) {
      for (size_t j = 0; j < i; ++j) {
        slabs_[ids[j] / kMaxBlocksPerSlab].owner[ids[j] % kMaxBlocksPerSlab] = tenant;
      }
      return st;
    }
    slabs_[ids[i] / kMaxBlocksPerSlab].owner[ids[i] % kMaxBlocksPerSlab] = kBeingFreed;
  }
  for (BlockId id : ids) FreeOne(cls, id);
  tenants_[tenant].used_bytes -=
      static_cast<int64_t>(ids.size()) * static_cast<int64_t>(classes_[cls].block_bytes);
  return absl::OkStatus();
}

uint8_t* KvArena::Address(int cls, BlockId id) const {
  // Lock-free: slab size and class block size never change while a block
  // is allocated.
  const size_t slab = static_cast<size_t>(id / kMaxBlocksPerSlab);
  const size_t idx = static_cast<size_t>(id % kMaxBlocksPerSlab);
  return base_ + slab * options_.slab_bytes +
         idx * block_bytes_of_[cls].load(std::memory_order_relaxed);
}

int64_t KvArena::Capacity(int cls, int tenant, bool max) const {
  absl::MutexLock lock(&mu_);
  const Class& c = classes_[cls];
  const Tenant& t = tenants_[tenant];
  const PagePoolStats ps = pool_->stats();
  const int64_t slab = static_cast<int64_t>(options_.slab_bytes);
  const int64_t cap = t.limits.limit_bytes / static_cast<int64_t>(c.block_bytes);  // the limit
  if (max) return std::min(cap, (ps.budget_bytes / slab) * c.blocks_per_slab);
  // Blocks this tenant holds + free room in the class's partial slabs +
  // slabs it could take (the unmapped budget less other tenants' floors).
  const int64_t held = t.used_bytes / static_cast<int64_t>(c.block_bytes);
  const int64_t free_in_partial = c.free_formatted();
  const int64_t mappable =
      std::max<int64_t>(0, (ps.budget_bytes - ps.mapped_bytes - ReservedForOthers(tenant)) / slab);
  const int64_t takeable = std::min<int64_t>(mappable, static_cast<int64_t>(unmapped_.size())) +
                           static_cast<int64_t>(empty_.size());
  return std::min(cap, held + free_in_partial + takeable * c.blocks_per_slab);
}

int KvArena::Replenish() {
  absl::MutexLock lock(&mu_);
  int mapped = 0;
  const int64_t slab = static_cast<int64_t>(options_.slab_bytes);
  while (static_cast<int>(empty_.size()) < options_.free_slab_buffer && !unmapped_.empty()) {
    const PagePoolStats ps = pool_->stats();
    if (ps.mapped_bytes + slab + ReservedForOthers(-1) > ps.budget_bytes) break;
    const int s = unmapped_.back();
    if (!pool_->Map(base_ + static_cast<size_t>(s) * options_.slab_bytes, options_.slab_bytes).ok())
      break;
    unmapped_.pop_back();
    slabs_[s].state = Slab::State::kEmpty;
    empty_.push_back(s);
    ++stats_.carves;
    ++stats_.slabs_mapped;
    ++stats_.slabs_empty;
    ++mapped;
  }
  return mapped;
}

int64_t KvArena::ReclaimFreeSlabs() {
  absl::MutexLock lock(&mu_);
  int64_t bytes = 0;
  while (!empty_.empty()) {
    ReleaseSlab(empty_.back(), /*keep_in_buffer=*/false);
    bytes += static_cast<int64_t>(options_.slab_bytes);
  }
  return bytes;
}

std::vector<SlabBlocks> KvArena::SlabsInUse() const {
  absl::MutexLock lock(&mu_);
  std::vector<SlabBlocks> out;
  for (size_t i = 0; i < slabs_.size(); ++i) {
    if (slabs_[i].state == Slab::State::kFormatted && slabs_[i].used > 0) {
      out.push_back({static_cast<int64_t>(i), slabs_[i].used});
    }
  }
  return out;
}

KvArenaStats KvArena::stats() const {
  absl::MutexLock lock(&mu_);
  KvArenaStats s = stats_;
  const int64_t slab = static_cast<int64_t>(options_.slab_bytes);
  for (const Class& c : classes_) {
    const int64_t free_blocks = c.free_formatted();
    s.blocks_free_formatted += free_blocks;
    s.bytes_used += c.used * static_cast<int64_t>(c.block_bytes);
    s.bytes_free += free_blocks * static_cast<int64_t>(c.block_bytes);
  }
  const PagePoolStats ps = pool_->stats();
  const int64_t mappable =
      std::min<int64_t>(std::max<int64_t>(0, (ps.budget_bytes - ps.mapped_bytes) / slab),
                        static_cast<int64_t>(unmapped_.size()));
  s.bytes_free += (mappable + static_cast<int64_t>(empty_.size())) * slab;
  return s;
}

}  // namespace ballast::memory
