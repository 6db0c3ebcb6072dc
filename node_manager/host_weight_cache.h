// HostWeightCache: evicted models' weights kept in host memory (pinned for
// the cuda backend) so the next activation copies them to the device
// instead of reading and converting the checkpoint (Prism §6.1: activation
// from a host copy). Bounded by a DRAM budget; when a new copy does not
// fit, the least recently used copies are dropped first, and a copy larger
// than the whole budget is not kept.
//
// Entries are keyed by model name, checkpoint path and weight quantization:
// a model registered again from another path, or with another quantization
// (whose copy holds other bytes), does not reuse a stale copy.
//
// Thread-safety: thread-safe.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "engine/executor.h"
#include "engine/model_config.h"

namespace ballast::node_manager {

struct HostWeightCacheStats {
  int64_t budget_bytes = 0;
  int64_t bytes = 0;
  int entries = 0;
  int64_t hits = 0, misses = 0, dropped = 0;
  int64_t puts = 0;  // Put calls (a new copy, or one an engine still held)
};

class HostWeightCache {
 public:
  explicit HostWeightCache(int64_t budget_bytes) : budget_(budget_bytes) {}

  // Whether a copy of `bytes` could be kept at all (callers skip making one).
  bool Fits(int64_t bytes) const { return bytes <= budget_; }
  // Keeps `weights` (replacing an older copy of the model). False if it is
  // larger than the budget.
  bool Put(const std::string& model, const std::string& path, engine::WeightQuant quant,
           std::shared_ptr<const engine::HostWeights> weights);
  // The kept copy (and marks it most recently used), or null. The copy
  // stays cached: a model evicted again needs no new copy.
  std::shared_ptr<const engine::HostWeights> Get(const std::string& model, const std::string& path,
                                                 engine::WeightQuant quant);
  bool Contains(const std::string& model, const std::string& path, engine::WeightQuant quant) const;
  void Erase(const std::string& model);
  // Drops the least recently used copy that only the cache holds (counted
  // as dropped): dropping one that an engine still holds, having been
  // activated from it, frees no memory. False when there is none.
  bool DropLeastRecent();
  // Bytes DropLeastRecent could free: the copies only the cache holds.
  int64_t DroppableBytes() const;
  HostWeightCacheStats stats() const;

 private:
  struct Entry {
    std::string model, path;
    engine::WeightQuant quant = engine::WeightQuant::kNone;
    std::shared_ptr<const engine::HostWeights> weights;
    bool Is(const std::string& m, const std::string& p, engine::WeightQuant q) const {
      return model == m && path == p && quant == q;
    }
  };
  // REQUIRES: mu_ held.
  void EraseLocked(const std::string& model) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int64_t budget_;
  mutable absl::Mutex mu_;
  std::list<Entry> lru_ ABSL_GUARDED_BY(mu_);  // most recently used first
  HostWeightCacheStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ballast::node_manager
