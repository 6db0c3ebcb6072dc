// WeightRemapper: one engine's parameter remapping (Mirage §5): which of
// its decoder layers lend their weight pages to KV, streaming those layers
// through the executor's slots, and the measured timings that cap how many
// may be lent. The device worker decides how many layers each model lends
// (memory/remap_plan.h's PlanRemap, node_manager/remap_controller.h); this
// class carries a decision out on the engine's weight pages and executor.
//
// Timings (Mirage §5.3-5.4). T_T, one layer's copy from the host copy, is
// measured on the device at activation (node.memory.remap on) or the first
// time it is needed (the executor times a real copy). T_c, one layer's
// compute, is a decode step's forward time less any streaming stall, over
// the layer count: the smallest of the last 16 decode-only steps run with
// no layer streamed (prefill steps are longer than the decode steps that
// follow them; a streaming step's time includes its stall), and before
// any, a batch-1 decode timed at activation; times the stall correction
// (memory::StallCorrection: streaming steps whose copies stalled their
// compute lower it). Unknown T_c: the cap is the floor alone.
//
// Thread-safety: the engine's step thread only; SetAlpha with no step of
// the engine in flight.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/executor.h"
#include "memory/balloon.h"
#include "memory/remap_plan.h"

namespace ballast::engine {

class WeightRemapper {
 public:
  // Null when the executor cannot stream layers, there are no weight
  // pages (static mode), or a layer spans no whole page (nothing to lend).
  static std::unique_ptr<WeightRemapper> Create(Executor* executor,
                                                std::shared_ptr<memory::WeightPages> pages);

  int alpha() const { return plan_.alpha; }
  // A device fault lost lent layers (SetAlpha's INTERNAL): the engine must
  // not serve again (the device worker closes it).
  bool broken() const { return broken_; }
  int num_layers() const { return static_cast<int>(extents_.size()); }
  const memory::StreamingPlan& plan() const { return plan_; }
  // Bytes one more lent layer frees at least (the whole pages inside the
  // smallest layer's extent; pages a layer shares with its neighbours
  // stay mapped).
  int64_t layer_bytes() const { return layer_bytes_; }
  // The most layers this model may lend now: at most max_fraction of its
  // layers (the floor kept resident), and, once T_c is known, the largest
  // α whose transfers hide behind compute (memory::MaxAlpha) with the
  // link the other streaming models leave (set_link_share; 0 when they
  // leave none).
  // `respect_timing` false: the floor alone (streaming whatever it costs).
  int AlphaCap(double max_fraction, bool respect_timing = true) const;

  // Lends (α grows) or takes back (α shrinks) layers so that `alpha` are
  // lent, and streams the new plan from the next forward. Returns the
  // bytes given to the balloon (negative: taken back). FAILED_PRECONDITION
  // when no plan hides `alpha` layers' transfers; RESOURCE_EXHAUSTED when
  // layers to take back find no room. On error nothing changed, except
  // after a device fault whose undo finds the lent pages taken (INTERNAL;
  // the model must be reloaded).
  // `slots` 1 or 2 forces β (benchmarks comparing m = α+1 with α+2, tests)
  // and skips the timing check; 0 (default): β by the measured timings.
  absl::StatusOr<int64_t> SetAlpha(int alpha, int slots = 0);
  // Without the timing check: β by the timings where they allow, else 2.
  void set_respect_timing(bool on) { respect_timing_ = on; }
  // Measures T_T now (at activation) rather than at the first lend.
  absl::Status Prepare();
  // A T_T profiled offline (seconds), in place of the measurement; <= 0:
  // ignored.
  void set_t_transfer(double seconds) {
    if (seconds > 0) t_transfer_ = seconds;
  }
  // A finished step's forward time (seconds): refreshes T_c. Only
  // decode-only steps count (Mirage §5.3: an active model's T_c is its
  // decode step's). A streaming step instead feeds its stall share (the
  // executor's stall since the last call over `seconds`) to the stall
  // correction.
  void ObserveForward(double seconds, bool decode_only);
  // ObserveForward with the step's stall given (seconds): for tests, and
  // for the executor-free callers.
  void ObserveStep(double seconds, double stall, bool decode_only);
  // What the measured stalls have left of T_c (1: none seen).
  double stall_factor() const { return stall_fix_.factor; }
  // A batch-1 decode forward timed at activation (seconds): T_c until
  // live decode steps are seen.
  void SetActivationDecode(double seconds);
  double t_transfer() const { return t_transfer_; }
  // The share of the device's host-to-device link the other streaming
  // models take (memory::LinkShare summed over them; RemapController sets
  // it before each decision). AlphaCap and SetAlpha's plans then time a
  // copy as memory::SharedTransfer: T_T / (1 - others). Default 0.
  void set_link_share(double others) { link_others_ = std::max(0.0, others); }
  double link_others() const { return link_others_; }
  // This model's own share of the link while it streams (0: it lends none).
  double link_share() const {
    return memory::LinkShare(num_layers(), plan_, t_transfer_, t_compute());
  }
  // Per layer: the live decode steps' (window minimum), else the activation's batch-1
  // decode, else 0 (unknown); times stall_factor().
  double t_compute() const {
    return (t_compute_ > 0 ? t_compute_ : t_compute_activation_) * stall_fix_.factor;
  }
  LayerStreamingStats streaming_stats() const { return executor_->streaming_stats(); }
  int64_t remaps() const { return remaps_; }
  int64_t reverts() const { return reverts_; }

 private:
  WeightRemapper(Executor* executor, std::shared_ptr<memory::WeightPages> pages,
                 std::vector<LayerExtent> extents);
  // SetAlpha's plan for lending `alpha` layers through `slots` (0: as
  // timing allows); measures T_T first (Prepare).
  absl::StatusOr<memory::StreamingPlan> PlanFor(int alpha, int slots);
  // The weight-page extents of `layers`.
  std::vector<memory::WeightPages::Extent> ExtentsOf(const std::vector<int>& layers) const;
  // Lends `lend` and restores `restore` in one exchange on the pool, then
  // streams by `next`; undoes both on failure (broken_ if it cannot).
  // Returns the bytes lent less the bytes mapped (WeightPages::Exchange).
  absl::StatusOr<int64_t> SwapLayers(const std::vector<int>& lend, const std::vector<int>& restore,
                                     const memory::StreamingPlan& next);

  Executor* const executor_;
  const std::shared_ptr<memory::WeightPages> pages_;
  const std::vector<LayerExtent> extents_;
  int64_t layer_bytes_ = 0;
  memory::StreamingPlan plan_;
  double t_transfer_ = 0;   // 0: not measured yet
  double link_others_ = 0;  // the other streaming models' share of the link
  double t_compute_ = 0;    // 0: no decode step seen yet
  static constexpr int kWindow = 16;
  double recent_[kWindow] = {};  // per-layer times of the last decode steps (0: none)
  int recent_next_ = 0;
  double t_compute_activation_ = 0;
  double last_stall_ = 0;  // executor's cumulative stall at the last step
  memory::StallCorrection stall_fix_;
  int64_t remaps_ = 0, reverts_ = 0;
  bool respect_timing_ = true;
  // A device fault failed a remapping and its undo found the pages taken:
  // lent layers are lost, and SetAlpha refuses from then on.
  bool broken_ = false;
};

}  // namespace ballast::engine
