// RemapController: one device's parameter-remapping decisions (Mirage
// §5.1-5.5) over the models resident on it. When a model's KV runs out
// (DeviceWorker::ReclaimFor, after idle session KV), Lend makes models
// lend weight layers to KV: inactive models first, lowest priority, then
// most recently active (MRU) first; the busy models last; each at most up
// to its cap (engine/weight_remapper.h: a floor of resident layers and,
// for a model with requests, the measured T_T/T_c constraint; an inactive
// model streams nothing until it runs, so its cap is the floor alone). Past every cap the shortfall
// falls to the next rung (preemption) and the event is counted.
//
// Reversion (§5.5), checked by Tick before every pass: a model lending
// more layers than its cap now allows goes first, at once; otherwise once
// no KV shortfall has been seen for `revert_after`. Either way only when
// the device's free budget
// (empty slabs unmapped first) holds one more layer of the next model to
// revert plus one slab of headroom, that model takes one layer back; in
// the reverse of donor order (busy models first), one layer per pass, so
// step time returns to its unremapped value off-peak.
//
// Time comes from the caller (`now`), so the policy never reads a clock.
//
// Thread-safety: Lend, Tick and NoteActive on the device's step thread
// with no step in flight; stats() from any thread.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/model_engine.h"
#include "memory/balloon.h"
#include "node_manager/remap_options.h"

namespace ballast::node_manager {

class RemapController {
 public:
  explicit RemapController(const RemapOptions& options) : options_(options) {}

  // Lends layers to cover `shortfall_bytes` of KV; returns the bytes the
  // balloon got back.
  int64_t Lend(const std::vector<std::shared_ptr<engine::ModelEngine>>& engines,
               int64_t shortfall_bytes, absl::Time now);
  // Samples the engines' streaming counters and reverts one layer when
  // the rule above allows.
  void Tick(const std::vector<std::shared_ptr<engine::ModelEngine>>& engines,
            memory::Balloon& balloon, size_t slab_bytes, absl::Time now);
  // `model` stepped (MRU order among equals).
  void NoteActive(const std::string& model) { last_active_[model] = ++clock_; }
  RemapStats stats() const;

 private:
  std::vector<memory::RemapCandidate> Candidates(
      const std::vector<std::shared_ptr<engine::ModelEngine>>& engines) const;

  const RemapOptions options_;
  // Step thread only.
  std::map<std::string, int64_t> last_active_;
  int64_t clock_ = 0;
  absl::Time last_shortfall_ = absl::InfinitePast();
  // The engines' streaming counters at the last sample (per model).
  std::map<std::string, engine::LayerStreamingStats> seen_;
  mutable absl::Mutex mu_;
  RemapStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ballast::node_manager
