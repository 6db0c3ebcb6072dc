// `ballast simulate`: a trace replayed against a simulated cluster on a
// virtual clock, in one thread with no gRPC, driving the policies' own
// code: placement (global_scheduler/placement.h: most_free, kvpr, mme),
// idle and KV-pressure eviction (idle_eviction.h) and the node's request
// arbitration (node_manager/arbitration.h). The engine is the calibrated
// EngineModel; each GPU is a SimDevice (sim_device.h, which states the
// memory, admission and step rules).
//
// The control plane mirrors the scheduler's tick (scheduler_control.cc):
//  * A model keeps up to `replicas` replicas, never two on one node. A
//    request goes to the ready replica on the least loaded node (running
//    and queued requests of every model on its GPUs, the scheduler's
//    LeastLoaded; ties: the lowest device) among those whose KV can hold
//    it, else to one still loading. A session's turn goes to its
//    affinity GPU (its last turn's or prefetch's) while that one is ready
//    and can hold it (the scheduler's affinity node).
//  * At start every model, largest weights first, is placed by the policy
//    where a GPU can take it (a warmed-up cluster); then every model's
//    second replica, and so on.
//  * A request for a model short of replicas places one more (on a node
//    without one) as below; with none ready or loading it waits.
//  * A request for a model with no replica waits; the model is placed by
//    the policy. A GPU that cannot take the weights refuses the load (as a
//    node answers RESOURCE_EXHAUSTED); from the next tick the model needs
//    room and the longest-idle model (idle >= idle_evict_after_s, none of
//    whose requests is queued or running) is drained and evicted; the
//    model is placed again as soon as a GPU frees memory, or retried at
//    each tick. An eviction drains one replica, and room for a missing
//    replica is made only on a node that holds none.
//  * Each tick, an elastic GPU whose requests queue while its free KV is
//    below kv_pressure_free_fraction evicts its longest-idle model.
//  * Tensor-parallel models (SimModel::tp > 1): a replica's parts go one
//    after another where the policy puts them, on distinct GPUs of one
//    node with room for a part (Prism A.2.2); sim_device.h has how a
//    group steps. Evicting a replica frees every part.
//  * KVPR placement may take a step budget (SimPolicy's
//    step_budget_headroom, global_scheduler/kvpr.h's StepBudgetHolds).
//  * KVPR rebalancing (Scheduler::Rebalance): every rebalance_interval_s,
//    PlaceKvpr over the placed single-replica, single-GPU models (the rest
//    count as the devices' fixed load); the first whose device changes
//    and that the cluster can take moves (between nodes only, as the
//    daemon, unless migrate_within_node; a GPU with room): it loads on the
//    target while the source serves, then new requests go to the target
//    and the source drains.
//  * A fixed placement (activation: fixed, and static memory) never
//    activates or evicts: a request for a model that was not placed at the
//    start fails UNAVAILABLE.
//  * Activation takes the engine model's ActivationSeconds; an eviction
//    takes effect when the replica's last request there ends.
//  * Multi-turn sessions and their KV tiers (SimPolicy::session_kv): the
//    rules are in sim_sessions.cc; the GPU's side in sim_device.h, the
//    node's DRAM and SSD in sim_kv_tiers.h.
// Each request gets the outcome a replay would record (bench/replay.h), so
// bench's reports, CSV and plots apply unchanged; the client hears of its
// tokens and its end request_path_s after the device's step (a constant:
// the RPCs and the relay, which do not queue here). Trace records with
// "after" are released when the client saw their dependency end, plus
// delay_s (an advisory ends at once);
// advisories prefetch (sim_sessions.cc), or are counted and ignored with
// session_kv recompute or no session id; one never released (its
// dependency failed or never ended) is skipped, as in a replay.
//
// Deterministic: the same config, engine model and trace give the same
// result. Thread-safety: Simulate is reentrant (no shared state).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/replay.h"
#include "bench/report.h"
#include "bench/trace.h"
#include "nlohmann/json.hpp"
#include "node_manager/arbitration_log.h"
#include "sim/engine_model.h"
#include "sim/sim_config.h"
#include "sim/sim_remap.h"

namespace ballast::sim {

// Multi-turn sessions (sim_sessions.cc). Every turn (a request with a
// session id) ends in one of: first_turns (completed, no history),
// next_turns (completed with history, by where its KV came from: the
// keys of next_by_origin add up to it), failed (released, not completed)
// or not_released (its dependency failed).
struct SessionKvStats {
  std::string mode;  // SimPolicy::session_kv
  int sessions = 0, turns = 0;
  int first_turns = 0, next_turns = 0, failed = 0, not_released = 0;
  // device (kept from the last turn), advised (an Advise moved it onto
  // the GPU), host_dram, ssd, peer, recomputed.
  std::map<std::string, int> next_by_origin;
  // TTFT of completed turns by origin ("first" for first turns).
  std::map<std::string, bench::LatencySummary> ttft_ms;
  int64_t reused_tokens = 0;      // history tokens not prefilled again
  int64_t recomputed_tokens = 0;  // history tokens prefilled again
  // Loads from below the GPU (leases and prefetches), by tier, and the
  // time leases added to turns' TTFT.
  std::map<std::string, int> loads;
  std::map<std::string, int64_t> loaded_bytes;
  double lease_wait_s = 0;
  // GPUs: idle sessions' KV given back for room (demoted with tiers,
  // lost without), of which unused prefetches; prefetches expired unused;
  // sessions' KV dropped with their model.
  int64_t hbm_shed = 0, prefetch_shed = 0, prefetch_expired = 0, hbm_unloaded = 0;
  // Nodes' tiers (SimKvTiers::Counters, summed).
  int64_t dram_demoted = 0, ssd_evicted = 0, tier_dropped = 0;
  // Advisories with a session id: prefetched (by the tier read), already
  // on the GPU, nothing to move (no history or no copy), no room on the
  // GPU (or its GPUs keep no session KV: tp > 1), no ready replica.
  int advisories = 0, advise_on_device = 0, advise_no_kv = 0, advise_no_room = 0,
      advise_no_replica = 0;
  std::map<std::string, int> advise_prefetched;
  KvLinkRates rates;
};

nlohmann::json ToJson(const SessionKvStats& s);

struct SimStats {
  int gpus = 0, models = 0;
  // Virtual time at the end: the last event other than a prefetch's expiry
  // (an unused prefetch expiring after the last turn does not stretch it).
  double simulated_s = 0;
  double wall_s = 0;  // real time the simulation took
  int64_t events = 0;
  int64_t model_steps = 0;  // engine steps, summed over models and GPUs
  // Engine steps per GPU, in cluster order (not in ToJson: one per GPU).
  std::vector<int64_t> device_model_steps;
  int initial_placed = 0;  // replicas resident at the start
  int activations = 0, idle_evictions = 0, kv_pressure_evictions = 0;
  int load_refusals = 0;  // loads a GPU refused for room
  int migrations = 0;     // KVPR rebalancing moves started
  int advisories_ignored = 0;
  int unfinished = 0;       // still running at the horizon (DEADLINE_EXCEEDED)
  SessionKvStats sessions;  // in ToJson as "session_kv" when the trace has sessions
  // Parameter remapping (policy.remap): the GPUs' counters summed
  // (max_alpha: the most any GPU lent); kv_wait_requests is counted with
  // remapping off too (in ToJson as "kv_wait_requests" always). In ToJson
  // as "remap" (remap_json, RemapJson) when it is enabled.
  RemapCounters remap;
  nlohmann::json remap_json;  // null: remapping off
  // policy.kv_paged: preemptions, and the KV tokens the preempted
  // requests gave back (each recomputes them and its last sampled token
  // when admitted again). 0 without kv_paged.
  int64_t preemptions = 0;
  int64_t recomputed_tokens = 0;
  // Rolling, kv_paged: growths that waited for a victim model's steps in
  // flight (policy.growth_waits_for_victims), and the seconds they waited.
  int64_t victim_drains = 0;
  double victim_drain_s = 0;
  // KV the GPUs' running requests still hold at the end: 0 unless some
  // were unfinished (not in ToJson; conservation tests check it).
  int64_t kv_bytes_at_end = 0;
};

// One model's engine step as simulated (SimDevice::Hooks::step):
// what `ballast simulate --step-log` writes, to line up with the steps a
// node logs (scripts/step-log.py).
struct SimStepRecord {
  int model = 0;
  double start_s = 0, end_s = 0;  // virtual time: it began (host time first) and ended
  int steps = 1;                  // > 1: a stretch of decode steps (work: its first)
  StepWork work;
  int running = 0;       // the model's running requests after the step
  int waiting = 0;       // its requests queued on the device
  int64_t kv_bytes = 0;  // the KV its running requests hold
  int lent_layers = 0;   // remapping: its weight layers lent to KV
  int device_lent = 0;   // remapping: every model's on the GPU (idle lenders too)
};

// A model step on GPU `gpu` (cluster order), as Simulate records it.
struct SimStepRow {
  int gpu = 0;
  SimStepRecord step;  // step.model: the index in SimConfig::models
};

// A change in a queued request's arbitration state on GPU `gpu`
// (SimDevice::Hooks::arbitration): what a node logs with
// node.arbitration.log_decisions. event.entry.id is the trace's request id.
struct SimArbitrationRow {
  int gpu = 0;
  double t_s = 0;
  node_manager::ArbitrationEvent event;
  int64_t kv_free = 0;  // the GPU's KV room then: memory less weights and KV held
};

struct SimResult {
  bench::ReplayResult replay;
  SimStats stats;
  std::vector<SimStepRow> steps;               // record_steps: every model step, as they ended
  std::vector<SimArbitrationRow> arbitration;  // record_steps: every arbitration change
};

// record_steps: keep every model step in SimResult::steps and every change
// in a queued request's arbitration state in SimResult::arbitration
// (memory grows with them: for runs of one or a few GPUs, to line them up
// with a node's logs).
absl::StatusOr<SimResult> Simulate(const SimConfig& config, const EngineModel& engine,
                                   const std::vector<bench::TraceRecord>& trace,
                                   double rate_scale = 1.0, bool record_steps = false);

// `trace` with each request's arrival moved by a uniform draw in
// [-jitter_s, +jitter_s] of simulated time at `rate_scale` (the trace's
// times are divided by it), never before 0; records that follow another's
// end (`after`) and advisories keep theirs. The same seed gives the same
// trace. For ensembles: a replay is chaotic (a request that misses a step
// boundary by a microsecond changes what follows, as on the card, where
// identical runs differ by several points of attainment), so one run is
// one draw of what the system does. jitter_s 0: `trace` as it is.
std::vector<bench::TraceRecord> JitterArrivals(const std::vector<bench::TraceRecord>& trace,
                                               double jitter_s, double rate_scale, uint64_t seed);

// `steps` as CSV, one row per step: gpu, model (name), start_s, end_s,
// steps, the StepWork columns ParseRecordedSteps reads (step_replay.h),
// running, waiting, kv_bytes, lent_layers, device_lent.
std::string StepsCsv(const SimConfig& config, const std::vector<SimStepRow>& steps);

// `rows` as CSV, one row per change: gpu, t_s, request, model, event
// (ArbitrationChangeName), tokens, then arrival_ms, start_ms, deadline_ms,
// cost_ms and queued_ms (from t_s), the model's cost fit (fit_ms,
// fit_ms_per_token, fit_steps) and kv_free_mib.
std::string ArbitrationCsv(const std::vector<SimArbitrationRow>& rows);

nlohmann::json ToJson(const SimStats& s);

}  // namespace ballast::sim
