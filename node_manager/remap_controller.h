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
// The device has one host-to-device link, and every busy streaming
// model's copies share it: a model's cap times its copies at the link the
// other busy streaming models leave (memory::SharedTransfer). Lend asks
// one donor at a time, computing the caps again after each, so two busy
// models never both take the same spare link time; a busy model whose
// copies no longer fit in the link the others leave (an idle lender that
// got requests starts to copy) is over its cap and reverts as below.
//
// Reversion (§5.5), checked by Tick before every pass: a model lending
// more layers than its cap now allows (an idle donor that got requests:
// every step of it now waits for the copies its compute cannot hide) goes
// first (several: the one furthest past its cap, whose copies hold most
// of the link), at once, and takes back every layer past its cap in one
// go; when the device's free budget (empty slabs unmapped first) does not
// hold them (every page they lent: layers lend their whole pages only, so
// some lend a page more than the smallest) plus one slab of headroom,
// running sequences give their KV
// back for them (`make_room`: the memory ladder, newest first, as for an
// activation's weights; they recompute later), since a stalled model
// slows every step it takes while the shortfall lasts. Otherwise, once no
// KV shortfall has been seen for `revert_after`, the next model in the
// reverse of donor order (busy models first) takes one layer back per
// pass when the free budget holds it plus a slab, so step time returns to
// its unremapped value off-peak.
//
// Time comes from the caller (`now`), so the policy never reads a clock
// (Lend times its exchanges for its log line only).
//
// Thread-safety: Lend, Tick and NoteActive on the device's step thread
// with no step in flight; stats() from any thread.
#pragma once

#include <cstdint>
#include <functional>
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

  // Called with a donor before its layers change (`before_lend`), or once
  // before a revert (`quiesce`): the caller finishes the steps in flight
  // that could read what changes (a lender's own steps read its weights;
  // a revert may shed running sequences). Null: nothing is in flight.
  using BeforeLend = std::function<void(const engine::ModelEngine& donor)>;
  using Quiesce = std::function<void()>;

  // Lends layers to cover `shortfall_bytes` of KV; returns the bytes the
  // balloon got back.
  int64_t Lend(const std::vector<std::shared_ptr<engine::ModelEngine>>& engines,
               int64_t shortfall_bytes, absl::Time now, const BeforeLend& before_lend = nullptr);
  // Samples the engines' streaming counters and reverts layers when the
  // rules above allow. `make_room(bytes, spare)` sheds KV until the
  // balloon has `bytes` free, the other models' first and then `spare`'s
  // own (the model taking its layers back, whose new requests made it
  // busy), or until nothing is left, and returns the bytes shed. Null: a
  // model over its cap waits for free room like any other revert.
  // `quiesce` runs only when a revert is attempted (a model over its cap
  // that may shed, or a revert the free budget holds), so a tick that
  // changes nothing leaves the device's steps running: under continuous
  // load every tick used to drain them, ten times a second.
  using MakeRoom = std::function<int64_t(int64_t bytes, const engine::ModelEngine* spare)>;
  void Tick(const std::vector<std::shared_ptr<engine::ModelEngine>>& engines,
            memory::Balloon& balloon, size_t slab_bytes, absl::Time now,
            const MakeRoom& make_room = nullptr, const Quiesce& quiesce = nullptr);
  // Whether Lend could lend anything now: some model lends fewer layers
  // than its cap. Reads the remappers' state only (no step may be
  // finishing: the step thread, as Lend).
  bool CanLend(const std::vector<std::shared_ptr<engine::ModelEngine>>& engines) const;
  // `model` stepped (MRU order among equals).
  void NoteActive(const std::string& model) { last_active_[model] = ++clock_; }
  // The device's engines now: one first seen counts as active (Mirage's
  // MRU is of the most recently activated model: a model just loaded is
  // the last the round comes back to), in `engines`' order (the device's:
  // the order its models were added); one gone is
  // forgotten (loaded again, it counts anew). Step thread.
  void NoteEngines(const std::vector<std::shared_ptr<engine::ModelEngine>>& engines);
  RemapStats stats() const;

 private:
  std::vector<memory::RemapCandidate> Candidates(
      const std::vector<std::shared_ptr<engine::ModelEngine>>& engines) const;
  // What one Tick's revert did.
  struct Reverted {
    int64_t reverted = 0, forced = 0, shed = 0;
  };
  // Tick's revert of `e` (candidate `*c`, whose alpha it updates): back to
  // its cap when `over`, else one layer, when the free budget holds the
  // layers or (over) make_room frees it.
  Reverted Revert(engine::ModelEngine& e, memory::RemapCandidate* c, bool over,
                  memory::Balloon& balloon, size_t slab_bytes, const MakeRoom& make_room,
                  const Quiesce& quiesce);
  // Each remapper's share of the link left by the other streaming models
  // (WeightRemapper::set_link_share). Candidates calls it first.
  void ShareLink(const std::vector<std::shared_ptr<engine::ModelEngine>>& engines) const;
  // options_.layer_transfer (if set) as each remapper's T_T.
  void ApplyProfile(const std::vector<std::shared_ptr<engine::ModelEngine>>& engines) const;
  // Adds to stats_ the growth of each engine's streaming totals since the
  // last call (a model that left keeps what it added). REQUIRES: mu_ held.
  void CountStreaming(const std::vector<std::shared_ptr<engine::ModelEngine>>& engines)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

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
