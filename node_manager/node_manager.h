// NodeManager: everything one `ballast node` owns — its devices (each a
// DeviceWorker with an engine pool), model loading and eviction, request
// submission with tokenization, and the registration + heartbeat client
// that keeps the scheduler informed.
//
// In-flight requests are counted per model from Submit to their OnDone (a
// counting sink wraps the caller's), so a draining eviction waits on a
// condition, not a poll, and the heartbeat reports the node's total.
//
// Thread-safety: all public methods are thread-safe. Shutdown order: stop
// the heartbeat thread and wake draining evictions, then the device workers
// (which fail in-flight requests with UNAVAILABLE).
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "ballast/v1/node.grpc.pb.h"
#include "engine/model_engine.h"
#include "grpcpp/security/credentials.h"
#include "node_manager/chat_prompt.h"
#include "node_manager/device_worker.h"
#include "node_manager/host_weight_cache.h"
#include "node_manager/kv_tier_store.h"
#include "node_manager/model_lifecycle.h"
#include "node_manager/peer_kv_client.h"

namespace ballast::node_manager {

struct DeviceOptions {
  // "cpu:N" for the cpu backend, "cuda:N" (N = CUDA ordinal) for cuda.
  std::string name = "cpu:0";
  // Memory budget of the device for weights + KV. Default 4 GiB.
  int64_t memory_bytes = 4ll << 30;
};

struct EngineDefaults {
  std::string backend = "cpu";   // cpu | cuda
  bool cuda_graphs = true;       // cuda: replay decode steps from CUDA graphs
  bool deterministic = false;    // ModelEngineOptions::deterministic
  int gemm_tune_candidates = 0;  // ModelEngineOptions::gemm_tune_candidates
  bool warm_products = true;     // ModelEngineOptions::warm_products
  // ModelEngineOptions::step_done (node.engine.step_done).
  engine::StepDoneSignal step_done = engine::StepDoneSignal::kSpinningThread;
  int block_tokens = 16;
  int64_t kv_cache_bytes = 64ll << 20;
  int max_batch_tokens = 256;
  int max_seqs = 64;
  int max_context = 0;
  double slow_step_warn_ms = 0;  // ModelEngineOptions::slow_step_warn_ms
  // cuda: SMs reserved for latency-critical models (node.engine.sm_reserve,
  // CUDA green contexts): the engines of sm_reserve_models run on the
  // device's first sm_reserve SMs (rounded up to the partition granule),
  // every other engine on the SMs left. Static: the rest lose those SMs even
  // while the reserved models are idle (docs/benchmarks.md measures the
  // trade against priority_streams). Default 0: off.
  int sm_reserve = 0;
  std::vector<std::string> sm_reserve_models;
};

struct NodeOptions {
  // "elastic": models on a device share one KV slab arena whose memory is
  // what their weights leave; "static": a private KV pool of
  // engine.kv_cache_bytes per model (the baseline). Default elastic.
  std::string memory_mode = "elastic";
  size_t slab_bytes = 2u << 20;
  // Parameter remapping in elastic mode (node.memory.remap; RemapOptions).
  RemapOptions remap;
  // Host memory for evicted models' weights (pinned on cuda), so the next
  // activation copies them instead of reading the checkpoint; least
  // recently used copies are dropped first. 0 keeps none. Default 16 GiB.
  // On cuda all of it is pinned when the node starts (14-30 s for 32 GiB
  // on an H100 host), in 64 MiB chunks: pinning at eviction held up every
  // model on the node for seconds.
  int64_t host_weight_cache_bytes = 16ll << 30;
  // Order of each device's shared request queue: moore_hodgson (Prism
  // §6.2), fineserve_batch (FineServe §6.3), edf or fcfs (arbitration.h).
  // Default moore_hodgson.
  std::string arbitration_policy = "moore_hodgson";
  // DeviceArbitrationOptions::max_queue_wait_ms (0, the default: none).
  double max_queue_wait_ms = 0;
  // DeviceArbitrationOptions::promote_after_slo (0, the default: no aging).
  double promote_after_slo = 0;
  // DeviceArbitrationOptions::log_decisions (default off).
  bool log_arbitration = false;
  // DeviceArbitrationOptions::overlap_steps (node.engine.overlap_steps).
  // Default on.
  bool overlap_steps = true;
  // DeviceArbitrationOptions::priority_streams
  // (node.engine.priority_streams: none, first or decode). Default none.
  StreamPriorityPolicy priority_streams = StreamPriorityPolicy::kNone;
  // DeviceArbitrationOptions::rolling_steps (node.engine.rolling_steps).
  // Default on.
  bool rolling_steps = true;
  // DeviceArbitrationOptions::ahead_steps (node.engine.ahead_steps).
  // Default on.
  bool ahead_steps = true;
  // Longest a draining eviction waits for in-flight requests when the
  // EvictModel call names no timeout (the scheduler always sends its
  // scheduler.drain_timeout_ms). Default 10 min.
  absl::Duration drain_timeout = absl::Minutes(10);
  std::string node_id = "node-0";
  // host:port the scheduler and peers use to reach this node.
  std::string advertise_address;
  // host:port of the scheduler; empty runs the node unregistered (tests).
  std::string scheduler_address;
  // Credentials of the node's connections to the scheduler and to peers
  // (mTLS, built by server/tls.h from node.tls). Default null: plaintext.
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  std::vector<DeviceOptions> devices = {DeviceOptions{}};
  EngineDefaults engine;
  // Session KV tiers below the devices (node.kv_tiers; kv_tier_store.h).
  // Off unless dram_bytes > 0 or ssd_dir is set; chunk_tokens must then be
  // a multiple of engine.block_tokens.
  KvTierOptions kv_tiers;
  bool kv_tiers_enabled() const { return kv_tiers.dram_bytes > 0 || !kv_tiers.ssd_dir.empty(); }
};

// What an Advise prefetch did on the node.
struct PrefetchResult {
  int tokens = 0;  // of the session's history now on the device
  engine::KvSource source = engine::KvSource::kNone;
};

// One admitted request: its engine and the prompt tokens of this turn.
struct Admission {
  std::shared_ptr<engine::ModelEngine> engine;
  std::string device;
  std::vector<int> turn_tokens;
  // A chat turn: turn_tokens is the whole rendered conversation, which
  // replaces the session's history (NodeFinal.prompt_replaces_history).
  bool replaces_history = false;
};

// The engine's generation parameters for the wire's sampling parameters
// (validated by the scheduler): top_p and repetition_penalty 0 mean off;
// unset temperature, top_p and top_k take the model's `defaults`
// (generation_config.json).
engine::GenerationParams ToGenerationParams(const v1::SamplingParams& s,
                                            const engine::GenerationDefaults& defaults);

// Longest wait between registration attempts while the scheduler is
// unreachable (attempts back off from 500 ms).
inline constexpr absl::Duration kMaxRegisterBackoff = absl::Seconds(8);

class NodeManager {
 public:
  static absl::StatusOr<std::unique_ptr<NodeManager>> Create(const NodeOptions& options);
  ~NodeManager();

  // Starts registering and heartbeating (no-op without a scheduler address),
  // advertising `address` (the bound host:port) to the scheduler, as this
  // process's incarnation (random per start). If the scheduler refuses the
  // node id (another live node holds it) or says another incarnation
  // replaced this one, heartbeats stop and `on_refused` runs once, on the
  // heartbeat thread, with the reason.
  void StartHeartbeats(const std::string& address,
                       std::function<void(const absl::Status&)> on_refused = nullptr);
  void Shutdown();

  // Loads a model on `device` (or the device with the most free memory),
  // its linear layers' weights as `quantization` says ("none", empty, or
  // "fp8": engine::WeightQuantFromConfig; INVALID_ARGUMENT otherwise).
  // RESOURCE_EXHAUSTED if no device has room; ALREADY_EXISTS if resident.
  absl::StatusOr<v1::ResidentModel> LoadModel(const std::string& name, const std::string& path,
                                              const std::string& kv_dtype,
                                              const std::string& device,
                                              const memory::TenantLimits& kv_limits = {},
                                              const std::string& quantization = "none");
  // Moves a resident model's KV floor/limit (elastic mode). NOT_FOUND if not
  // resident; FAILED_PRECONDITION in static mode.
  absl::Status SetKvLimits(const std::string& name, const memory::TenantLimits& kv_limits);
  // Drops a resident model. `drain`: it first turns DRAINING (not
  // routable) and in-flight requests finish (up to `drain_timeout`, zero
  // meaning options().drain_timeout; then they fail UNAVAILABLE); else they
  // fail now. The weights' host copy is kept (HostWeightCache) unless
  // `keep_host_copy` is false.
  absl::Status EvictModel(const std::string& name, bool drain = false, bool keep_host_copy = true,
                          absl::Duration drain_timeout = absl::ZeroDuration());
  const HostWeightCache& host_weights() const { return host_cache_; }

  // Tokenizes the turn (BOS first when the history is empty), appends it to
  // the history and submits it. `sink` must live until OnDone, which it
  // gets exactly once if this returns OK (never if it returns an error).
  absl::StatusOr<Admission> Submit(const v1::NodeGenerateRequest& req,
                                   engine::GenerationSink* sink);
  // The key of a session's KV on this node (engines, tiers): the tenant
  // and the session id, so that sessions of one id but different tenants
  // (the empty tenant included) never share KV. The scheduler already
  // refuses another tenant's turn on a session; the node does not rely on it.
  static std::string SessionKey(const std::string& tenant, const std::string& session_id);
  // Frees the session's KV (every tenant's of that id) on every engine and
  // tier; returns whether a turn of it succeeded here since it was last
  // dropped (the scheduler's lost-history check, Scheduler::RouteRequest).
  // The node keeps each such id until the scheduler drops it (EndSession,
  // expiry, that check).
  bool DropSession(const std::string& session_id);
  // Advise on this node (node.proto PrefetchKv): moves the session's KV
  // from the tiers (or req.kv_peer) onto the device of req.model as the
  // session's cached prefix. NOT_FOUND if the model is not resident.
  absl::StatusOr<PrefetchResult> PrefetchKv(const v1::PrefetchKvRequest& req);
  // Invalidate: drops an unused prefetch of the session (of any tenant) on
  // `model`; false if there was none. NOT_FOUND if the model is not resident.
  absl::StatusOr<bool> DropPrefetch(const std::string& session_id, const std::string& model);
  // The chunks this node holds for a peer's FetchKv (none without tiers).
  std::vector<std::shared_ptr<const transfer::KvChunk>> ChunksForPeer(
      const v1::FetchKvRequest& req);
  // The node's KV tiers; null when node.kv_tiers is off.
  KvTierStore* kv_tiers() const { return tiers_.get(); }
  // Whether `model` is loaded (or loading) on one of the node's devices.
  bool HasModel(const std::string& model) const {
    std::string device;
    return FindEngine(model, &device) != nullptr;
  }

  std::vector<v1::DeviceState> DeviceStates() const;
  std::vector<v1::ResidentModel> ResidentModels() const;
  const NodeOptions& options() const { return options_; }
  // Registered with the scheduler and heard from within three heartbeat
  // intervals (a node without a scheduler address: always). The node's
  // grpc health reports SERVING only while this holds.
  bool Connected() const { return options_.scheduler_address.empty() || connected_.load(); }
  std::vector<DeviceWorker*> devices() const;
  // Requests submitted and not yet done, on the whole node or one model.
  int inflight() const ABSL_LOCKS_EXCLUDED(mu_);
  int inflight(const std::string& model) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  explicit NodeManager(const NodeOptions& options);
  void HeartbeatLoop();
  // OK once registered; ALREADY_EXISTS if the scheduler refused the id;
  // UNAVAILABLE (any other failure) to retry.
  absl::Status RegisterOnce(v1::NodeRegistry::Stub* stub, absl::Duration* interval);
  std::shared_ptr<engine::ModelEngine> FindEngine(const std::string& model,
                                                  std::string* device) const;
  // The device named `device` (empty: the one with the most free memory),
  // its free bytes in *best_free; null if there is none.
  DeviceWorker* FreestDevice(const std::string& device, int64_t* best_free) const;
  // `quant`: base.quantization, parsed (it picks the host copy).
  absl::StatusOr<v1::ResidentModel> Activate(const engine::ModelEngineOptions& base,
                                             engine::WeightQuant quant, DeviceWorker* target,
                                             int64_t best_free);
  // Keeps a host copy of `e`'s weights in host_cache_ for EvictModel,
  // reusing an earlier copy when there is one.
  void KeepHostCopy(const std::string& name, engine::ModelEngine& e);
  // Pins `bytes` of host memory for the copies (host_arena_), before the
  // node serves; the error names node.memory.host_weight_cache_mib.
  static absl::StatusOr<std::shared_ptr<engine::HostArena>> PinHostCopyArena(int64_t bytes);
  // The prompt of `req` (text, or chat messages rendered with the model's
  // template) into g->prompt / history_tokens and a->turn_tokens.
  absl::Status FillPrompt(const v1::NodeGenerateRequest& req, Admission* a,
                          engine::GenerationRequest* g);
  v1::ResidentModel Describe(const engine::ModelEngine& e, const DeviceWorker& device) const;
  // The request's prompt prefix held in the tiers or at `peer` (null when
  // the device cache holds the session, or nothing is found).
  std::shared_ptr<const engine::KvPrefixLease> AcquireLease(const engine::ModelEngine& e,
                                                            const v1::NodeGenerateRequest& req,
                                                            const std::vector<int>& prompt);
  // ModelFingerprint of `path`, computed once per file signature.
  absl::StatusOr<uint64_t> FingerprintOf(const std::string& path) ABSL_LOCKS_EXCLUDED(mu_);
  void SetState(const std::string& model, v1::ModelState state) ABSL_LOCKS_EXCLUDED(mu_);
  // A request of `model` is done (the counting sink's OnDone).
  void RequestDone(const std::string& model) ABSL_LOCKS_EXCLUDED(mu_);
  // A turn of `tenant`'s `session_id` succeeded here (the counting sink's
  // OnDone). Its KV may be kept under
  // SessionKey(tenant, session_id) from now on. Recorded after the KV is
  // kept, so a DropSession racing the turn cannot leave its KV unnamed; a
  // failed turn keeps no KV and records nothing.
  void SessionServed(const std::string& tenant, const std::string& session_id)
      ABSL_LOCKS_EXCLUDED(mu_);
  // A prefetch kept `tenant`'s KV of `session_id` here (not a turn served).
  void SessionKept(const std::string& tenant, const std::string& session_id)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The keys of every tenant's KV of `session_id` here; `forget`: the
  // session's tenants are forgotten too (it is being dropped).
  std::vector<std::string> SessionKeys(const std::string& session_id, bool forget)
      ABSL_LOCKS_EXCLUDED(mu_);
  class CountingSink;

  // What the node knows of each model it holds or is loading.
  struct Lifecycle {
    v1::ModelState state = v1::MODEL_STATE_LOADING;
    std::string device;
    double activation_ms = 0;
    bool from_host_copy = false;
  };

  const NodeOptions options_;
  std::string advertise_;  // set once by StartHeartbeats
  const std::string incarnation_;
  std::function<void(const absl::Status&)> on_refused_;  // set once by StartHeartbeats
  std::vector<std::unique_ptr<DeviceWorker>> devices_;
  mutable absl::Mutex mu_;
  std::map<std::string, int> inflight_ ABSL_GUARDED_BY(mu_);  // by model
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::string, Lifecycle> lifecycle_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> served_sessions_ ABSL_GUARDED_BY(mu_);  // see DropSession
  // Session id -> the tenants whose KV of it may be kept here
  // (SessionServed, SessionKept); forgotten by DropSession.
  std::map<std::string, std::set<std::string>> session_tenants_ ABSL_GUARDED_BY(mu_);
  // path -> (file signature, fingerprint)
  std::map<std::string, std::pair<std::string, uint64_t>> fingerprints_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<KvTierStore> tiers_;  // null: no tiers
  PeerKvClient peer_client_;
  std::atomic<bool> connected_{false};  // see Connected
  HostWeightCache host_cache_;
  // The pinned memory host copies are made in (cuda, host_weight_cache_bytes
  // > 0): pinned once in Create, so evictions never pin (host_arena.h).
  std::shared_ptr<engine::HostArena> host_arena_;
  ChatPrompts chat_prompts_;
  absl::Mutex load_mu_;  // serialises loads so two cannot overcommit a device
  absl::Notification stop_;
  std::thread heartbeat_;
};

}  // namespace ballast::node_manager
