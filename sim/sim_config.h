// What `ballast simulate` simulates: a cluster of identical GPUs, a model
// catalogue and the policies, as plain structs (server/sim_config.cc
// parses them from YAML; nothing here reads files).
//
// Thread-compatible value types.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "node_manager/arbitration.h"
#include "node_manager/remap_options.h"
#include "sim/engine_model.h"

namespace ballast::sim {

// The policy's named choices (SimPolicy has their meanings): each enum's
// values and YAML names in one table, parsed and named through it.
enum class SessionKv { kTiers, kDevice, kRecompute };
enum class MemoryMode { kElastic, kStatic };
enum class Placement { kMostFree, kKvpr, kMme };
enum class Activation { kOnDemand, kFixed };

template <typename E>
struct NamedValue {
  E value;
  const char* name;
};
inline constexpr NamedValue<SessionKv> kSessionKvNames[] = {{SessionKv::kTiers, "tiers"},
                                                            {SessionKv::kDevice, "device"},
                                                            {SessionKv::kRecompute, "recompute"}};
inline constexpr NamedValue<MemoryMode> kMemoryModeNames[] = {{MemoryMode::kElastic, "elastic"},
                                                              {MemoryMode::kStatic, "static"}};
inline constexpr NamedValue<Placement> kPlacementNames[] = {
    {Placement::kMostFree, "most_free"}, {Placement::kKvpr, "kvpr"}, {Placement::kMme, "mme"}};
inline constexpr NamedValue<Activation> kActivationNames[] = {{Activation::kOnDemand, "on_demand"},
                                                              {Activation::kFixed, "fixed"}};

// The value named `s` in `table`; nullopt for any other name.
template <typename E, size_t N>
std::optional<E> ParseNamed(const std::string& s, const NamedValue<E> (&table)[N]) {
  for (const NamedValue<E>& v : table) {
    if (s == v.name) return v.value;
  }
  return std::nullopt;
}
// The name of `e` in `table` ("" if absent, which no caller passes).
template <typename E, size_t N>
const char* NameOf(E e, const NamedValue<E> (&table)[N]) {
  for (const NamedValue<E>& v : table) {
    if (v.value == e) return v.name;
  }
  return "";
}

// "tiers", "device" or "recompute" (the YAML's policy.session_kv); nullopt
// for anything else.
inline std::optional<SessionKv> ParseSessionKv(const std::string& s) {
  return ParseNamed(s, kSessionKvNames);
}
inline const char* SessionKvName(SessionKv k) { return NameOf(k, kSessionKvNames); }

struct SimModel {
  std::string name;
  std::string shape_name;  // for reports
  ModelShape shape;
  uint32_t ttft_ms = 1000;  // the model's SLOs (a trace's own values win)
  uint32_t tpot_ms = 100;
  int max_seqs = 256;  // running requests at most (the engine's batch)
  // Nodes that keep it resident (the catalogue's `replicas`), at most one
  // replica per node. A request goes to the least loaded ready replica;
  // missing replicas are placed (on demand: when a request comes) and an
  // eviction takes one replica. Only single-replica models are migrated.
  int replicas = 1;
  // Tensor parallelism: each replica spans this many GPUs of one node, one
  // part (TensorParallelPart) on each, never two parts on one GPU (Prism
  // A.2.2's anti-affinity). The part's weights and KV are what a GPU holds;
  // its step is the part's step plus the all-reduces (SimPolicy's tp_*).
  int tp = 1;
  ModelShape Part() const { return TensorParallelPart(shape, tp); }
};

// Parameter remapping (Mirage), the daemon's node.memory.remap
// (node_manager/remap_options.h, whose defaults these are): when a GPU's
// KV runs short after idle session KV, resident models lend weight
// layers to it (sim_device_remap.cc has the rules). Elastic memory only,
// as the daemon (static mode has no weight pages to lend).
struct SimRemap {
  bool enabled = node_manager::RemapOptions{}.enabled;
  // Most of a model's layers it may lend (the rest stay resident).
  double max_fraction = node_manager::RemapOptions{}.max_fraction;
  // Cap a busy model's α by Mirage's T_T/T_c constraint; false: by
  // max_fraction alone (streaming stalls the steps where it does not hold).
  bool respect_timing = node_manager::RemapOptions{}.respect_timing;
  // Quiet time (no KV shortfall on the GPU) before layers are taken back.
  double revert_after_s = absl::ToDoubleSeconds(node_manager::RemapOptions{}.revert_after);
};

struct SimPolicy {
  // elastic: one budget per GPU shared by weights and every model's KV;
  // models are activated on demand and idle ones evicted.
  // static: each GPU's memory less weights split equally between the models
  // placed on it at the start; nothing is activated or evicted later.
  MemoryMode memory_mode = MemoryMode::kElastic;
  bool elastic() const { return memory_mode == MemoryMode::kElastic; }
  // Where a replica goes: most free memory, KVPR (Prism's Algorithm 1) or
  // FineServe's MME (global_scheduler/placement.h).
  Placement placement = Placement::kKvpr;
  // on_demand: a model with no replica is placed when a request comes, and
  // idle models are evicted for room (Prism). fixed: the placement at the
  // start never changes (MuxServe); static memory implies fixed.
  Activation activation = Activation::kOnDemand;
  bool fixed() const { return activation == Activation::kFixed || !elastic(); }
  node_manager::ArbitrationPolicy arbitration = node_manager::ArbitrationPolicy::kMooreHodgson;
  // Arbitration's aging (node_manager::Arbitrate's promote_after_slo, the
  // node's node.arbitration.promote_after_slo): a request queued more than
  // this many times its TTFT SLO is served first. 0: no aging.
  double promote_after_slo = 0;
  double idle_evict_after_s = 45;  // <= 0: never evict for room
  // KV-pressure eviction (idle_eviction.h) below this free fraction; 0: off.
  double kv_pressure_free_fraction = 0.05;
  // A GPU takes a model's weights only if this fraction of its memory is
  // left for KV afterwards (so a load never leaves a GPU with no KV).
  double min_kv_fraction = 0.1;
  int max_batch_tokens = 8192;  // tokens per engine step (prefill chunks + decodes)
  // The models' steps of one iteration run on their own streams
  // (node.engine.overlap_steps): the iteration takes the longest step's
  // launch latency plus every step's GPU work. false: one after another.
  bool overlap_steps = true;
  // With overlap_steps: each model steps at its own pace
  // (node.engine.rolling_steps, the node's default): a model's next step
  // begins as soon as its own step ends, and the GPU is shared by the
  // steps in flight (sim_device.h's rules). false: lockstep iterations,
  // each waiting for its slowest step.
  bool rolling_steps = true;
  // Rolling: how the steps on the GPU share it. Each gets a share of the
  // GPU in proportion to its work (its time alone, less the latency) to
  // this power: 0, equal shares (processor sharing); 1, every step
  // progresses by the same fraction of itself. 0.5 fits the H200's
  // measurements (docs/benchmarks.md): a small decode step beside a
  // 2,048-token prefill chunk got 22-33% of the GPU (0.5 predicts 22-37%,
  // 0 predicts 50%). The shares always add up to the whole GPU.
  double rolling_share_exponent = 0.5;
  // Rolling: a decode-only step of at most rolling_skinny_rows rows (the
  // CUDA engine's skinny GEMV, engine/cuda/kernels.h's
  // kSkinnyGemmDefaultMaxM: 2) weighs rolling_skinny_weight times what its
  // work gives. Its kernels take the SMs that a larger step's cuBLASLt
  // GEMMs leave: on the H200, beside a step of 3 or more rows it got 0.70-
  // 0.77 of its time alone and the larger one 0.35-0.36; three at once
  // (one of 1 row), 0.53 and 0.29 each (docs/benchmarks.md, session 55).
  // 1 (the default): no difference; 2 fits those. Costs nothing.
  int rolling_skinny_rows = 2;
  double rolling_skinny_weight = 1;
  // Rolling: how much a step of the other kind (a decode-only step against
  // one with prefill chunks) counts against a step's share. 1 (the
  // default): one GPU shared by weight. Below 1, HBM-bound decodes and
  // compute-bound prefill chunks overlap and their shares add up to more
  // than one, as on the H200: a 2,048-token chunk beside one, two and
  // three decoding 8B models got 0.78-0.83, 0.71-0.78 and 0.71 of the GPU,
  // the steps beside it 1.0-1.12 of it in all (docs/benchmarks.md, session
  // 55). Costs nothing.
  double rolling_cross_weight = 1;
  // Rolling: the share of the engine's concurrent overlap
  // (EngineModel::OverlapSeconds, measured with one host thread per model)
  // that the node realises. A decode-only step's launch latency is
  // k0 + this x OverlapSeconds, at most what its HBM reads leave
  // (EngineModel::OverlappedSeconds); steps with prefill chunks keep k0 (no
  // concurrent prefill was measured). The node's one device thread, woken
  // by each step's device-done callback, begins the next steps later than
  // free-running threads would. 0.3 is fitted to the rolling daemon on
  // the four-1B validation trace (seed 24, H200, the daemon's run of
  // 2026-12-01 against that day's last calibration and engine model; 0.4
  // with the morning's, 0.5 on 2026-11-30) and checked on another (seed
  // 42): docs/benchmarks.md. 0: only k0 overlaps.
  double rolling_overlap_share = 0.3;
  // Lockstep (rolling_steps false, overlap_steps true): the same share for
  // the decode-only steps of an iteration, whose launch latency becomes
  // k0 + this x OverlapSeconds (bounded as above). 0: only k0 overlaps.
  double lockstep_overlap_share = 0;
  // With rolling_steps: each model's next step is planned and queued
  // behind the one on the GPU (node.engine.ahead_steps, the node's
  // default; sim_device.h's rules): its host time is hidden, and a
  // request that arrives meanwhile waits for the step already queued.
  // Default true, as node_manager::DeviceArbitrationOptions::ahead_steps.
  bool ahead_steps = true;
  // With ahead_steps and remapping: whether the plan made as a model's
  // step begins (for the step after it) may have layers lent for an
  // admission. false (the default, the daemon's rule: BatchPlanner's
  // ahead plans ask nobody for KV): such an admission waits, that step
  // goes out with the running requests' chunks, and the model plans again
  // once its steps have ended (StepPlan::drain), with the whole ladder. On
  // the H200 that made every other step of a model admitting under
  // remapping a short one (docs/benchmarks.md, session 56). true: it lends
  // at once (the simpler rule of the hand-worked remapping tests).
  bool ahead_admissions_lend = false;
  // Rolling, kv_paged: a running request's growth that must preempt the
  // requests of a model with a step in flight waits for that model's
  // steps (its queued ahead step too) to end first, as the daemon's
  // DeviceWorker::DrainVictims does: the device's loop begins and plans
  // no other step meanwhile, the victims keep the tokens of those steps
  // (a first token among them), and the growth then plans again. On the
  // H200 those waits took 5-117 ms each (the node's "asked the other
  // models" lines, session 56's rate-4 runs). Default true, the daemon's
  // rule; false: the victim is preempted at once and loses its step's
  // tokens (the rule before session 58).
  bool growth_waits_for_victims = true;
  // Rolling, kv_paged, ahead_steps: as a step planned ahead begins, a
  // running request whose blocks for it do not fit in the free KV is left
  // out of it (preempting nobody), and the model's next step is planned
  // only once that one has ended, with the whole ladder: the daemon's
  // BatchPlanner::PlanRunning for an ahead plan (StepPlan::drain). Default
  // true; false: that step's growth preempts as a plan made with nothing
  // in flight does (the rule before session 58).
  bool ahead_growth_asks_nobody = true;
  // Host time of a model step outside the GPU work (draining the inbox,
  // planning, streaming tokens, finishing sequences): the mean of the
  // node's ballast_node_step_host_seconds, measured under `ballast serve`
  // (deploy/gpu-host/sim-validate.sh). Lockstep, the GPU idles for it:
  // serial steps add it once per model stepped; overlapped steps finish
  // their host halves in parallel, so an iteration adds it once. Rolling,
  // each step of each model begins with it (that model waits; the others'
  // steps keep the GPU busy), except a step planned ahead, whose host time
  // ran beside the step before it (ahead_steps). Default 0: the engine
  // alone, as bench-engine measures it.
  double step_host_s = 0;
  // A request's path outside the node: the client's send, the RPCs to the
  // scheduler and on to the node, and the first token's relay back to the
  // client. Added to every request's TTFT and E2E (not to TPOT), and to a
  // failed request's end, as a constant (it does not queue under load):
  // `ballast bench` reports it for a real run as path_ms (client TTFT less
  // the node's Timings.node_ttft_ms); sim-validate.sh's host.txt has its
  // median per rate scale. Default 0: tokens reach the client the moment
  // their step ends.
  double request_path_s = 0;
  // Tensor-parallel steps (SimModel::tp > 1) add two all-reduces per layer
  // of the step's tokens x hidden BF16 activations, each taking
  //   tp_allreduce_latency_s + bytes x 2 (tp - 1) / tp / tp_allreduce_bus_bytes_per_s
  // (NCCL's ring cost in bus bandwidth). Not calibrated here (no NCCL run
  // on the GPU host yet): the defaults are nccl-tests' published 8 x H100
  // SXM figures, about 460 GB/s bus bandwidth for large messages and
  // 10-20 us for a small all-reduce.
  double tp_allreduce_latency_s = 15e-6;
  double tp_allreduce_bus_bytes_per_s = 450e9;
  double control_interval_s = 1;  // the scheduler's control tick
  // KVPR rebalancing (placement kvpr only; scheduler.rebalance_interval):
  // every this many seconds Prism's Algorithm 1 over all placed models,
  // and at most one migration at a time (0: off).
  double rebalance_interval_s = 30;
  double migration_threshold = 0.2;
  // The daemon migrates between nodes only (a replica per node); true
  // simulates moves between GPUs of one node too.
  bool migrate_within_node = false;
  double demand_window_s = 60;  // KVPR's rate window
  // KVPR with a step budget (global_scheduler/kvpr.h's StepBudgetHolds):
  // placement and rebalancing prefer GPUs where the sum of the models'
  // nominal steps stays within this many times the tightest TPOT SLO among
  // them. A model's nominal step: its part's decode step at batch
  // kNominalBatch, 1,024 tokens of context each (TpStepSeconds). 0: off,
  // KVPR by memory alone (Prism's). The daemon's scheduler.step_budget_
  // headroom is the same rule over the steps its nodes measure.
  double step_budget_headroom = 0;
  static constexpr int kNominalBatch = 8;
  // Multi-turn sessions (trace records with a session id; sim_sessions.cc
  // has the rules). A turn's prompt is the session's history (every
  // earlier turn's prompt and output) plus its own tokens, as the
  // scheduler's session directory sends it; where the history's KV is
  // decides what the turn prefills:
  //   tiers: a finished turn's KV stays on its GPU while the GPU has room
  //     and is written through to its node's DRAM and SSD tiers
  //     (cluster.dram_bytes, ssd_bytes); Advise prefetches it onto the
  //     GPU (the daemon with node.kv_tiers);
  //   device: on the GPU only; lost when the GPU needs the room (the
  //     daemon without node.kv_tiers);
  //   recompute: kept nowhere: every turn prefills its whole context.
  SessionKv session_kv = SessionKv::kTiers;
  // How a request's KV is held (sim_device_kv.cc has the rules).
  // false: its whole KV (prompt and every output token) is reserved at
  // admission and kept to its end: nothing is preempted. true: as the
  // daemon's engine (engine/batch_planner.cc): blocks of kv_block_tokens
  // for the tokens of its next step only, grown step by step; where a
  // step's growth does not fit, the GPU's newest running requests give
  // theirs back and recompute later (preemption). Tensor-parallel models
  // keep the whole reservation. Default false: the figures published
  // before it (docs/benchmarks.md) used it.
  bool kv_paged = false;
  int kv_block_tokens = 16;  // kv_paged: node.engine.block_tokens
  // Each resident model's engine buffers (EngineWorkspaceBytes at
  // max_batch_tokens and its max_seqs) take GPU memory beside its weights,
  // as the daemon charges them outside the KV pool (never lent by
  // remapping). Loads and placement still count weights alone. Default
  // false, as the figures published before it.
  bool charge_workspace = false;
  // The node's memory page in MiB (node.memory.slab_mib): each resident's
  // weights are mapped in whole pages, and the KV arena carves whole pages
  // of what is left, so the KV room is that rounded down. 0 (the default,
  // as the figures published before it): bytes exact.
  int page_mib = 0;
  // node.engine.max_context: with charge_workspace, the engines' attention
  // workspace and block tables are charged too (EngineWorkspaceBytes'
  // WorkspaceContext, at kv_block_tokens and gpu_sms). 0 (the default, as
  // the figures published before it): not charged.
  int max_context = 0;
  int gpu_sms = 132;  // the GPU's SMs (H100 and H200 SXM: 132)
  SimRemap remap;     // policy.remap (off by default)
};

struct SimCluster {
  int nodes = 1;
  int gpus_per_node = 1;
  int gpus = 0;                  // > 0: only this many in all (the last node has fewer)
  int64_t gpu_memory_bytes = 0;  // 0: the calibrated card's memory
  // Each node's session KV tiers below its GPUs (policy.session_kv
  // tiers; the daemon's node.kv_tiers dram_mib and ssd_gib): 0, none.
  // YAML cluster.dram_gib and cluster.ssd_gib. Defaults: configs/node.yaml's
  // example node (4 GiB of DRAM, 64 GiB of SSD).
  int64_t dram_bytes = 4LL << 30;
  int64_t ssd_bytes = 64LL << 30;
};

struct SimConfig {
  SimCluster cluster;
  SimPolicy policy;
  std::vector<SimModel> models;
  // After the last arrival, requests still unfinished this much later end
  // DEADLINE_EXCEEDED (a stuck cluster still finishes the simulation).
  double drain_s = 600;
};

}  // namespace ballast::sim
