// Metrics: every Prometheus family Ballast exports, built in one place with
// the shared prefix `ballast_` and unit suffixes (`_seconds`, `_total`).
// Scheduler families are `ballast_scheduler_*`, node families
// `ballast_node_*`; the embedded `serve` exports both from one registry.
//
// Label cardinality: a request's `model` label is its model's name only if
// a model source (AddModelSource: the scheduler's catalogue, the node's
// resident models) knows the name; every other name counts under the one
// value "unknown", so junk names in requests cannot grow /metrics.
//
// Thread-safety: all methods are thread-safe (prometheus-cpp metrics are;
// the preemption delta bookkeeping has its own mutex).
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "node_manager/model_memory.h"
#include "node_manager/remap_options.h"
#include "node_manager/step_host_histogram.h"
#include "prometheus/counter.h"
#include "prometheus/exposer.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace ballast::server {

struct RequestOutcome {
  std::string model;
  std::string status;  // gRPC status code name, e.g. "OK", "NOT_FOUND"
  double ttft_s = -1;  // < 0: no token was produced
  double tpot_s = -1;  // < 0: fewer than two tokens
  int64_t tokens = 0;
  double queue_s = -1;  // node side: waiting for admission (< 0: not admitted)
  // The request's SLO targets (scheduler side; <= 0: none), for the
  // attainment series.
  double slo_ttft_s = 0;
  double slo_tpot_s = 0;
  // Scheduler side: the tenant the request acted as (after API keys).
  std::string tenant = {};
};

struct DeviceGauges {
  std::string device;
  int64_t kv_blocks_used = 0, kv_blocks_free = 0;
  int64_t memory_used_bytes = 0;
  int queue_length = 0, running = 0;
  int64_t preemptions_total = 0;                 // cumulative, as the engines count it
  int64_t slabs_formatted = 0, slabs_empty = 0;  // elastic KV arena
  int64_t kv_bytes_used = 0, kv_bytes_free = 0;
  int64_t page_map_calls = 0, page_unmap_calls = 0;     // cumulative driver calls
  node_manager::StepHostHistogram step_host;            // cumulative per-step host time
  node_manager::StepThreadTime step_thread = {};        // cumulative, by activity
  node_manager::StepStarts step_starts = {};            // cumulative, by how begun
  node_manager::StepDrains step_drains = {};            // cumulative, by cause
  node_manager::RemapStats remap = {};                  // parameter remapping (cumulative)
  node_manager::KvReclaims kv_reclaims = {};            // other models asked for KV (cumulative)
  node_manager::KvCompactions kv_compactions = {};      // KV moved for weights (cumulative)
  node_manager::ArbitrationStats arbitration = {};      // request arbitration (cumulative)
  std::vector<node_manager::ModelMemory> model_memory;  // per resident model
  std::vector<node_manager::ModelPreemptions> model_preemptions;  // per resident model
};

// The node's session KV tiers (node_manager::KvTierStats plus the engines'
// prefetch outcomes); counters are cumulative totals.
struct KvTierGauges {
  int64_t dram_bytes = 0, ssd_bytes = 0, chunks = 0;
  int64_t checksum_failures = 0;
  int64_t ssd_read_bytes = 0, ssd_write_bytes = 0, peer_in_bytes = 0;
  int64_t prefetch_used = 0, prefetch_invalidated = 0, prefetch_expired = 0;
};

class Metrics {
 public:
  Metrics();
  const std::shared_ptr<prometheus::Registry>& registry() const { return registry_; }

  // Label value for models no source knows.
  static constexpr const char* kUnknownModel = "unknown";
  // Adds a predicate saying whether a model name is registered. Call before
  // requests are recorded (sources must outlive this object's use).
  void AddModelSource(std::function<bool(const std::string&)> known);
  // `model`, or kUnknownModel if no source knows it.
  std::string ModelLabel(const std::string& model) const;
  // Tenants get label values of their own only when `known` says so (the
  // API key file's, the quota config's); "" is "default" and every other
  // tenant counts as "other", so tenant names in requests cannot grow
  // /metrics.
  void SetTenantSource(std::function<bool(const std::string&)> known);
  std::string TenantLabel(const std::string& tenant) const;

  // A finished request: its status, latencies, tokens and, against its
  // SLO targets, ballast_scheduler_slo_requests_total{model, slo, result}:
  // met, or missed (measured over the target, or the request failed
  // before the measurement). Requests the client cancelled are not judged.
  void SchedulerRequest(const RequestOutcome& o);
  void SetNodes(int alive, int dead);
  void SetSessions(int n);
  // The session directory's failed state-store writes so far
  // (SessionDirectory::write_errors): ballast_scheduler_state_write_errors_total.
  void SetStateWriteErrors(int64_t total);
  // ballast_scheduler_leader: 1 while this process schedules (it won the
  // scheduler.state.etcd election, or runs without one), 0 while it stands
  // by with its gRPC ports closed. Never set: not exported (a node).
  void SetLeader(bool leads);
  // Rejection reasons, a fixed set: the tenant is over its advisory rate
  // (scheduler.quotas); the queue of admitted advisories is full
  // (scheduler.advise_queue).
  static constexpr const char* kRejectAdviseQuota = "advise_quota";
  static constexpr const char* kRejectAdviseQueueFull = "advise_queue_full";
  // A call refused before any work was done for it, by reason (a kReject*
  // value) and tenant (TenantLabel):
  // ballast_scheduler_rejections_total{reason,tenant}.
  void Rejection(const char* reason, const std::string& tenant);
  void NodeRequest(const RequestOutcome& o);
  void SetDevice(const DeviceGauges& g);
  void SetKvTiers(const KvTierGauges& g);
  // A served request's KV source (device, host_dram, ssd, peer,
  // recomputed, none) and, for a prefetched one, its lead time (< 0: none).
  void KvHit(const std::string& source, double prefetch_lead_s);
  // Bytes this node sent to peers (FetchKv).
  void PeerBytesSent(int64_t bytes);
  // A model activated on this node in `seconds`, its weights from
  // `source` (host_copy: the pinned host copy; disk: its checkpoint).
  void Activation(const std::string& model, const std::string& source, double seconds);
  // A model evicted from this node (by the scheduler: idle, room, a move);
  // `label` is ModelLabel(model) taken before the eviction (after it the
  // node no longer knows the model).
  void Eviction(const std::string& label);

 private:
  void Record(prometheus::Family<prometheus::Counter>& requests,
              prometheus::Family<prometheus::Histogram>& ttft,
              prometheus::Family<prometheus::Histogram>& tpot,
              prometheus::Family<prometheus::Counter>& tokens, const RequestOutcome& o);

  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>& sched_requests_;
  prometheus::Family<prometheus::Histogram>& sched_ttft_;
  prometheus::Family<prometheus::Histogram>& sched_tpot_;
  prometheus::Family<prometheus::Counter>& sched_tokens_;
  prometheus::Family<prometheus::Counter>& sched_slo_;
  prometheus::Family<prometheus::Counter>& sched_tenant_requests_;
  prometheus::Family<prometheus::Gauge>& sched_nodes_;
  prometheus::Family<prometheus::Gauge>& sched_sessions_;
  prometheus::Family<prometheus::Counter>& sched_state_errors_;
  prometheus::Family<prometheus::Gauge>& sched_leader_;
  prometheus::Family<prometheus::Counter>& sched_rejections_;
  std::atomic<int64_t> state_errors_seen_{0};
  prometheus::Family<prometheus::Counter>& node_requests_;
  prometheus::Family<prometheus::Histogram>& node_ttft_;
  prometheus::Family<prometheus::Histogram>& node_tpot_;
  prometheus::Family<prometheus::Counter>& node_tokens_;
  prometheus::Family<prometheus::Gauge>& kv_blocks_;
  prometheus::Family<prometheus::Gauge>& memory_used_;
  prometheus::Family<prometheus::Gauge>& queue_length_;
  prometheus::Family<prometheus::Gauge>& running_;
  prometheus::Family<prometheus::Counter>& preemptions_;
  prometheus::Family<prometheus::Counter>& model_preemptions_;
  prometheus::Family<prometheus::Gauge>& kv_slabs_;
  prometheus::Family<prometheus::Gauge>& kv_bytes_;
  prometheus::Family<prometheus::Counter>& driver_calls_;
  prometheus::Family<prometheus::Gauge>& tier_bytes_;
  prometheus::Family<prometheus::Gauge>& tier_chunks_;
  prometheus::Family<prometheus::Counter>& kv_hits_;
  prometheus::Family<prometheus::Counter>& checksum_failures_;
  prometheus::Family<prometheus::Counter>& moved_bytes_;
  prometheus::Family<prometheus::Histogram>& prefetch_lead_;
  prometheus::Family<prometheus::Counter>& prefetches_;
  prometheus::Family<prometheus::Histogram>& step_host_;
  prometheus::Family<prometheus::Counter>& step_thread_;
  prometheus::Family<prometheus::Counter>& step_starts_;
  prometheus::Family<prometheus::Counter>& step_drains_;
  prometheus::Family<prometheus::Counter>& kv_reclaims_;
  prometheus::Family<prometheus::Counter>& kv_compactions_;
  prometheus::Family<prometheus::Counter>& kv_compaction_bytes_;
  prometheus::Family<prometheus::Counter>& arbitration_decisions_;
  prometheus::Family<prometheus::Counter>& arbitration_rejected_;
  prometheus::Family<prometheus::Gauge>& arbitration_late_;
  prometheus::Family<prometheus::Counter>& urgent_steps_;
  prometheus::Family<prometheus::Histogram>& node_queue_;
  prometheus::Family<prometheus::Histogram>& activation_;
  prometheus::Family<prometheus::Counter>& evictions_;
  prometheus::Family<prometheus::Gauge>& remap_layers_;
  prometheus::Family<prometheus::Gauge>& remap_lendable_;
  prometheus::Family<prometheus::Gauge>& model_memory_;
  prometheus::Family<prometheus::Counter>& remap_streamed_;
  prometheus::Family<prometheus::Counter>& remap_stall_;
  prometheus::Family<prometheus::Counter>& remap_events_;

  mutable absl::Mutex sources_mu_;
  std::vector<std::function<bool(const std::string&)>> sources_ ABSL_GUARDED_BY(sources_mu_);
  std::function<bool(const std::string&)> tenants_ ABSL_GUARDED_BY(sources_mu_);

  // Adds to `c` what `total` (a cumulative count that may restart from 0)
  // grew by since the last call for `key`. REQUIRES: mu_ held.
  void Grow(prometheus::Counter& c, const std::string& key, int64_t total)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  // Last cumulative value seen per series, to turn totals into increments.
  std::map<std::string, int64_t> seen_ ABSL_GUARDED_BY(mu_);
  // Last cumulative step-host histogram seen per device.
  std::map<std::string, node_manager::StepHostHistogram> seen_step_host_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, node_manager::StepThreadTime> seen_step_thread_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, node_manager::StepStarts> seen_step_starts_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, node_manager::StepDrains> seen_step_drains_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, node_manager::KvReclaims> seen_kv_reclaims_ ABSL_GUARDED_BY(mu_);
  // Remapping: stall seconds seen per device; models with lent layers per
  // device at the last update (their gauge drops to 0 when they leave).
  std::map<std::string, double> seen_stall_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::set<std::string>> remap_models_ ABSL_GUARDED_BY(mu_);
  // Models with memory series per device at the last update (series of
  // models no longer resident are removed).
  std::map<std::string, std::set<std::string>> memory_models_ ABSL_GUARDED_BY(mu_);
  // SetDevice's per-model memory series. REQUIRES: mu_ held.
  void SetModelMemory(const std::string& device,
                      const std::vector<node_manager::ModelMemory>& models)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // SetDevice's KV reclaim and compaction counters. REQUIRES: mu_ held.
  void SetKvCounters(const DeviceGauges& g) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // SetDevice's arbitration series. REQUIRES: mu_ held.
  void SetArbitration(const DeviceGauges& g) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // SetDevice's remapping series. REQUIRES: mu_ held.
  void SetRemap(const std::string& device, const node_manager::RemapStats& r)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
};

// Serves `registry` on http://<address>/metrics. Errors name the address.
absl::StatusOr<std::unique_ptr<prometheus::Exposer>> StartExposer(
    const std::string& address, const std::shared_ptr<prometheus::Registry>& registry);

}  // namespace ballast::server
