// Parameter remapping in the simulator (SimPolicy::remap; the device's side
// is sim_device_remap.cc, whose rules are in sim_device.h): a model's
// timings as the daemon's WeightRemapper measures them, its cap and plan
// through memory/remap_plan.h's own functions, the stall a streaming step
// pays, and the counters `ballast simulate` reports.
//
// Figures (docs/benchmarks.md, "Parameter remapping (Mirage) against
// preemption"):
//  * T_T, one layer's copy from pinned host memory: the layer's bytes over
//    the calibration's h2d rate (H200: 55.4 GB/s, which the remap runs
//    measured as 56-58 GB/s: T_T 7.88-7.91 ms for an 8B layer).
//    A layer's bytes: one decoder layer's parameters (attention, MLP and
//    its two norms; the embedding and LM head are not lent): 436.2 MB for
//    the 8B, T_T 7.87 ms at 55.4 GB/s.
//  * T_c, one layer's compute, as the daemon's: the smallest of the
//    model's last 16 decode-only steps that streamed nothing, over its
//    layers (SimDevice::ObserveDecode; rolling, a step's time from launch
//    to end, beside the other models' steps, as the daemon times launch
//    and wait; lockstep, the model's own step), and before any, a batch-1
//    decode step of the engine model at a context of one token (H200 8B:
//    0.17 ms against the measured 0.15-0.18 ms at activation). It does
//    not move while layers stream (streaming steps are not sampled).
//  * A step waits for the copies its compute does not hide: stall =
//    max(0, copies x T_T - step), the copies α + min(α, β) a step (a slot
//    whose home is its only layer is not reloaded; β the plan's slots;
//    memory::CopiesPerStep), T_T stretched where the busy streaming models
//    together ask more of the link than it carries (StreamingStall). A
//    step whose copies hide costs nothing more: with the constraint
//    holding, TBT p50 changed by -0.2% (α = 1) and -0.1% (α = 4) on the
//    H200 (prefill-heavy steps, "Where the constraint holds"). Measured on
//    the H200 with β = 2: TBT p50 17.0 ms at α = 1 (2 copies x 7.9 =
//    15.8 ms) and 48.2 ms at α = 4 (6 x 7.9 = 47.4 ms) against 10.6 ms
//    unstreamed.
//
// Thread-safety: pure functions and plain structs.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "memory/remap_plan.h"
#include "nlohmann/json.hpp"
#include "sim/engine_model.h"
#include "sim/sim_config.h"

namespace ballast::sim {

// One model's remapping figures on a GPU (its part's, for tp > 1).
struct RemapTimings {
  int layers = 0;
  int64_t layer_bytes = 0;  // what one lent layer frees
  double t_transfer = 0;    // T_T, seconds
  double t_compute = 0;     // T_c, seconds
};

// Bytes one lent layer of `part` frees: one decoder layer's parameters.
int64_t LayerBytes(const ModelShape& part);
RemapTimings TimingsOf(const EngineModel& engine, const SimPolicy& policy, const SimModel& model);

// The most layers a model may lend now, as the daemon's WeightRemapper::
// AlphaCap: floor(max_fraction x n), at most n - 2; for a busy model with
// respect_timing, memory::MaxAlpha under it, a copy timed at the link the
// other busy streaming models leave (`others`, memory::SharedTransfer; 0
// when they leave none). An idle one streams nothing until it runs: the
// floor alone.
int RemapCap(const RemapTimings& t, const SimRemap& options, bool active, double others = 0);

// The plan for α lent layers, as WeightRemapper::SetAlpha makes it:
// memory::PlanStreaming at the link `others` leave; where that finds none
// and `respect_timing` is off, α + 2 layers through two slots anyway.
// Empty: none (α == 0, or refused).
memory::StreamingPlan PlanFor(const RemapTimings& t, int alpha, bool respect_timing,
                              double others = 0);

// The time a step that takes `step_s` alone waits for its copies: 0 while
// they hide behind it. `others` is the link the other busy streaming
// models take (their memory::LinkShare summed): where the link's load,
// this model's share with theirs, passes 1, each copy takes T_T x that
// load over the load this model alone puts on it (max 1 each).
double StreamingStall(const RemapTimings& t, const memory::StreamingPlan& plan, double step_s,
                      double others = 0);

// Per GPU, and summed over the cluster for the report.
struct RemapCounters {
  int64_t remap_events = 0;  // models whose α grew at a shortfall
  int64_t revert_events = 0;
  int64_t capped_events = 0;  // shortfalls the caps left (partly) uncovered
  // Reverts of a model over its cap for which running requests were
  // preempted (kv_paged; the daemon's remap_events_total{kind="forced"}).
  int64_t forced_reverts = 0;
  // Requests refused admission for KV room at least once (without
  // policy.kv_paged the sim reserves a request's whole KV at admission, so
  // a request short of room waits in the queue where the daemon would
  // preempt and recompute).
  int64_t kv_wait_requests = 0;
  int64_t max_lent_bytes = 0;  // the most lent on one GPU at once
  int64_t streamed_steps = 0;
  int64_t streamed_bytes = 0;
  double stall_s = 0;
  // Reverts' copies from the host, with the GPU's steps ended first: the
  // pauses and the time they took (beside the drains before them).
  int64_t copy_pauses = 0;
  double copy_s = 0;
  std::map<int, int> max_alpha;         // by model index
  std::map<int, double> layer_seconds;  // α integrated over time, by model
  void Add(const RemapCounters& o);
};

// The report's "remap" block: the options, the counters and, by model
// name, max α and layer-seconds lent.
nlohmann::json RemapJson(const SimRemap& options, const RemapCounters& c, const SimConfig& config);

}  // namespace ballast::sim
