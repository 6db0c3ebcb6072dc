// Scheduler: the global scheduler's core. It owns the model registry, the
// cluster state and the session directory; routes each request to a node
// where its model is resident (session affinity first, then least loaded);
// and runs a control loop that declares silent nodes dead and keeps every
// registered model at its replica count (loading it on the node chosen by
// placement, evicting models that were unregistered).
//
// The control loop's tick is a sequence of named steps (scheduler_control.cc):
// sweep dead nodes, advance migrations, rebalance (kvpr), reconcile
// replicas in both directions (loading missing ones, making room by idle
// eviction only where a node refused a load for room, draining extra
// ones), evict
// models the catalogue no longer lists. Blocking node calls (load, evict,
// drop session) run on a bounded WorkerPool, never a thread per call.
//
// gRPC plumbing (services, stream proxying) lives in server/; this class
// only decides. Thread-safety: all public methods are thread-safe.
// Shutdown order: Stop() ends the control loop, wakes the requests waiting
// for a replica (they end UNAVAILABLE), then ends the worker pool (which
// finishes the node calls already started or queued).
#pragma once

#include <grpcpp/channel.h>
#include <grpcpp/security/credentials.h>

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "ballast/v1/admin.pb.h"
#include "ballast/v1/inference.pb.h"
#include "ballast/v1/node.grpc.pb.h"
#include "global_scheduler/catalogue_store.h"
#include "global_scheduler/cluster_state.h"
#include "global_scheduler/model_registry.h"
#include "global_scheduler/model_stats.h"
#include "global_scheduler/node_channels.h"
#include "global_scheduler/placement.h"
#include "global_scheduler/routing_waiters.h"
#include "global_scheduler/session_directory.h"
#include "global_scheduler/state_store.h"
#include "global_scheduler/tenant_quotas.h"
#include "transfer/worker_pool.h"

namespace ballast::global_scheduler {

struct SchedulerOptions {
  // Credentials of the scheduler's connections to the nodes (mTLS, built by
  // server/tls.h from scheduler.tls). Default null: plaintext.
  std::shared_ptr<grpc::ChannelCredentials> node_credentials;
  // A node with no heartbeat for this long is dead. Default 3 s.
  absl::Duration heartbeat_timeout = absl::Seconds(3);
  // Interval nodes are told to heartbeat at. Default 1 s.
  absl::Duration heartbeat_interval = absl::Seconds(1);
  // Control-loop period (liveness sweep, replica reconciliation). 200 ms.
  absl::Duration control_interval = absl::Milliseconds(200);
  // How long a request waits for a replica of its model to become ready
  // (e.g. while the model loads) before failing UNAVAILABLE. Default 30 s.
  absl::Duration route_wait = absl::Seconds(30);
  // Wait before retrying a failed model load. Default 10 s.
  absl::Duration load_retry = absl::Seconds(10);
  // Deadline of one LoadModel call. Default 300 s.
  absl::Duration load_timeout = absl::Seconds(300);
  // KVPR rebalancing (placement_policy kvpr only): every interval the
  // whole catalogue is re-placed with Prism's Algorithm 1 (kvpr.h) from the
  // windowed statistics, and at most one single-replica model whose device
  // changes is migrated (MigrateModel). Zero: never. Default 30 s.
  absl::Duration rebalance_interval = absl::Seconds(30);
  // Algorithm 1's threshold: move only if the KVPR improves by more than
  // this fraction. Default 0.2.
  double migration_threshold = 0.2;
  // KVPR's step budget (kvpr.h's StepBudgetHolds; placement_policy kvpr):
  // new replicas and rebalancing moves prefer devices where the models'
  // decode steps (ResidentModel.decode_step_ms, as the nodes measure them)
  // sum to at most this many times the tightest TPOT SLO among them.
  // Models not yet measured count 0. Costs a lookup per model per
  // candidate device. 0 (the default): off, KVPR by memory alone.
  double step_budget_headroom = 0;
  // SLOs used when neither the request nor the model sets one.
  uint32_t default_ttft_ms = 5000;
  uint32_t default_tpot_ms = 500;
  // Sliding window of the per-model load statistics. Default 60 s.
  absl::Duration stats_window = absl::Seconds(60);
  // Where a replica is loaded: "most_free" (most free device memory, the
  // baseline), "kvpr" (lowest resulting KV pressure, Prism Algorithm 1's
  // step, from the windowed statistics) or "mme" (FineServe's score, eq. 3,
  // placement.h). Default most_free.
  std::string placement_policy = "most_free";
  // A model with no request for this long may be evicted when another
  // model needs room for its weights (idle_eviction.h); the next request
  // reactivates it. Zero: never evict idle models. Default 45 s.
  absl::Duration idle_evict_after = absl::Seconds(45);
  // KV pressure (idle_eviction.h, ChooseKvPressureVictim): while requests
  // queue on an elastic device whose KV room is below this fraction of its
  // memory, a model idle past idle_evict_after with no request in flight is
  // evicted from it, one at a time (the next waits for a heartbeat taken
  // after the last ended), so the weights of idle models do not starve the
  // active ones' KV. Zero: only weight room evicts. Default 0.05.
  double kv_pressure_free_fraction = 0.05;
  // Longest a draining eviction (idle eviction, migration) lets in-flight
  // requests run on the old replica before they fail UNAVAILABLE. Sent to
  // the node with the EvictModel call, whose RPC deadline is this plus
  // evict_rpc_margin. Default 10 min.
  absl::Duration drain_timeout = absl::Minutes(10);
  // What a draining EvictModel call may take beyond drain_timeout (the
  // node's host copy and unmapping). Default 60 s.
  absl::Duration evict_rpc_margin = absl::Seconds(60);
  // How long RegisterNode waits for a connection to the address of a live
  // node whose id another incarnation claims. Default 500 ms.
  absl::Duration identity_probe = absl::Milliseconds(500);
  // A load onto a node whose connection is down (e.g. it just restarted at
  // the same address) first waits this long for the connection, instead of
  // failing at once and waiting load_retry. Default 3 s.
  absl::Duration node_connect_wait = absl::Seconds(3);
  // A request's node must accept its stream (send initial metadata, which
  // a node does on receipt) within this long; if it does not, and the
  // model has a live replica elsewhere, the node is marked suspect and the
  // request retried there (a hung node: keepalive alone takes up to 2 s).
  // With no replica elsewhere the request keeps waiting. Zero: off.
  // Default 400 ms.
  absl::Duration node_accept_timeout = absl::Milliseconds(400);
  // Connections (HTTP/2) to each node; calls are spread over them
  // round-robin (global_scheduler/node_channels.h). One connection's frames
  // are handled in order, so streams sharing one are bounded by it.
  // Default 1: more measured no gain on one GPU (docs/benchmarks.md); each
  // costs a socket and a little memory per node.
  int node_channels = 1;
  // After start, replicas are not loaded for models with no request yet
  // for this long: nodes that hold replicas re-register within a heartbeat
  // timeout, and loading before they do would duplicate (then trim) them.
  // A request for a model loads it at once. The daemon sets it to twice
  // heartbeat_timeout (scheduler.startup_grace_ms). Default 0 (tests).
  absl::Duration startup_grace = absl::ZeroDuration();
  // Threads for blocking node calls (load, evict, drop session); more
  // calls wait their turn. Default 16.
  int control_threads = 16;
  // A session with no turn for this long is marked lost and its KV freed on
  // the nodes (SessionDirectory::Expire, every control tick). Zero: never.
  // Default 30 min.
  absl::Duration session_ttl = absl::Minutes(30);
  // Most sessions tracked (SessionDirectory). Default 100000.
  int max_sessions = 100000;
  // Per-tenant rate limits and caps (scheduler.quotas; tenant_quotas.h).
  // Default: none.
  QuotaOptions quotas;
  // Advise calls that passed their tenant's quota run on a pool of their
  // own (server/scheduler_service.h), apart from Generate's routing, so a
  // tenant allowed many advisories cannot hold up other tenants' requests.
  // Threads of that pool: each runs one advisory at a time, blocked in its
  // node call (PrefetchKv: up to 30 s). Default 4.
  int advise_threads = 4;
  // Admitted advisories waiting for one of those threads. Past it, Advise
  // is refused RESOURCE_EXHAUSTED with a retry hint (counted in
  // ballast_scheduler_rejections_total{reason="advise_queue_full"}); its
  // quota token is not given back. Each waiting advisory holds its request
  // and an open call (about a kilobyte), and a deep queue delays hints
  // that only help before their turn arrives. Default 256.
  int advise_queue = 256;
  std::vector<ModelSpec> models;
  // The SQLite database that keeps the scheduler's state across restarts
  // (state_store.h): the Admin API's catalogue changes (catalogue_store.h)
  // and the session directory with its token histories. Its directory must
  // exist. Empty: nothing persisted (lost at restart). Default empty; the
  // shipped configs set scheduler.state.path.
  std::string state_path;
  // How the database writes (sync mode, size cap). Default: WAL with
  // synchronous=NORMAL (survives kill -9), no cap.
  SqliteStateOptions state;
  // Tests: a store used instead of opening state_path. Default null.
  std::shared_ptr<StateStore> state_store;
};

// What a node's failed LoadModel status means for the model (LoadFailure,
// model_registry.h): RESOURCE_EXHAUSTED is no room; INVALID_ARGUMENT,
// NOT_FOUND, UNIMPLEMENTED, FAILED_PRECONDITION, DATA_LOSS, OUT_OF_RANGE and
// PERMISSION_DENIED are permanent; anything else is transient.
LoadFailure ClassifyLoadError(grpc::StatusCode code);

// A request bound to a node.
struct Route {
  std::string model;
  std::string node_id;
  std::shared_ptr<v1::Node::StubInterface> stub;
  std::string session_id;
  std::vector<int> history;
  // Chat: the session's conversation before this turn, and this turn's
  // messages (recorded with the reply when the turn succeeds).
  std::vector<v1::ChatMessage> history_messages;
  std::vector<v1::ChatMessage> turn_messages;
  uint32_t ttft_ms = 0, tpot_ms = 0;  // effective SLOs
  // The session's last node, when it is alive but the turn goes elsewhere:
  // the serving node fetches the session's KV from its tiers (peer tier).
  std::string kv_peer;
};

// A request being routed (Scheduler::BeginRoute .. TryRoute): its route so
// far and its wait. Touched by one routing step at a time.
struct PendingRoute {
  Route route;
  std::string affinity;    // the session's node, preferred when it serves
  std::string avoid_node;  // never picked (a node the request failed on)
  absl::Time deadline;     // end of route_wait (real time)
  uint64_t version = 0;    // the routing version TryRoute last looked at
  bool kicked = false;     // the control loop was woken for an activation
};

class Scheduler {
 public:
  static absl::StatusOr<std::unique_ptr<Scheduler>> Create(const SchedulerOptions& options,
                                                           Clock clock = absl::Now);
  ~Scheduler();

  void Start();  // starts the control loop
  void Stop();
  // One pass of the control loop, now (Start runs one every
  // control_interval or when kicked). Tests drive it with an injected clock.
  void RunControlTick() { ControlTick(); }

  // NodeRegistry. ALREADY_EXISTS when the id is held by a live node of
  // another incarnation that still accepts connections at its address
  // (probed for identity_probe); one that does not is replaced.
  absl::StatusOr<v1::RegisterNodeResponse> RegisterNode(const v1::RegisterNodeRequest& req);
  v1::HeartbeatResponse Heartbeat(const v1::HeartbeatRequest& req);

  // Admin.
  absl::Status RegisterModel(const ModelSpec& spec);
  absl::Status UnregisterModel(const std::string& name);
  // Starts moving `model` from `from_node` to `to_node` (Admin.MigrateModel),
  // onto `to_device` (empty: the node picks its least used device).
  // NOT_FOUND for an unknown model or node; FAILED_PRECONDITION if the
  // model is not READY on from_node, already on to_node, or moving.
  absl::Status MigrateModel(const std::string& model, const std::string& from_node,
                            const std::string& to_node, const std::string& to_device = "");
  // Admin.DrainNode: cordons `node_id` (nothing placed there; requests go
  // to other replicas first) and starts moving its READY models to other
  // nodes; the control loop keeps moving what is left. `undo` lifts the
  // cordon. NOT_FOUND for an unknown node.
  absl::StatusOr<v1::DrainNodeResponse> DrainNode(const std::string& node_id, bool undo);
  bool IsCordoned(const std::string& node_id) const ABSL_LOCKS_EXCLUDED(mu_);
  v1::ClusterState GetClusterState() const;
  // Whether `model` is in the catalogue.
  bool HasModel(const std::string& model) const { return registry_.Get(model).has_value(); }
  // The catalogue entry of `model`, if registered.
  std::optional<ModelSpec> Spec(const std::string& model) const {
    auto m = registry_.Get(model);
    return m ? std::optional<ModelSpec>(m->spec) : std::nullopt;
  }
  v1::ListModelsResponse ListModels() const;
  // A request of `model` finished: feeds the sliding-window statistics
  // (ListModels' `load`; KVPR's demand inputs) and charges `tenant`'s
  // prompt-token quota.
  void RecordCompletion(const std::string& model, int64_t prompt_tokens, int64_t decode_tokens,
                        const std::string& tenant = "");
  // A Generate request against its tenant's quotas (rate, prompt-token
  // debt, prompt size): RESOURCE_EXHAUSTED with a retry hint if over.
  absl::Status AdmitRequest(const v1::GenerateRequest& req);
  ModelRates Load(const std::string& model) const { return stats_.Rates(model, clock_()); }

  // Inference: validates `req`, begins the session turn and picks a node.
  //
  // Lost history: the first turn of a session id the directory does not
  // know asks every live node whether it served turns of that id
  // (DropSession, whose response says so; the call also frees any KV kept
  // under the id). If one did, the scheduler lost the session's history
  // (it restarted): the turn fails DATA_LOSS and the id stays lost
  // (SessionDirectory). Clients need to send nothing extra. A suspect node,
  // or one that does not answer within 500 ms, counts as not knowing the id.
  // While no replica is READY it waits (up to route_wait) for the cluster's
  // routing version to change; `cancelled` is checked on every change and
  // at least every 250 ms (the synchronous gRPC API has no cancellation
  // callback).
  // `avoid_node`: a node this request already failed on (the one retry of
  // a request whose node failed before its first token); never picked.
  absl::StatusOr<Route> RouteRequest(const v1::GenerateRequest& req,
                                     const std::function<bool()>& cancelled,
                                     const std::string& avoid_node = "");
  // RouteRequest in steps, for callers that must not block a thread while
  // no replica is ready (the gRPC reactors' bounded routing pool):
  // BeginRoute validates and begins the session turn (it may call nodes,
  // for at most 500 ms); TryRoute picks a node now if it can, else returns
  // nullopt, or the error RouteRequest would end with (the model failed,
  // the route_wait is over, or `cancelled`); then AwaitReplica calls `wake`
  // once when routing changed, the wait is over or `cancelled()` turned
  // true, and the caller calls TryRoute again.
  absl::Status BeginRoute(const v1::GenerateRequest& req, const std::string& avoid_node,
                          PendingRoute* pending);
  absl::StatusOr<std::optional<Route>> TryRoute(const v1::GenerateRequest& req,
                                                PendingRoute* pending, bool cancelled);
  void AwaitReplica(const PendingRoute& pending, std::function<bool()> cancelled,
                    std::function<void()> wake);
  // Ends a route begun but never finished by TryRoute (the caller could
  // not go on, e.g. at shutdown): the session turn is aborted.
  void AbandonRoute(const PendingRoute& pending);
  // Ends a routed request. On success (`final` set) the session history
  // grows by the turn's prompt and output tokens (a chat turn's prompt
  // replaces it, and its messages and the reply join the conversation);
  // on failure (null) it is left as it was. A turn the state store could
  // not save is not part of the history: UNAVAILABLE, which the request
  // ends with.
  absl::Status Complete(const Route& route, const v1::NodeFinal* final);
  // A call to `node_id` failed UNAVAILABLE: if its connection is down too,
  // routing avoids the node at once (until its next heartbeat), not only
  // after heartbeat_timeout.
  void ReportUnavailable(const std::string& node_id);
  // A node did not accept a request's stream within node_accept_timeout:
  // routing avoids it until its next heartbeat.
  void ReportUnresponsive(const std::string& node_id);
  // Whether `model` has a live, trusted replica on a node other than
  // `node_id` (where an unaccepted request can be retried).
  bool HasReplicaElsewhere(const std::string& model, const std::string& node_id) const;
  absl::Duration node_accept_timeout() const { return options_.node_accept_timeout; }
  // EndSession: forgets the history and drops the KV on its node. With
  // `tenant` (API keys on), only a session of that tenant is ended
  // (PERMISSION_DENIED for another's), and an unknown id touches no node.
  absl::StatusOr<bool> EndSession(const std::string& session_id,
                                  const std::optional<std::string>& tenant = std::nullopt);
  // Advise (scheduler_advise.cc states the rule): picks the node that will
  // serve the session's next turn, has it move the KV onto its device
  // (from its tiers, or from the session's last node as a peer) and makes
  // it the session's affinity; activates next_hops' models.
  // It is AdmitAdvisory then AdviseAdmitted: a server refuses over quota
  // on its own thread (cheap, no node call) and runs the rest elsewhere
  // (a bounded pool of its own: advise_threads, advise_queue).
  absl::StatusOr<v1::AdviseResponse> Advise(const v1::AdviseRequest& req);
  // RESOURCE_EXHAUSTED (with a retry hint) when `tenant` is over its
  // advisory quota; takes one advisory from its bucket otherwise.
  absl::Status AdmitAdvisory(const std::string& tenant);
  // The rest of Advise, for an advisory already admitted (may call a node:
  // blocks up to the advisory RPC timeout).
  absl::StatusOr<v1::AdviseResponse> AdviseAdmitted(const v1::AdviseRequest& req);
  // Invalidate: drops the unused prefetch on the session's node.
  absl::Status Invalidate(const v1::InvalidateRequest& req);

  ClusterState& cluster() { return cluster_; }
  SessionDirectory& sessions() { return sessions_; }
  const SchedulerOptions& options() const { return options_; }

 private:
  // A node call under way, keyed by what it does: typed, so no model name
  // can be mistaken for an operation.
  enum class PendingKind { kLoad, kEvict };
  struct PendingKey {
    PendingKind kind;
    std::string model;
    std::string node_id;
    auto operator<=>(const PendingKey&) const = default;
  };
  struct Migration {
    std::string from, to, to_device;
    // Set once StartLoad has returned: until then no pending load marks the
    // move under way, and AdvanceMigrations must not take its absence for
    // a failed load (a control tick between the two did, and a second
    // replica was loaded and then drained).
    bool load_started = false;
  };
  // The working state of one control tick (scheduler_control.cc).
  struct Tick {
    absl::Time now;
    // A working copy of the cluster: loads started (this tick or earlier
    // and still under way) count against their device as placeholders.
    std::vector<NodeInfo> nodes;
    std::map<std::string, absl::Time> last_request;
    std::set<std::string> leaving;  // models being evicted
    std::set<std::string> busy;     // models with requests in flight: never idle victims
    absl::Duration Idle(const std::string& model) const;
  };

  Scheduler(const SchedulerOptions& options, Clock clock);
  void ControlLoop();
  void ControlTick();
  // Control-tick steps, in order.
  void SweepDeadNodes();
  // Marks sessions idle past session_ttl lost and frees their KV.
  void ExpireSessions();
  void AdvanceMigrations();
  // Moves the models of cordoned nodes away (DrainNode); returns, per
  // cordoned node, the models moving and those with no room elsewhere.
  std::map<std::string, v1::DrainNodeResponse> AdvanceDrains() ABSL_LOCKS_EXCLUDED(mu_);
  void MaybeRebalance();
  Tick BeginTick() ABSL_LOCKS_EXCLUDED(mu_);
  void ReconcileReplicas(Tick* tick);
  void EvictUnlisted(const Tick& tick);
  // Steps of ReconcileReplicas for one model lacking replicas.
  void ReconcileModel(const ModelStatus& m, Tick* tick);
  // More replicas of `m` than its spec wants (a node came back): drains
  // one. True while there are too many (nothing else to do for `m`).
  bool TrimReplicas(const ModelStatus& m, Tick* tick) ABSL_LOCKS_EXCLUDED(mu_);
  // Evicts the idlest model past idle_evict_after so `m` can load next tick.
  void MakeRoomFor(const ModelStatus& m, Tick* tick);
  // Evicts one idle model from a device under KV pressure (see
  // kv_pressure_free_fraction), at most one per device until a heartbeat
  // shows that eviction's effect.
  void RelieveKvPressure(Tick* tick) ABSL_LOCKS_EXCLUDED(mu_);
  // The devices (DeviceKey) whose last KV-pressure eviction is still under
  // way or not yet seen in a heartbeat; forgets the others.
  std::set<std::string> KvPressureHeld(const Tick& tick) ABSL_LOCKS_EXCLUDED(mu_);
  // Marks the hold on `model`'s eviction from `node_id` as ended now, when
  // the eviction RPC returns and before the replica leaves the cluster
  // state: a heartbeat after this shows its effect. (A tick that sees the
  // eviction gone ends it too; this makes the end not depend on a tick
  // running between the RPC's return and that heartbeat.)
  // REQUIRES: mu_ held.
  void EndKvPressureHold(const std::string& model, const std::string& node_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PlaceReplica(const ModelStatus& m, const std::set<std::string>& exclude, Tick* tick);
  // The KVPR rebalancer's whole-catalogue pass (see rebalance_interval).
  void Rebalance();

  void StartLoad(const ModelSpec& spec, const Target& target);
  // Counts a load under way against its device in a working copy of the
  // cluster (a LOADING placeholder holding its weights).
  static void AddPlaceholder(std::vector<NodeInfo>* nodes, const Target& target,
                             const std::string& model, int64_t weight_bytes);
  // `drain`: the node lets in-flight requests finish first (DRAINING), for
  // up to drain_timeout.
  void StartEvict(const std::string& model, const std::string& node_id, bool drain = false);
  bool IsLoading(const std::string& model) const ABSL_LOCKS_EXCLUDED(mu_);
  // RouteRequest's session step: begins the turn (the lost-history check
  // included) and fills the route's history and the affinity node.
  absl::Status BeginSessionTurn(const v1::GenerateRequest& req, Route* route,
                                std::string* affinity);
  // Whether a live node served turns of `session_id` (see RouteRequest);
  // frees what they kept.
  bool NodesKnowSession(const std::string& session_id);
  // Drops `session_id` on every live, non-suspect node at once and waits
  // for their answers (at most `timeout`); true if any had served it.
  bool AskNodesToDrop(const std::string& session_id, absl::Duration timeout);
  // Frees the session's KV (and the id) on every live node, in the pool.
  void DropOnNodes(const std::string& session_id);
  // Wakes the control loop now (a request waits for an activation).
  void Kick();
  std::shared_ptr<v1::Node::StubInterface> Stub(const std::string& node_id);
  // The channels behind Stub(node_id), if they were made.
  std::shared_ptr<NodeChannels> ChannelsOf(const std::string& node_id) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // The address of `affinity` when it is a live, trusted node other than
  // `serving` (the peer to fetch the session's KV from); else empty.
  std::string PeerAddress(const std::string& affinity, const std::string& serving) const;
  v1::ModelInfo ToModelInfo(const ModelStatus& m) const;
  // KVPR demand d_m of a model now (kvpr.h), 0 when unknown.
  double Demand(const std::string& model) const;
  // FineServe's marginal memory efficiency mu_m: tokens per KV byte.
  double Mme(const std::string& model) const;
  // The step budget's inputs: the model's measured decode step (0 until
  // one was) and its TPOT SLO (the catalogue's, else default_tpot_ms), in
  // seconds.
  double StepSeconds(const std::string& model) const;
  double TpotSeconds(const std::string& model) const;

  const SchedulerOptions options_;
  // Where state persists (null: nowhere). Outlives every member using it.
  std::shared_ptr<StateStore> state_;
  Clock clock_;
  const absl::Time started_;  // clock_() at construction (startup_grace)
  ModelRegistry registry_;
  ClusterState cluster_;
  SessionDirectory sessions_;
  TenantQuotas quotas_;
  ModelStats stats_;

  mutable absl::Mutex mu_;
  // By node id; replaced when the node's address changes.
  std::map<std::string, std::shared_ptr<NodeChannels>> channels_ ABSL_GUARDED_BY(mu_);
  // Node calls under way -> the device a load targets ("" for evictions).
  std::map<PendingKey, std::string> pending_ ABSL_GUARDED_BY(mu_);
  // model waiting for room -> the idle model being evicted for it
  std::map<std::string, std::string> evicting_for_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Migration> migrations_ ABSL_GUARDED_BY(mu_);  // by model
  // A KV-pressure eviction per device (DeviceKey): its model, node, and
  // the tick that saw it end (InfiniteFuture: under way).
  struct KvPressureHold {
    std::string model, node_id;
    absl::Time ended = absl::InfiniteFuture();
  };
  std::map<std::string, KvPressureHold> kv_pressure_holds_ ABSL_GUARDED_BY(mu_);
  // Requests routed and not completed, per model (Route::model).
  std::map<std::string, int> inflight_by_model_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> cordoned_ ABSL_GUARDED_BY(mu_);   // Admin.DrainNode
  absl::Time last_rebalance_ = absl::InfinitePast();      // control loop only
  absl::Time last_session_sweep_ = absl::InfinitePast();  // control loop only

  absl::Notification stop_;
  absl::Mutex kick_mu_;
  absl::CondVar kick_cv_;
  bool kicked_ ABSL_GUARDED_BY(kick_mu_) = false;
  std::thread control_;
  // Declared last: destroyed (joined) first, while everything its closures
  // touch is alive.
  std::unique_ptr<transfer::WorkerPool> pool_;
  std::unique_ptr<CatalogueStore> catalogue_;  // null: not persisted
  // Serializes Register/UnregisterModel: the registry and the stored
  // catalogue change together.
  absl::Mutex catalogue_mu_;
  RoutingWaiters waiters_{&cluster_};
};

}  // namespace ballast::global_scheduler
