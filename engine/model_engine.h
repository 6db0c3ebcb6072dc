// ModelEngine: one resident model's runtime. It owns the model's weights,
// executor, KV cache and tokenizer, and runs continuous batching with
// chunked prefill. Three concerns are kept apart, as in vLLM v1:
//   * KvManager (engine/kv_manager.h): blocks, the session prefix cache,
//     shedding, the admission watermark.
//   * BatchPlanner (engine/batch_planner.h): Plan() returns the step (which
//     sequences, how many tokens each, which need logits), deciding
//     admission and preemption; its file comment states the step rule.
//   * ModelEngine (here): the inbox and threads contract; runs the plan on
//     the Executor, samples, streams tokens and finishes sequences. When a
//     request with a session id finishes, its blocks are kept for the
//     session's next turn (KvManager::Keep).
//
// Lifecycle: Close(why) ends the engine for good (eviction, shutdown): it
// fails every queued and running request with `why`, and any later Submit
// returns UNAVAILABLE. AbortAll(why) fails everything now but stays open.
//
// Thread-safety: Submit, Cancel, DropSession, SetKvLimits, HasWork and
// stats are thread-safe. Step and every method marked "REQUIRES: the thread
// that calls Step" run on one thread (the device's worker); Close and
// AbortAll too (or after that thread is gone). That thread may hand a
// begun step's FinishStep to another thread while it waits for it (the
// device's finishers): one thread at a time, ordered by the handoff.
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "engine/batch_planner.h"
#include "engine/executor.h"
#include "engine/generation.h"
#include "engine/host_arena.h"
#include "engine/kv_cache.h"
#include "engine/kv_export.h"
#include "engine/kv_manager.h"
#include "engine/sequence.h"
#include "engine/tokenizer.h"
#include "engine/weight_remapper.h"
#include "engine/weights.h"
#include "memory/balloon.h"
#include "memory/block_allocator.h"
#include "memory/kv_arena.h"

namespace ballast::engine {

struct ModelEngineOptions {
  std::string name;
  std::string path;  // directory with config.json and *.safetensors
  // Backend: "cpu" (reference, float32) or "cuda" (needs a CUDA build).
  std::string backend = "cpu";
  // CUDA device ordinal (cuda backend). Default 0.
  int device = 0;
  // Replay decode steps from CUDA graphs (cuda backend). Default on.
  bool cuda_graphs = true;
  // Batch-invariant kernels: a request's logits (so, with its seed, its
  // tokens) do not depend on what else shares its steps
  // (GpuExecutorOptions::deterministic says what it costs on cuda; the cpu
  // backend is batch-invariant either way). Default off.
  bool deterministic = false;
  // cuda: cuBLASLt algorithms timed per GEMM shape and row bucket
  // (GpuExecutorOptions::gemm_tune_candidates). Default 0: the
  // heuristic's first, untimed.
  int gemm_tune_candidates = 0;
  // cuda: every cuBLASLt product shape of a step launched once at
  // activation (GpuExecutorOptions::warm_products). Default on.
  bool warm_products = true;
  // cuda: how a step's end is signalled to the device worker
  // (GpuExecutorOptions::step_done). Default a spinning thread.
  StepDoneSignal step_done = StepDoneSignal::kSpinningThread;
  // cuda: an SM partition for the steps (GpuExecutorOptions::sm_partition
  // and sm_partition_rest). Default 0: the whole device.
  int sm_partition = 0;
  bool sm_partition_rest = false;
  // KV cache element type; "auto" = f32 on the CPU backend, the model's
  // dtype (bf16/fp16) on cuda; "fp8_e4m3" stores KV in 8 bits (scale 1).
  std::string kv_dtype = "auto";
  // The linear layers: "none" (default) or "fp8" (dynamic FP8: E4M3
  // weights with one scale per output channel, inputs with one per token;
  // engine/model_config.h's WeightQuant). On cuda fp8 halves those
  // weights' bytes; on cpu it computes the same rounding in float32 (a
  // reference, no saving).
  std::string quantization = "none";
  // Positions per KV block. Default 16; smaller wastes less, costs more
  // block-table entries.
  int block_tokens = 16;
  // Static mode: KV pool size in bytes for this model. Default 64 MiB.
  int64_t kv_cache_bytes = 64ll << 20;
  // Elastic mode: the device's shared KV arena (kv_cache_bytes unused).
  // Null: static mode, a private pool of kv_cache_bytes.
  std::shared_ptr<memory::KvArena> kv_arena;
  // Elastic mode: this model's floor and limit in the arena (default: none).
  memory::TenantLimits kv_limits;
  // Elastic mode: asks the device's other models to give back `bytes` of
  // the shared arena — their idle session KV, then their running sequences
  // admitted after `newer_than` (KvRecencyNow units), never this engine's —
  // and returns the bytes freed. Called on the step thread from inside
  // Step: when a running sequence cannot grow, before this engine preempts
  // its own newest sequence, so the device's oldest sequence always makes
  // progress (without it two models preempting their own sequences in turn
  // can livelock); and, with newer_than = max (idle KV only), when an
  // admission does not fit. Null: none.
  std::function<int64_t(int64_t bytes, uint64_t newer_than)> reclaim_kv;
  // Elastic mode: the weight pages mapped for this model from the device's
  // balloon (at least WeightBytesNeeded). The cuda backend puts its
  // tensors there; the cpu backend's float32 tensors live on the heap and
  // the pages only stand for them in the budget. Kept until the engine is
  // destroyed, then returned. Null: the backend allocates (static mode).
  std::shared_ptr<memory::WeightPages> weight_pages;
  // Parameter remapping will be used (node.memory.remap.enabled): measure
  // T_T at activation (on cuda this also makes the pinned host image the
  // layers stream from, when the activation had none), so the first KV
  // shortfall does not wait for it. Default false.
  bool prepare_remap = false;
  // Activate from this host copy (KeepHostWeights of an earlier engine of
  // the same model and backend) instead of reading the checkpoint.
  std::shared_ptr<const HostWeights> host_weights;
  // Where KeepHostWeights puts a new host copy on the cuda backend (the
  // node's pinned arena, engine/host_arena.h); null: a new pinned
  // allocation. The cpu backend's copy is its own weights (no memory).
  std::shared_ptr<HostArena> host_arena;
  // Token budget per step (decode tokens + prefill chunk). Default 256.
  int max_batch_tokens = 256;
  // Most sequences running at once. Default 64.
  int max_seqs = 64;
  // cpu backend: draw tokens inside the step as the GPU does
  // (CpuExecutor's sample_in_step), so ahead steps (BeginStep) run in
  // tests without a GPU. Default false.
  bool cpu_sample_in_step = false;
  // Context window cap; 0 = the model's max_position_embeddings.
  int max_context = 0;
  // The node's lower KV tiers (engine/kv_tiers.h): finished session turns
  // are exported there, and requests' leases loaded from there. Null: none.
  std::shared_ptr<KvTierPort> kv_tiers;
  // Hash of the model's weights and config (node_manager's
  // ModelFingerprint); chunk keys combine it with the KV layout. 0 with
  // kv_tiers set is refused.
  uint64_t model_fingerprint = 0;
  // Default true: a lease's KV loads layer by layer while the step
  // computes (Executor::StartKvLoad), layer l waiting only for its own
  // blocks. False: the whole lease is copied before the step starts (the
  // benchmark's baseline for the share of the transfer hidden).
  bool layerwise_kv_load = true;
  // A step longer than this is logged (warn) with where its time went:
  // inbox and queued tasks, planning, KV loads, the forward pass, tokens
  // and finished requests (KV exports apart). 0 (default): never.
  double slow_step_warn_ms = 0;
};

// A request waiting for admission, as the device's arbitration sees it.
struct QueuedRequest {
  std::string id;
  absl::Time arrival;
  double ttft_slo_ms = 0;
  bool reject_if_slo_unmet = false;
  int tokens_left = 0;  // prompt tokens still to prefill
  // Re-admitted first regardless (BatchPlanner's HoldsItsPlace: it was
  // running, or holds its session's KV blocks while it waits).
  bool preempted = false;
  // Its model found no KV room for it at its last admission attempt.
  bool kv_refused = false;
};

struct EngineStats {
  int waiting = 0;
  int running = 0;
  int64_t kv_blocks_total = 0;
  int64_t kv_blocks_free = 0;
  int cached_sessions = 0;
  int64_t preemptions = 0;       // running sequences preempted, all causes
  int64_t shed_preemptions = 0;  // of those, shed for the device (Shed, ShedKv)
  int64_t tokens_generated = 0;
  int64_t steps = 0;
  PrefetchOutcomes prefetches;
};

// The stream priority of a step (ModelEngine::BeginStep).
enum class StepUrgency {
  kDefault,            // the default priority
  kUrgent,             // the greatest
  kUrgentIfDecodeOnly  // the greatest if the step has no prefill tokens
};

class ModelEngine {
 public:
  // Device bytes the model's weights will take with these options (what
  // weight_pages must hold), from config.json and the checkpoint index.
  static absl::StatusOr<int64_t> WeightBytesNeeded(const ModelEngineOptions& options);
  // Loads the model. `wake` is called (from any thread) when work arrives.
  static absl::StatusOr<std::unique_ptr<ModelEngine>> Create(const ModelEngineOptions& options,
                                                             std::function<void()> wake = {});
  ~ModelEngine();

  const std::string& name() const { return options_.name; }
  const ModelEngineOptions& options() const { return options_; }
  const ModelConfig& config() const { return config_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  int context_window() const { return context_window_; }
  int64_t weight_bytes() const { return executor_->weight_bytes(); }
  // Device memory of the executor besides weights and KV.
  int64_t workspace_bytes() const { return executor_->workspace_bytes(); }
  // The weights in host memory for the next activation (Executor).
  absl::StatusOr<std::shared_ptr<const HostWeights>> KeepHostWeights() {
    return executor_->KeepHostWeights();
  }
  // Bytes this model's KV holds: its private pool (static) or its blocks.
  int64_t kv_bytes() const;
  size_t kv_block_bytes() const { return allocator_->block_bytes(); }
  // KV bytes one token adds across all layers (K and V).
  int64_t kv_bytes_per_token() const {
    return 2 * static_cast<int64_t>(kv_->layout().num_layers) *
           static_cast<int64_t>(kv_->layout().token_bytes());
  }
  std::string kv_dtype_name() const;
  // The fingerprint the model's KV chunks are keyed with (KvFingerprint of
  // the model fingerprint and this engine's KV layout).
  uint64_t kv_fingerprint() const { return kv_fingerprint_; }

  // Validates and queues a request; `sink` must live until its OnDone.
  // INVALID_ARGUMENT for an empty prompt, max_tokens <= 0, tokens outside
  // the vocabulary, or prompt + max_tokens beyond the context window;
  // RESOURCE_EXHAUSTED if the request alone needs more KV than the pool;
  // UNAVAILABLE once the engine is closed (checked under the same lock as
  // the queueing, so a request is either refused here or gets its OnDone).
  absl::Status Submit(GenerationRequest request, GenerationSink* sink);
  // Cancels a queued or running request; its sink gets CANCELLED.
  void Cancel(const std::string& request_id);
  // Forgets a session's kept KV.
  void DropSession(const std::string& session_id);
  // Advise: makes `lease` (the KV of tokens[0, lease->tokens)) the
  // session's device cache, released at `deadline` if no turn used it
  // (KvManager's prefetch rule). `done` gets, on the step thread, the
  // tokens now cached for the session and where they came from (DEVICE:
  // already there), or RESOURCE_EXHAUSTED when no device memory is free
  // for it without preempting anyone. Imports queued before a Submit are
  // done before that request is admitted.
  void ImportSession(std::string session_id, std::vector<int> tokens,
                     std::shared_ptr<const KvPrefixLease> lease, int priority, absl::Time deadline,
                     std::function<void(absl::StatusOr<std::pair<int, KvSource>>)> done);
  // Invalidate: drops each session's device copy that is an unused
  // prefetch (one task on the step thread for all of them); `done` gets
  // whether any was.
  void DropPrefetch(std::vector<std::string> session_ids, std::function<void(bool)> done);
  // Tokens of the session's device cache (0: none). Thread-safe.
  int CachedSessionTokens(const std::string& session_id) const {
    return kv_manager_->CachedTokens(session_id);
  }
  // Elastic mode: moves this model's KV floor and limit in the device's
  // arena (memory::TenantLimits); FAILED_PRECONDITION in static mode.
  // Thread-safe.
  absl::Status SetKvLimits(const memory::TenantLimits& limits);

  bool HasWork() const;
  // Runs one step; returns false if there was nothing to do. The same as
  // BeginStep, then FinishStep.
  bool Step();
  // A step in two halves, so a device's worker can overlap several models'
  // steps: BeginStep drains the inbox, plans, issues KV loads and queues
  // the forward on the executor (returns false, with nothing begun, if
  // there was nothing to do); FinishStep waits for the oldest step begun,
  // streams its tokens and finishes sequences. Between them the engine must
  // not be touched but by HasWork, stats, CanBeginAhead, BeginStep,
  // KeepsSessionKv (read only, on the step thread) and the
  // thread-safe calls: the plans' sequences and blocks are in use on the
  // device (shedding or closing it finishes every step first).
  // `urgency`: whether the forward runs at the device's greatest stream
  // priority (Executor::SetUrgent) or the default one.
  //
  // Ahead steps: while one step is in flight, BeginStep may begin the next
  // one if CanBeginAhead(), so the device runs it straight after (the
  // host's finishing and planning no longer sit between the two on the
  // device). Its plan counts the step in flight as done: each sequence
  // sampling there decodes the token it will sample, which the executor
  // reads on the device (SequenceChunk::from_row); a sequence that the
  // token ends (EOS, a stop string) wasted one token's work, dropped when
  // its step finishes. Tokens are the same as without ahead steps (the
  // draws depend on (seed, counter) only). The ahead step keeps the first
  // one's urgency. REQUIRES: the thread that calls Step.
  bool BeginStep(StepUrgency urgency = StepUrgency::kDefault);
  // Whether BeginStep would begin an ahead step now: one step in flight,
  // launched; an executor that takes a second (Executor::max_started_steps);
  // no running sequence with penalties (they need the token in flight on
  // the host); no layers streamed (remapping); and the last ahead plan did
  // not leave work out that needs a plan with nothing in flight
  // (StepPlan::drain); no queued task (imports wait for no step in
  // flight). Step thread.
  bool CanBeginAhead() const;
  // Steps begun urgent so far. Step thread.
  int64_t urgent_steps() const { return urgent_steps_; }
  // After a BeginStep that returned true: calls `done` (on any thread; it
  // must not block or touch the engine) once that step's device work has
  // ended, so FinishStep will not wait for it; at once if there is none
  // (host sampling computes in FinishStep, a failed launch). Step thread.
  void NotifyWhenDeviceDone(std::function<void()> done);
  // Whether the device work of every step in flight has ended (true with
  // none in flight, and on backends that compute in FinishStep). Does not
  // wait. Step thread.
  bool StepDeviceEnded() const;
  // The same for the oldest step in flight alone.
  bool OldestStepDeviceEnded() const;
  // Finishes the oldest step in flight (none: nothing).
  void FinishStep();
  // Whether a step was begun and not yet finished. Step thread.
  bool step_in_flight() const { return !flight_.empty(); }
  int steps_in_flight() const { return static_cast<int>(flight_.size()); }
  // Ahead steps begun so far. Step thread.
  int64_t ahead_steps() const { return ahead_steps_; }
  // Fails every queued, inbox and running request with `why` (a failed
  // forward). The engine stays open: later requests are served.
  // REQUIRES: the thread that calls Step.
  void AbortAll(const absl::Status& why);
  // Closes the engine for good (eviction, shutdown): records `why` and fails
  // every queued, inbox and running request with it, atomically with
  // respect to Submit, which from then on returns UNAVAILABLE naming the
  // model and `why`. An OK `why` counts as UNAVAILABLE. Cached session KV
  // stays until destruction. REQUIRES: the thread that calls Step.
  void Close(const absl::Status& why);
  // Gives back at least `want_bytes` of KV if it can, for another model's
  // activation: kept session KV first (least recently used; with lower
  // tiers, later layers first and only what is wanted), then running
  // sequences, lowest priority and then newest first; those are preempted
  // (they wait and recompute their KV later, with the same output). Returns
  // the bytes of blocks freed. REQUIRES: the thread that calls Step.
  int64_t ShedKv(int64_t want_bytes);
  // What this engine could give back for device-wide shedding: one holding
  // per cached session and per running sequence (KvHolding, kv_manager.h),
  // after its steps in flight end (a wait for the device); with_slabs
  // fills where each holding's blocks lie (PlanSlabShedding).
  // REQUIRES: the thread that calls Step.
  std::vector<KvHolding> KvHoldings(bool with_slabs = false);
  // KvHoldings as of the last plan, without finishing the steps in flight
  // (no wait): a sequence they finish is still listed, a session they
  // keep is not yet. For planning who sheds; shedding itself (Shed) ends
  // the steps first. REQUIRES: the thread that calls Step.
  std::vector<KvHolding> PeekKvHoldings(bool with_slabs = false) const;
  // Whether it keeps any session's KV idle on the device (KvHoldings'
  // cached sessions: what another model's admission may take), without
  // finishing the steps in flight (no wait): a session those steps keep is
  // not seen yet. REQUIRES: the thread that calls Step.
  bool KeepsSessionKv() const { return kv_manager_->num_sessions() > 0; }
  // Frees that cached session, or preempts that running request (it waits
  // and recomputes later, same output). Returns the bytes freed (0 if it no
  // longer exists). With lower KV tiers, a cached session gives back only
  // `want_bytes` (default: all of it), later layers first
  // (KvManager::ShedLayers). REQUIRES: the thread that calls Step.
  int64_t Shed(const KvHolding& h, int64_t want_bytes = -1);
  // KV compaction (memory/kv_arena.h, BeginDrain): after its steps in
  // flight end, moves every block it holds in `slabs` (ascending, the
  // arena's draining slabs) elsewhere on the device, rewriting the block
  // tables (engine/kv_relocation.h); nobody is preempted. Returns the bytes
  // moved; on an error nothing moved. REQUIRES: the thread that calls Step.
  absl::StatusOr<int64_t> MoveKvOutOf(absl::Span<const int64_t> slabs);

  EngineStats stats() const;

  // Device-wide arbitration hooks. REQUIRES: the thread that calls Step.
  // They touch only the waiting requests (in no step's plan), so steps in
  // flight keep running.
  // The waiting requests (the inbox drained first).
  std::vector<QueuedRequest> Queued();
  // Admission order for the waiting requests: ascending rank; preempted
  // sequences stay first, requests without a rank go last (arrival order).
  void SetAdmissionOrder(const absl::flat_hash_map<std::string, int>& rank);
  // Fails a waiting request with `why` (arbitration's SLO rejection).
  void RejectWaiting(const std::string& id, const absl::Status& why);
  // Prompt tokens the last step finished computed (prefill chunks, not
  // decodes).
  int last_step_prefill_tokens() const { return last_prefill_tokens_; }
  // Seconds the last step finished spent outside the executor's forward
  // (inbox, plan, KV load issue, tokens, finishes, exports). Step thread.
  double last_step_host_seconds() const { return last_step_host_s_; }
  // Parameter remapping (engine/weight_remapper.h): null when the backend
  // cannot stream layers or the weights are not balloon pages (static
  // mode). REQUIRES: the thread that calls Step; its SetAlpha with no step
  // in flight.
  WeightRemapper* remapper() { return remapper_.get(); }
  const WeightRemapper* remapper() const { return remapper_.get(); }

 private:
  ModelEngine(const ModelEngineOptions& options, std::function<void()> wake);
  // Create's stages: config and tokenizer; KV pool, manager and planner;
  // executor.
  absl::Status LoadModel();
  absl::Status InitKv();
  absl::Status InitExecutor();
  // Seconds of one batch-1 decode forward (best of two after a warm-up),
  // for remapping's T_c at activation; 0 when no KV block is free.
  double TimeOneDecode();
  absl::Status Validate(const GenerationRequest& req) const;
  std::unique_ptr<Sequence> NewSequence(GenerationRequest req, GenerationSink* sink) const;
  void DrainInbox();
  // Queues `task` for the step thread (and wakes it); false, with nothing
  // queued, once the engine is closed.
  bool QueueTask(std::function<void()> task);
  // ImportSession's work on the step thread.
  absl::StatusOr<std::pair<int, KvSource>> Import(const std::string& session_id,
                                                  std::vector<int> tokens,
                                                  const KvPrefixLease& lease, int priority,
                                                  absl::Time deadline);
  struct StepInFlight;
  // Starts the step's plan on the executor (host-sampling backends run it
  // in Collect); Collect waits for it. Then step->sampled has one token
  // per chunk that asked for logits, in plan order, and step->logprobs one
  // entry per such row (filled for requests with sampling.top_logprobs >=
  // 0).
  absl::Status Launch(StepInFlight* step);
  absl::Status Collect(StepInFlight* step);
  // The step's chunks count as computed and each sampling row's token is
  // pending (Sequence::pending_step): at launch when the executor samples
  // (later plans build on it), else when the step finishes.
  void Advance(const StepInFlight& step);
  // Streams a finished step's tokens; retires the sequences done.
  void TakeTokens(StepInFlight& step);
  // Finishes every step in flight.
  void FinishAllSteps();
  // Whether a step in flight computes for `seq`.
  bool InFlight(const Sequence* seq) const;
  // Finishes (ok) or fails `seq`, once no step in flight uses its blocks;
  // until then it is kept in retired_, marked done (its rows dropped).
  void Retire(std::unique_ptr<Sequence> seq, absl::Status status);
  void RetireReady();
  void FailAll(const absl::Status& why, bool close);
  int64_t ShedOne(const KvHolding& h, int64_t want_bytes);
  // Copies the plan's leases into their sequences' blocks.
  absl::Status RunLoads(const StepPlan& plan);
  // Hands a finished session turn's KV down to the tiers (if any).
  // True if the tiers now hold the session's KV.
  bool ExportSession(const Sequence& seq);
  // Logs a step over options_.slow_step_warn_ms: its phases' times
  // (step.phase_ms), its work as the simulator counts it, and when its
  // launch began and its end was collected (`collected`), in Unix
  // microseconds: consecutive steps' collections are the device's step
  // times while it is never idle (scripts/step-log.py).
  void LogSlowStep(const StepInFlight& step, double total_ms, absl::Time collected) const;
  void Finish(std::unique_ptr<Sequence> seq);
  void Fail(std::unique_ptr<Sequence> seq, const absl::Status& status);
  // The token sampled for tokens[index] (a pending one) of `step_id`.
  // `logprobs`: the token's log-probabilities, or null when not asked for.
  void AfterToken(Sequence* seq, int64_t step_id, size_t index, int id,
                  const TokenLogprobs* logprobs);
  void PublishStats();

  ModelEngineOptions options_;
  std::function<void()> wake_;
  ModelConfig config_;
  int context_window_ = 0;
  uint64_t kv_fingerprint_ = 0;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::shared_ptr<memory::KvArena> arena_;  // keeps the arena alive (elastic)
  std::unique_ptr<memory::BlockAllocator> allocator_;
  std::unique_ptr<KvCache> kv_;
  // Owned by the step thread (declared after kv_: destroyed before it).
  std::unique_ptr<KvManager> kv_manager_;
  std::unique_ptr<BatchPlanner> planner_;
  std::unique_ptr<Executor> executor_;
  bool urgent_ = false;  // the executor's stream priority (step thread)
  int64_t urgent_steps_ = 0;
  std::unique_ptr<WeightRemapper> remapper_;  // after executor_: destroyed first

  mutable absl::Mutex mu_;
  std::vector<std::unique_ptr<Sequence>> inbox_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<std::string> cancels_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> drop_sessions_ ABSL_GUARDED_BY(mu_);
  // Work for the step thread (imports, prefetch drops), run in order
  // before the inbox's requests are queued.
  std::vector<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  EngineStats stats_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status closed_why_ ABSL_GUARDED_BY(mu_);
  std::atomic<int> active_{0};  // sequences queued or running

  // Owned by the step thread.
  int64_t tokens_generated_ = 0;
  int64_t steps_ = 0;
  int last_prefill_tokens_ = 0;
  double last_step_host_s_ = 0;  // step thread
  ExportTimes export_times_;     // this step's exports (step thread only)
  // A step between BeginStep and FinishStep (step thread only).
  struct StepInFlight {
    int64_t id = 0;
    StepPlan plan;
    std::vector<SequenceChunk> chunks;  // host-sampling backends: run in Collect
    absl::Status status;                // of its KV loads and launch, then its forward
    bool launched = false;              // started on the executor: Collect ends it
    bool ahead = false;                 // begun with another step in flight
    std::vector<int> sampled;
    std::vector<TokenLogprobs> logprobs;
    // Milliseconds in: inbox and tasks, plan, KV loads, launch, tokens and
    // finishes, the forward's wait (Collect); and, within the plan, asking
    // the device's other models for KV (reclaim_kv: their shedding, lent
    // layers and the waits for steps in flight that these need).
    double phase_ms[7] = {};
    absl::Time began;         // BeginStep's start
    absl::Time launch_began;  // its launch's start (after inbox, plan and KV loads)
  };
  std::deque<StepInFlight> flight_;  // oldest first; at most 2
  int64_t next_step_id_ = 0;
  int64_t ahead_steps_ = 0;
  bool drain_ = false;     // an ahead plan left work out (StepPlan::drain)
  double reclaim_ms_ = 0;  // in options_.reclaim_kv, ever (StepInFlight::phase_ms[6])
  // Done or cancelled sequences a step in flight still computes for.
  std::vector<std::pair<std::unique_ptr<Sequence>, absl::Status>> retired_;
};

}  // namespace ballast::engine
