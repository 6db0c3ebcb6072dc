#include "server/metrics.h"

#include "absl/strings/str_cat.h"

namespace ballast::server {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;

// Latency buckets from 1 ms to 60 s.
const prometheus::Histogram::BucketBoundaries& LatencyBuckets() {
  static const auto* b = new prometheus::Histogram::BucketBoundaries{
      0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
  return *b;
}

}  // namespace

Metrics::Metrics()
    : registry_(std::make_shared<prometheus::Registry>()),
      sched_requests_(BuildCounter()
                          .Name("ballast_scheduler_requests_total")
                          .Help("Generate requests by model and final gRPC status")
                          .Register(*registry_)),
      sched_ttft_(BuildHistogram()
                      .Name("ballast_scheduler_ttft_seconds")
                      .Help("Time to first token seen by the scheduler, per model")
                      .Register(*registry_)),
      sched_tpot_(BuildHistogram()
                      .Name("ballast_scheduler_tpot_seconds")
                      .Help("Mean time per output token of each request, per model")
                      .Register(*registry_)),
      sched_tokens_(BuildCounter()
                        .Name("ballast_scheduler_tokens_generated_total")
                        .Help("Tokens streamed to clients, per model")
                        .Register(*registry_)),
      sched_slo_(BuildCounter()
                     .Name("ballast_scheduler_slo_requests_total")
                     .Help("Requests judged against their SLO, by model, slo (ttft, tpot) and "
                           "result (met, missed)")
                     .Register(*registry_)),
      sched_tenant_requests_(BuildCounter()
                                 .Name("ballast_scheduler_tenant_requests_total")
                                 .Help("Finished or refused requests by tenant (\"default\": none; "
                                       "\"other\": not in the key file or quotas) and status")
                                 .Register(*registry_)),
      sched_nodes_(BuildGauge()
                       .Name("ballast_scheduler_nodes")
                       .Help("Registered nodes by state (alive, dead)")
                       .Register(*registry_)),
      sched_sessions_(BuildGauge()
                          .Name("ballast_scheduler_sessions")
                          .Help("Multi-turn sessions the scheduler tracks")
                          .Register(*registry_)),
      sched_state_errors_(BuildCounter()
                              .Name("ballast_scheduler_state_write_errors_total")
                              .Help("Session changes the state store (scheduler.state) failed to "
                                    "write; they are kept in memory only, until a restart")
                              .Register(*registry_)),
      sched_leader_(
          BuildGauge()
              .Name("ballast_scheduler_leader")
              .Help("1 while this scheduler leads (or runs without scheduler.state.etcd), "
                    "0 while it stands by for the etcd leadership")
              .Register(*registry_)),
      sched_rejections_(BuildCounter()
                            .Name("ballast_scheduler_rejections_total")
                            .Help("Calls refused before any work, by reason (advise_quota: the "
                                  "tenant's advisory rate; advise_queue_full: "
                                  "scheduler.advise_queue) and tenant")
                            .Register(*registry_)),
      node_requests_(BuildCounter()
                         .Name("ballast_node_requests_total")
                         .Help("Requests served by this node, by model and gRPC status")
                         .Register(*registry_)),
      node_ttft_(BuildHistogram()
                     .Name("ballast_node_ttft_seconds")
                     .Help("Time to first token measured on the node, per model")
                     .Register(*registry_)),
      node_tpot_(BuildHistogram()
                     .Name("ballast_node_tpot_seconds")
                     .Help("Mean time per output token on the node, per model")
                     .Register(*registry_)),
      node_tokens_(BuildCounter()
                       .Name("ballast_node_tokens_generated_total")
                       .Help("Tokens generated on this node, per model")
                       .Register(*registry_)),
      kv_blocks_(BuildGauge()
                     .Name("ballast_node_kv_blocks")
                     .Help("KV cache blocks per device by state (used, free)")
                     .Register(*registry_)),
      memory_used_(BuildGauge()
                       .Name("ballast_node_memory_used_bytes")
                       .Help("Device memory held by weights and KV pools")
                       .Register(*registry_)),
      queue_length_(BuildGauge()
                        .Name("ballast_node_queue_length")
                        .Help("Requests waiting for admission per device")
                        .Register(*registry_)),
      running_(BuildGauge()
                   .Name("ballast_node_running_sequences")
                   .Help("Sequences in the running batch per device")
                   .Register(*registry_)),
      preemptions_(BuildCounter()
                       .Name("ballast_node_preemptions_total")
                       .Help("Sequences preempted (recomputed) for lack of KV blocks")
                       .Register(*registry_)),
      model_preemptions_(BuildCounter()
                             .Name("ballast_node_model_preemptions_total")
                             .Help("Running sequences preempted (recomputed later), per model, "
                                   "by cause: growth (its own next blocks found no room), kv "
                                   "(shed for another model's KV), weights (shed for weights: "
                                   "an activation or remapping's take-back)")
                             .Register(*registry_)),
      kv_slabs_(BuildGauge()
                    .Name("ballast_node_kv_slabs")
                    .Help("KV arena slabs per device by state (formatted, empty)")
                    .Register(*registry_)),
      kv_bytes_(BuildGauge()
                    .Name("ballast_node_kv_bytes")
                    .Help("KV memory per device by state (used, free)")
                    .Register(*registry_)),
      driver_calls_(BuildCounter()
                        .Name("ballast_node_page_driver_calls_total")
                        .Help("Page map/unmap calls (driver calls) per device")
                        .Register(*registry_)),
      tier_bytes_(BuildGauge()
                      .Name("ballast_node_kv_tier_bytes")
                      .Help("Session KV held below the devices, by tier (dram, ssd)")
                      .Register(*registry_)),
      tier_chunks_(BuildGauge()
                       .Name("ballast_node_kv_tier_chunks")
                       .Help("KV chunks indexed in the node's tiers")
                       .Register(*registry_)),
      kv_hits_(BuildCounter()
                   .Name("ballast_node_kv_hits_total")
                   .Help("Requests by where their prompt prefix KV came from (device, host_dram, "
                         "ssd, peer, recomputed, none)")
                   .Register(*registry_)),
      checksum_failures_(BuildCounter()
                             .Name("ballast_node_kv_checksum_failures_total")
                             .Help("KV chunk copies dropped as corrupt or truncated (their KV "
                                   "was recomputed)")
                             .Register(*registry_)),
      moved_bytes_(BuildCounter()
                       .Name("ballast_node_kv_moved_bytes_total")
                       .Help("KV bytes moved per link (ssd_read, ssd_write, peer_in, peer_out)")
                       .Register(*registry_)),
      prefetch_lead_(BuildHistogram()
                         .Name("ballast_node_kv_prefetch_lead_seconds")
                         .Help("Time from an Advise prefetch reaching the device to its use")
                         .Register(*registry_)),
      prefetches_(BuildCounter()
                      .Name("ballast_node_kv_prefetches_total")
                      .Help("Advise prefetches by outcome (used, invalidated, expired)")
                      .Register(*registry_)),
      step_host_(BuildHistogram()
                     .Name("ballast_node_step_host_seconds")
                     .Help("Per-step host time per device: the part of an engine step spent "
                           "outside the executor's forward (planning, token streaming, "
                           "finishes, KV exports)")
                     .Register(*registry_)),
      step_thread_(BuildCounter()
                       .Name("ballast_node_step_thread_seconds_total")
                       .Help("Wall time of each device's step thread by activity: begin "
                             "(arbitration, planning, launches), finish (tokens, finished "
                             "sequences; the device wait when it waits on a step), idle, other")
                       .Register(*registry_)),
      step_starts_(BuildCounter()
                       .Name("ballast_node_steps_total")
                       .Help("Steps begun on each device, by how: alone (none of the model's "
                             "in flight), ahead (queued behind the model's running step), late "
                             "(queued behind a step that had already ended: the model's stream "
                             "idled)")
                       .Register(*registry_)),
      step_drains_(
          BuildCounter()
              .Name("ballast_node_step_drains_total")
              .Help("Waits for every step in flight on each device (rolling steps), by "
                    "cause: reclaim (idle session KV shed for a model's KV), lender (only a "
                    "model's own steps, before it lends weight layers), shed (only the steps of "
                    "the models whose newer running sequences are shed for a model's KV), remap "
                    "(a revert), between (tasks, a model leaving), idle (no step-end signal in "
                    "time)")
              .Register(*registry_)),
      kv_reclaims_(BuildCounter()
                       .Name("ballast_node_kv_reclaims_total")
                       .Help("A model asking the device's other models for KV room, by result: "
                             "asked (their steps in flight finished first: a wait for the "
                             "device), nothing (none held anything to give: answered at once)")
                       .Register(*registry_)),
      kv_compactions_(BuildCounter()
                          .Name("ballast_node_kv_compactions_total")
                          .Help("KV compactions for weights (slabs drained: blocks moved to "
                                "other slabs, nothing shed), by result: drained, failed (a "
                                "model's blocks could not move and stayed)")
                          .Register(*registry_)),
      kv_compaction_bytes_(BuildCounter()
                               .Name("ballast_node_kv_compaction_bytes_total")
                               .Help("Bytes of KV compactions for weights: moved (blocks "
                                     "copied to other slabs), freed (slab pages given back)")
                               .Register(*registry_)),
      arbitration_decisions_(BuildCounter()
                                 .Name("ballast_node_arbitration_decisions_total")
                                 .Help("Arbitration passes that ordered a non-empty queue of "
                                       "requests waiting for their first step (node.arbitration)")
                                 .Register(*registry_)),
      arbitration_rejected_(BuildCounter()
                                .Name("ballast_node_arbitration_rejected_total")
                                .Help("Requests arbitration refused: their TTFT SLO could not be "
                                      "met and they asked to be refused rather than served late, "
                                      "or the device's expected wait passed max_queue_wait_ms")
                                .Register(*registry_)),
      arbitration_late_(BuildGauge()
                            .Name("ballast_node_arbitration_expected_late")
                            .Help("Queued requests the last arbitration expects to begin "
                                  "prefilling after their TTFT deadline, served back to back in "
                                  "its order at their predicted prefill costs")
                            .Register(*registry_)),
      urgent_steps_(BuildCounter()
                        .Name("ballast_node_urgent_steps_total")
                        .Help("Steps run at the greatest stream priority: the model holding the "
                              "arbitration's most urgent request, ahead of the others' steps")
                        .Register(*registry_)),
      node_queue_(BuildHistogram()
                      .Name("ballast_node_queue_seconds")
                      .Help("Time a request waited on the node before admission, per model")
                      .Register(*registry_)),
      activation_(BuildHistogram()
                      .Name("ballast_node_activation_seconds")
                      .Help("Model activation time by model and weight source (host_copy, disk)")
                      .Register(*registry_)),
      evictions_(BuildCounter()
                     .Name("ballast_node_evictions_total")
                     .Help("Models evicted from this node, per model")
                     .Register(*registry_)),
      remap_layers_(BuildGauge()
                        .Name("ballast_node_remap_layers")
                        .Help("Weight layers a model lends to KV (parameter remapping)")
                        .Register(*registry_)),
      remap_lendable_(BuildGauge()
                          .Name("ballast_node_remap_lendable_bytes")
                          .Help("Weight bytes the device's models could still lend to KV "
                                "(every model up to its remapping cap); the scheduler counts "
                                "them as KV room before evicting an idle model")
                          .Register(*registry_)),
      model_memory_(BuildGauge()
                        .Name("ballast_node_model_memory_bytes")
                        .Help("Device memory of each resident model by kind (weights; kv: "
                              "blocks held by its running and cached sequences; workspace: "
                              "its engine's buffers outside the KV pool)")
                        .Register(*registry_)),
      remap_streamed_(BuildCounter()
                          .Name("ballast_node_remap_streamed_bytes_total")
                          .Help("Weight bytes streamed from host memory into layer slots")
                          .Register(*registry_)),
      remap_stall_(BuildCounter()
                       .Name("ballast_node_remap_stall_seconds_total")
                       .Help("Compute time spent waiting for streamed layers (not hidden)")
                       .Register(*registry_)),
      remap_events_(BuildCounter()
                        .Name("ballast_node_remap_events_total")
                        .Help("Remapping events by kind: remap (layers lent), revert (taken "
                              "back), capped (every model at its cap; left to preemption), "
                              "forced (a revert of a model over its cap that preempted "
                              "running sequences for room)")
                        .Register(*registry_)) {}

void Metrics::AddModelSource(std::function<bool(const std::string&)> known) {
  absl::MutexLock lock(&sources_mu_);
  sources_.push_back(std::move(known));
}

std::string Metrics::ModelLabel(const std::string& model) const {
  absl::MutexLock lock(&sources_mu_);
  for (const auto& known : sources_)
    if (known(model)) return model;
  return kUnknownModel;
}

void Metrics::Record(prometheus::Family<prometheus::Counter>& requests,
                     prometheus::Family<prometheus::Histogram>& ttft,
                     prometheus::Family<prometheus::Histogram>& tpot,
                     prometheus::Family<prometheus::Counter>& tokens, const RequestOutcome& o) {
  const std::string model = ModelLabel(o.model);
  requests.Add({{"model", model}, {"status", o.status}}).Increment();
  if (o.ttft_s >= 0) ttft.Add({{"model", model}}, LatencyBuckets()).Observe(o.ttft_s);
  if (o.tpot_s >= 0) tpot.Add({{"model", model}}, LatencyBuckets()).Observe(o.tpot_s);
  if (o.tokens > 0) tokens.Add({{"model", model}}).Increment(static_cast<double>(o.tokens));
}

void Metrics::SetTenantSource(std::function<bool(const std::string&)> known) {
  absl::MutexLock lock(&sources_mu_);
  tenants_ = std::move(known);
}

std::string Metrics::TenantLabel(const std::string& tenant) const {
  if (tenant.empty()) return "default";
  absl::MutexLock lock(&sources_mu_);
  return tenants_ && tenants_(tenant) ? tenant : "other";
}

void Metrics::SchedulerRequest(const RequestOutcome& o) {
  Record(sched_requests_, sched_ttft_, sched_tpot_, sched_tokens_, o);
  sched_tenant_requests_.Add({{"tenant", TenantLabel(o.tenant)}, {"status", o.status}}).Increment();
  if (o.status == "CANCELLED") return;  // the client left: nothing to judge
  const bool ok = o.status == "OK";
  const std::string model = ModelLabel(o.model);
  auto judge = [&](const char* slo, double target, double measured) {
    const bool met = ok && measured >= 0 && measured <= target;
    sched_slo_.Add({{"model", model}, {"slo", slo}, {"result", met ? "met" : "missed"}})
        .Increment();
  };
  if (o.slo_ttft_s > 0) judge("ttft", o.slo_ttft_s, o.ttft_s);
  // TPOT needs two tokens: a successful one-token request is not judged.
  if (o.slo_tpot_s > 0 && !(ok && o.tpot_s < 0)) judge("tpot", o.slo_tpot_s, o.tpot_s);
}

void Metrics::NodeRequest(const RequestOutcome& o) {
  Record(node_requests_, node_ttft_, node_tpot_, node_tokens_, o);
  if (o.queue_s >= 0) {
    node_queue_.Add({{"model", ModelLabel(o.model)}}, LatencyBuckets()).Observe(o.queue_s);
  }
}

void Metrics::Activation(const std::string& model, const std::string& source, double seconds) {
  activation_.Add({{"model", ModelLabel(model)}, {"source", source}}, LatencyBuckets())
      .Observe(seconds);
}

void Metrics::Eviction(const std::string& label) { evictions_.Add({{"model", label}}).Increment(); }

void Metrics::SetNodes(int alive, int dead) {
  sched_nodes_.Add({{"state", "alive"}}).Set(alive);
  sched_nodes_.Add({{"state", "dead"}}).Set(dead);
}

void Metrics::SetSessions(int n) { sched_sessions_.Add({}).Set(n); }

void Metrics::SetStateWriteErrors(int64_t total) {
  auto& counter = sched_state_errors_.Add({});  // exported from the start, at 0
  const int64_t seen = state_errors_seen_.exchange(total);
  if (total > seen) counter.Increment(static_cast<double>(total - seen));
}

void Metrics::SetLeader(bool leads) { sched_leader_.Add({}).Set(leads ? 1 : 0); }

void Metrics::Rejection(const char* reason, const std::string& tenant) {
  sched_rejections_.Add({{"reason", reason}, {"tenant", TenantLabel(tenant)}}).Increment();
}

void Metrics::SetDevice(const DeviceGauges& g) {
  kv_blocks_.Add({{"device", g.device}, {"state", "used"}})
      .Set(static_cast<double>(g.kv_blocks_used));
  kv_blocks_.Add({{"device", g.device}, {"state", "free"}})
      .Set(static_cast<double>(g.kv_blocks_free));
  memory_used_.Add({{"device", g.device}}).Set(static_cast<double>(g.memory_used_bytes));
  queue_length_.Add({{"device", g.device}}).Set(g.queue_length);
  running_.Add({{"device", g.device}}).Set(g.running);
  kv_bytes_.Add({{"device", g.device}, {"state", "used"}})
      .Set(static_cast<double>(g.kv_bytes_used));
  kv_bytes_.Add({{"device", g.device}, {"state", "free"}})
      .Set(static_cast<double>(g.kv_bytes_free));
  kv_slabs_.Add({{"device", g.device}, {"state", "formatted"}})
      .Set(static_cast<double>(g.slabs_formatted));
  kv_slabs_.Add({{"device", g.device}, {"state", "empty"}}).Set(static_cast<double>(g.slabs_empty));
  absl::MutexLock lock(&mu_);
  // Engines restart their counts when models are evicted: count only growth.
  auto grow = [&](prometheus::Counter& c, const std::string& key, int64_t total)
                  ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { Grow(c, key, total); };
  grow(preemptions_.Add({{"device", g.device}}), "preempt/" + g.device, g.preemptions_total);
  grow(driver_calls_.Add({{"device", g.device}, {"call", "map"}}), "map/" + g.device,
       g.page_map_calls);
  grow(driver_calls_.Add({{"device", g.device}, {"call", "unmap"}}), "unmap/" + g.device,
       g.page_unmap_calls);
  // The device's histogram only grows: observe what it grew by.
  using H = node_manager::StepHostHistogram;
  static const prometheus::Histogram::BucketBoundaries kBounds(H::kBoundsS.begin(),
                                                               H::kBoundsS.end());
  H& seen = seen_step_host_[g.device];
  if (g.step_host.steps > seen.steps) {
    std::vector<double> increments(g.step_host.counts.size());
    for (size_t b = 0; b < increments.size(); ++b) {
      increments[b] = static_cast<double>(g.step_host.counts[b] - seen.counts[b]);
    }
    step_host_.Add({{"device", g.device}}, kBounds)
        .ObserveMultiple(increments, g.step_host.sum_s - seen.sum_s);
  }
  seen = g.step_host;
  node_manager::StepThreadTime& was = seen_step_thread_[g.device];
  using T = node_manager::StepThreadTime;
  for (const auto& [activity, field] :
       {std::pair{"begin", &T::begin_s}, std::pair{"finish", &T::finish_s},
        std::pair{"idle", &T::idle_s}, std::pair{"other", &T::other_s}}) {
    if (g.step_thread.*field > was.*field) {
      step_thread_.Add({{"device", g.device}, {"activity", activity}})
          .Increment(g.step_thread.*field - was.*field);
    }
  }
  was = g.step_thread;
  node_manager::StepStarts& began = seen_step_starts_[g.device];
  using S = node_manager::StepStarts;
  for (const auto& [how, field] : {std::pair{"alone", &S::alone}, std::pair{"ahead", &S::ahead},
                                   std::pair{"late", &S::late}}) {
    if (g.step_starts.*field > began.*field) {
      step_starts_.Add({{"device", g.device}, {"start", how}})
          .Increment(static_cast<double>(g.step_starts.*field - began.*field));
    }
  }
  began = g.step_starts;
  node_manager::StepDrains& drained = seen_step_drains_[g.device];
  using D = node_manager::StepDrains;
  for (const auto& [cause, field] :
       {std::pair{"reclaim", &D::reclaim}, std::pair{"lender", &D::lender},
        std::pair{"shed", &D::shed}, std::pair{"remap", &D::remap},
        std::pair{"between", &D::between}, std::pair{"idle", &D::idle}}) {
    if (g.step_drains.*field > drained.*field) {
      step_drains_.Add({{"device", g.device}, {"cause", cause}})
          .Increment(static_cast<double>(g.step_drains.*field - drained.*field));
    }
  }
  drained = g.step_drains;
  SetKvCounters(g);
  SetArbitration(g);
  SetRemap(g.device, g.remap);
  SetModelMemory(g.device, g.model_memory);
}

void Metrics::SetModelMemory(const std::string& device,
                             const std::vector<node_manager::ModelMemory>& models) {
  std::set<std::string>& before = memory_models_[device];
  std::set<std::string> now;
  for (const auto& m : models) {
    const std::string label = ModelLabel(m.model);
    model_memory_.Add({{"device", device}, {"model", label}, {"kind", "weights"}})
        .Set(static_cast<double>(m.weight_bytes));
    model_memory_.Add({{"device", device}, {"model", label}, {"kind", "kv"}})
        .Set(static_cast<double>(m.kv_bytes_used));
    model_memory_.Add({{"device", device}, {"model", label}, {"kind", "workspace"}})
        .Set(static_cast<double>(m.workspace_bytes));
    now.insert(label);
  }
  for (const std::string& label : before) {
    if (now.count(label)) continue;
    for (const char* kind : {"weights", "kv", "workspace"}) {
      model_memory_.Remove(
          &model_memory_.Add({{"device", device}, {"model", label}, {"kind", kind}}));
    }
  }
  before = std::move(now);
}

void Metrics::SetRemap(const std::string& device, const node_manager::RemapStats& r) {
  std::set<std::string>& models = remap_models_[device];
  for (const std::string& m : models) {
    if (!r.layers.count(m)) remap_layers_.Add({{"device", device}, {"model", m}}).Set(0);
  }
  models.clear();
  for (const auto& [m, n] : r.layers) {
    remap_layers_.Add({{"device", device}, {"model", m}}).Set(n);
    models.insert(m);
  }
  remap_lendable_.Add({{"device", device}}).Set(static_cast<double>(r.lendable_bytes));
  Grow(remap_streamed_.Add({{"device", device}}), "remap_bytes/" + device, r.streamed_bytes);
  Grow(remap_events_.Add({{"device", device}, {"kind", "remap"}}), "remap/" + device,
       r.remap_events);
  Grow(remap_events_.Add({{"device", device}, {"kind", "revert"}}), "revert/" + device,
       r.revert_events);
  Grow(remap_events_.Add({{"device", device}, {"kind", "capped"}}), "capped/" + device,
       r.capped_events);
  Grow(remap_events_.Add({{"device", device}, {"kind", "forced"}}), "forced/" + device,
       r.forced_reverts);
  double& stall = seen_stall_[device];
  if (r.stall_seconds > stall)
    remap_stall_.Add({{"device", device}}).Increment(r.stall_seconds - stall);
  stall = r.stall_seconds;
}

void Metrics::SetArbitration(const DeviceGauges& g) {
  const std::string& d = g.device;
  const node_manager::ArbitrationStats& a = g.arbitration;
  Grow(arbitration_decisions_.Add({{"device", d}}), "arb-decisions/" + d, a.decisions);
  Grow(arbitration_rejected_.Add({{"device", d}}), "arb-rejected/" + d, a.rejected);
  Grow(urgent_steps_.Add({{"device", d}}), "urgent/" + d, a.urgent_steps);
  arbitration_late_.Add({{"device", d}}).Set(static_cast<double>(a.expected_late));
}

void Metrics::SetKvCounters(const DeviceGauges& g) {
  node_manager::KvReclaims& reclaims = seen_kv_reclaims_[g.device];
  using R = node_manager::KvReclaims;
  for (const auto& [result, field] :
       {std::pair{"asked", &R::asked}, std::pair{"nothing", &R::nothing}}) {
    if (g.kv_reclaims.*field > reclaims.*field) {
      kv_reclaims_.Add({{"device", g.device}, {"result", result}})
          .Increment(static_cast<double>(g.kv_reclaims.*field - reclaims.*field));
    }
  }
  reclaims = g.kv_reclaims;
  const std::string& d = g.device;
  using P = node_manager::ModelPreemptions;
  for (const P& p : g.model_preemptions) {
    const std::string model = ModelLabel(p.model);
    for (const auto& [cause, field] : {std::pair{"growth", &P::growth}, std::pair{"kv", &P::for_kv},
                                       std::pair{"weights", &P::for_weights}}) {
      Grow(model_preemptions_.Add({{"device", d}, {"model", model}, {"cause", cause}}),
           absl::StrCat("preempt/", d, "/", p.model, "/", cause), p.*field);
    }
  }
  const node_manager::KvCompactions& c = g.kv_compactions;
  Grow(kv_compactions_.Add({{"device", d}, {"result", "drained"}}), "drains/" + d, c.drains);
  Grow(kv_compactions_.Add({{"device", d}, {"result", "failed"}}), "drain_failed/" + d, c.failed);
  Grow(kv_compaction_bytes_.Add({{"device", d}, {"what", "moved"}}), "moved/" + d, c.moved_bytes);
  Grow(kv_compaction_bytes_.Add({{"device", d}, {"what", "freed"}}), "freed/" + d, c.freed_bytes);
}

void Metrics::Grow(prometheus::Counter& c, const std::string& key, int64_t total) {
  int64_t& seen = seen_[key];
  if (total > seen) c.Increment(static_cast<double>(total - seen));
  seen = total;
}

void Metrics::SetKvTiers(const KvTierGauges& g) {
  tier_bytes_.Add({{"tier", "dram"}}).Set(static_cast<double>(g.dram_bytes));
  tier_bytes_.Add({{"tier", "ssd"}}).Set(static_cast<double>(g.ssd_bytes));
  tier_chunks_.Add({}).Set(static_cast<double>(g.chunks));
  absl::MutexLock lock(&mu_);
  auto grow = [&](prometheus::Counter& c, const std::string& key, int64_t total)
                  ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { Grow(c, key, total); };
  grow(checksum_failures_.Add({}), "kv/checksum", g.checksum_failures);
  grow(moved_bytes_.Add({{"link", "ssd_read"}}), "kv/ssd_read", g.ssd_read_bytes);
  grow(moved_bytes_.Add({{"link", "ssd_write"}}), "kv/ssd_write", g.ssd_write_bytes);
  grow(moved_bytes_.Add({{"link", "peer_in"}}), "kv/peer_in", g.peer_in_bytes);
  grow(prefetches_.Add({{"outcome", "used"}}), "kv/used", g.prefetch_used);
  grow(prefetches_.Add({{"outcome", "invalidated"}}), "kv/invalidated", g.prefetch_invalidated);
  grow(prefetches_.Add({{"outcome", "expired"}}), "kv/expired", g.prefetch_expired);
}

void Metrics::KvHit(const std::string& source, double prefetch_lead_s) {
  kv_hits_.Add({{"source", source}}).Increment();
  if (prefetch_lead_s >= 0) prefetch_lead_.Add({}, LatencyBuckets()).Observe(prefetch_lead_s);
}

void Metrics::PeerBytesSent(int64_t bytes) {
  moved_bytes_.Add({{"link", "peer_out"}}).Increment(static_cast<double>(bytes));
}

absl::StatusOr<std::unique_ptr<prometheus::Exposer>> StartExposer(
    const std::string& address, const std::shared_ptr<prometheus::Registry>& registry) {
  try {
    // Enough civetweb workers that idle connections cannot hold every one,
    // and a bound on how long an idle connection keeps its worker: two idle
    // clients used to block every scrape for 30 s.
    auto exposer = std::make_unique<prometheus::Exposer>(std::vector<std::string>{
        "listening_ports", address, "num_threads", "8", "request_timeout_ms", "2000"});
    exposer->RegisterCollectable(registry);
    return exposer;
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve /metrics on ", address, ": ", e.what()));
  }
}

}  // namespace ballast::server
