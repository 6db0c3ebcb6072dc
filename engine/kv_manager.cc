#include "engine/kv_manager.h"

#include <algorithm>
#include <atomic>
#include <chrono>

namespace ballast::engine {

uint64_t KvRecencyNow() {
  static std::atomic<uint64_t> last{0};
  const auto now = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                             std::chrono::steady_clock::now().time_since_epoch())
                                             .count());
  uint64_t prev = last.load(std::memory_order_relaxed);
  while (true) {
    const uint64_t next = std::max(now, prev + 1);
    if (last.compare_exchange_weak(prev, next, std::memory_order_relaxed)) return next;
  }
}

KvManager::KvManager(KvCache* kv) : kv_(kv) {}

KvManager::~KvManager() {
  for (auto& [id, s] : sessions_) kv_->Release(&s.kv);
}

bool KvManager::Reserve(SequenceKv* kv, int tokens) {
  while (true) {
    if (kv_->Reserve(kv, tokens).ok()) return true;
    if (sessions_.empty()) return false;
    // The least recently used session gives back what is missing, its
    // later layers first where the tiers hold a copy (ShedLayers).
    const int64_t missing =
        std::max<int64_t>(1, kv_->BlocksNeeded(*kv, tokens) - kv_->allocator()->num_free());
    EvictLeastRecent(missing * block_bytes());
  }
}

bool KvManager::FitsWatermark(const SequenceKv& kv, int tokens, int running) const {
  const int64_t available = kv_->allocator()->num_free() + cached_blocks_;
  return available - kv_->BlocksNeeded(kv, tokens) >= HeadroomBlocks(running);
}

int64_t KvManager::HeadroomBlocks(int running) const {
  return static_cast<int64_t>(running) * layout().num_layers +
         kv_->allocator()->others_growth_blocks();
}

void KvManager::SetGrowthReserve(int running) {
  kv_->allocator()->set_growth_reserve(static_cast<int64_t>(running) * layout().num_layers *
                                       block_bytes());
}

int64_t KvManager::Free(SequenceKv* kv) {
  const int64_t bytes = BytesOf(*kv);
  kv_->Release(kv);
  return bytes;
}

int KvManager::TakePrefix(const std::string& session_id, const std::vector<int>& tokens,
                          SequenceKv* kv, absl::Duration* prefetch_lead, int* resident_layers) {
  auto it = sessions_.find(session_id);
  if (it == sessions_.end() || tokens.empty()) return 0;
  // The longest common prefix; at least one token must be computed to
  // produce logits.
  const std::vector<int>& cached = it->second.tokens;
  size_t common = 0;
  while (common < cached.size() && common < tokens.size() && cached[common] == tokens[common]) {
    ++common;
  }
  common = std::min(common, tokens.size() - 1);
  if (it->second.prefetch_deadline != absl::InfiniteFuture()) {
    --prefetches_;
    ++outcomes_.used;
    if (prefetch_lead != nullptr) *prefetch_lead = absl::Now() - it->second.kept_at;
  }
  cached_blocks_ -= it->second.kv.num_blocks();
  if (resident_layers != nullptr) *resident_layers = it->second.resident_layers;
  *kv = std::move(it->second.kv);
  sessions_.erase(it);
  absl::MutexLock lock(&published_mu_);
  published_.erase(session_id);
  return static_cast<int>(common);
}

void KvManager::Keep(const std::string& session_id, SequenceKv kv, std::vector<int> tokens,
                     int priority, absl::Time prefetch_deadline, bool lower_copy) {
  CachedSession& slot = sessions_[session_id];
  cached_blocks_ -= slot.kv.num_blocks();
  kv_->Release(&slot.kv);
  if (slot.prefetch_deadline != absl::InfiniteFuture()) --prefetches_;
  if (prefetch_deadline != absl::InfiniteFuture()) ++prefetches_;
  cached_blocks_ += kv.num_blocks();
  const int n = static_cast<int>(tokens.size());
  slot.kv = std::move(kv);
  slot.tokens = std::move(tokens);
  slot.priority = priority;
  slot.last_use = KvRecencyNow();
  slot.prefetch_deadline = prefetch_deadline;
  slot.kept_at = absl::Now();
  slot.resident_layers = layout().num_layers;
  slot.lower_copy = lower_copy;
  absl::MutexLock lock(&published_mu_);
  published_[session_id] = n;
}

int64_t KvManager::Drop(const std::string& session_id) {
  auto it = sessions_.find(session_id);
  return it == sessions_.end() ? 0 : Erase(it);
}

bool KvManager::DropPrefetch(const std::string& session_id) {
  auto it = sessions_.find(session_id);
  if (it == sessions_.end() || it->second.prefetch_deadline == absl::InfiniteFuture()) return false;
  ++outcomes_.invalidated;
  Erase(it);
  return true;
}

void KvManager::ExpirePrefetches(absl::Time now) {
  if (prefetches_ == 0) return;
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    auto next = std::next(it);
    if (it->second.prefetch_deadline <= now) {
      ++outcomes_.expired;
      Erase(it);
    }
    it = next;
  }
}

int KvManager::CachedTokens(const std::string& session_id) const {
  absl::MutexLock lock(&published_mu_);
  auto it = published_.find(session_id);
  return it == published_.end() ? 0 : it->second;
}

int64_t KvManager::Erase(std::map<std::string, CachedSession>::iterator it) {
  if (it->second.prefetch_deadline != absl::InfiniteFuture()) --prefetches_;
  cached_blocks_ -= it->second.kv.num_blocks();
  const int64_t bytes = Free(&it->second.kv);
  {
    absl::MutexLock lock(&published_mu_);
    published_.erase(it->first);
  }
  sessions_.erase(it);
  return bytes;
}

int64_t KvManager::ShedLayers(const std::string& session_id, int64_t want_bytes) {
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) return 0;
  CachedSession& s = it->second;
  if (!s.lower_copy || want_bytes >= BytesOf(s.kv)) return Erase(it);
  // The top layers whose blocks cover want_bytes; at least layer 0 stays.
  int keep = s.resident_layers;
  int64_t covered = 0;
  while (keep > 0 && covered < std::max<int64_t>(want_bytes, 1)) {
    --keep;
    covered += static_cast<int64_t>(s.kv.blocks[keep].size()) * block_bytes();
  }
  if (keep == 0) return Erase(it);
  s.resident_layers = keep;
  const int64_t blocks = kv_->ReleaseLayers(&s.kv, s.resident_layers);
  cached_blocks_ -= blocks;
  {
    absl::MutexLock lock(&published_mu_);
    published_.erase(session_id);  // no longer whole on the device
  }
  return blocks * block_bytes();
}

int64_t KvManager::EvictLeastRecent(int64_t want_bytes) {
  if (sessions_.empty()) return 0;
  auto victim = sessions_.begin();
  for (auto it = sessions_.begin(); it != sessions_.end(); ++it) {
    if (it->second.last_use < victim->second.last_use) victim = it;
  }
  const std::string id = victim->first;  // ShedLayers may erase the entry
  return ShedLayers(id, want_bytes);
}

std::vector<memory::SlabBlocks> KvManager::SlabsOf(const SequenceKv& kv) const {
  std::vector<memory::SlabBlocks> out;
  const memory::BlockAddressing addr = kv_->allocator()->addressing();
  // Not slab-addressed (a host pool): no slab is ever given back.
  if (addr.slab_bytes == 0) return out;
  std::vector<memory::BlockId> ids;
  for (const auto& layer : kv.blocks) ids.insert(ids.end(), layer.begin(), layer.end());
  memory::CountSlabBlocks(ids, addr.slab_shift, &out);
  return out;
}

std::vector<KvHolding> KvManager::Holdings(bool with_slabs) const {
  std::vector<KvHolding> out;
  out.reserve(sessions_.size());
  for (const auto& [id, s] : sessions_) {
    KvHolding h;
    h.kind = KvHolding::Kind::kCachedSession;
    h.id = id;
    h.priority = s.priority;
    h.recency = s.last_use;
    h.bytes = BytesOf(s.kv);
    if (with_slabs) h.slabs = SlabsOf(s.kv);
    out.push_back(std::move(h));
  }
  return out;
}

void KvManager::AppendTables(std::vector<SequenceKv*>* out) {
  for (auto& [id, s] : sessions_) out->push_back(&s.kv);
}

}  // namespace ballast::engine
