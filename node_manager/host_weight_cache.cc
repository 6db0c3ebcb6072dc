#include "node_manager/host_weight_cache.h"

#include <iterator>

namespace ballast::node_manager {

bool HostWeightCache::Put(const std::string& model, const std::string& path,
                          engine::WeightQuant quant,
                          std::shared_ptr<const engine::HostWeights> weights) {
  const int64_t bytes = weights->bytes();
  absl::MutexLock lock(&mu_);
  EraseLocked(model);
  if (bytes > budget_) return false;
  while (stats_.bytes + bytes > budget_ && !lru_.empty()) {
    stats_.bytes -= lru_.back().weights->bytes();
    lru_.pop_back();
    ++stats_.dropped;
  }
  lru_.push_front({model, path, quant, std::move(weights)});
  stats_.bytes += bytes;
  ++stats_.puts;
  return true;
}

std::shared_ptr<const engine::HostWeights> HostWeightCache::Get(const std::string& model,
                                                                const std::string& path,
                                                                engine::WeightQuant quant) {
  absl::MutexLock lock(&mu_);
  for (auto it = lru_.begin(); it != lru_.end(); ++it) {
    if (it->Is(model, path, quant)) {
      lru_.splice(lru_.begin(), lru_, it);
      ++stats_.hits;
      return it->weights;
    }
  }
  ++stats_.misses;
  return nullptr;
}

bool HostWeightCache::Contains(const std::string& model, const std::string& path,
                               engine::WeightQuant quant) const {
  absl::MutexLock lock(&mu_);
  for (const Entry& e : lru_) {
    if (e.Is(model, path, quant)) return true;
  }
  return false;
}

void HostWeightCache::Erase(const std::string& model) {
  absl::MutexLock lock(&mu_);
  EraseLocked(model);
}

bool HostWeightCache::DropLeastRecent() {
  absl::MutexLock lock(&mu_);
  for (auto it = lru_.rbegin(); it != lru_.rend(); ++it) {
    // Others only let go of their references meanwhile: a count of 1 is final.
    if (it->weights.use_count() != 1) continue;
    stats_.bytes -= it->weights->bytes();
    lru_.erase(std::next(it).base());
    ++stats_.dropped;
    return true;
  }
  return false;
}

int64_t HostWeightCache::DroppableBytes() const {
  absl::MutexLock lock(&mu_);
  int64_t n = 0;
  for (const Entry& e : lru_) {
    if (e.weights.use_count() == 1) n += e.weights->bytes();
  }
  return n;
}

void HostWeightCache::EraseLocked(const std::string& model) {
  for (auto it = lru_.begin(); it != lru_.end(); ++it) {
    if (it->model == model) {
      stats_.bytes -= it->weights->bytes();
      lru_.erase(it);
      return;
    }
  }
}

HostWeightCacheStats HostWeightCache::stats() const {
  absl::MutexLock lock(&mu_);
  HostWeightCacheStats s = stats_;
  s.budget_bytes = budget_;
  s.entries = static_cast<int>(lru_.size());
  return s;
}

}  // namespace ballast::node_manager
