// DeviceWorker: one device's engine pool and its step thread. It holds the
// ModelEngines resident on the device and steps every engine that has work,
// one step each per pass; it sleeps when none has work and is woken by
// Submit/Cancel through the engines' wake callback. A pass begins every
// engine's step (ModelEngine::BeginStep: plan, queue the forward on the
// engine's own stream) before finishing any (FinishStep: wait for its
// tokens, stream them), so the models' forwards overlap on the device and
// one engine's host work runs while the others' forwards execute. Anything
// that touches an engine's sequences or blocks (shedding, closing, tasks)
// runs with no step in flight.
//
// Elastic mode: the device's memory is one memory::Balloon (weights, KV
// slab arena and charged workspace share its page budget). Activation
// reserves weight pages through ReserveWeights, which reclaims KV on the
// step thread, then adds the engine built over those pages.
//
// Arbitration (Prism §6.2, FineServe §6.3): the device has one queue
// shared by all its models. Before every pass the worker collects every
// engine's waiting requests, estimates each one's prefill time with its
// model's PrefillCostModel (fitted from this device's measured steps),
// and orders them with the configured policy (arbitration.h). Engines
// admit in that order, and the engine holding the first request steps
// first. Running sequences keep decoding every pass, so admission never
// starves decodes; preempted sequences (and those holding a session prefix
// they took at an attempt that did not fit) are re-admitted first; a
// request merely refused for KV room stays in the order, so on-time
// requests may pass it. A request
// expected to miss its TTFT deadline is still served (late) unless it
// asked for rejection, when it fails with RESOURCE_EXHAUSTED. With
// log_decisions, each queued request's changes are logged
// (device_worker_arbitration.cc, ArbitrationTracker).
//
// Removing a model hands its engine to the step thread, which closes it
// (ModelEngine::Close: outstanding requests fail UNAVAILABLE, and a Submit
// that raced with the removal is refused) before dropping it, so no
// request waits forever and no engine is touched by two threads.
//
// Memory for an activation comes down the memory ladder (memory_ladder.h)
// across all the device's models: empty slabs, then idle session KV (least
// recently used first), then running sequences (lowest priority, newest
// first), only as far as the shortfall.
//
// KV for a running model comes down the full ladder (ReclaimFor, called
// when its planner finds no block), each rung only as far as needed:
//   1. free slabs (the arena maps them itself before asking);
//   2. idle session KV of the other models (their lower tiers keep it);
//   3. weight layers lent by inactive models, then 4. by the busy ones
//      (remapping, RemapController; only when node.memory.remap is on,
//      and only up to each model's cap, past which streaming would cost
//      more than the preemption below);
//   5. an idle model's eviction: the scheduler's (KV-pressure idle
//      eviction, global_scheduler/idle_eviction.h), seen through the
//      heartbeat; the node never evicts on its own;
//   6. preemption: the other models' newer running sequences, then the
//      engine's own newest (recomputed later, same output).
//
// Thread-safety: all public methods are thread-safe. Shutdown: Stop()
// (also run by the destructor) aborts all requests and joins the thread.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "engine/model_engine.h"
#include "memory/balloon.h"
#include "memory/kv_arena.h"
#include "memory/memory_ladder.h"
#include "node_manager/arbitration.h"
#include "node_manager/arbitration_log.h"
#include "node_manager/model_memory.h"
#include "node_manager/prefill_cost_model.h"
#include "node_manager/remap_controller.h"
#include "node_manager/step_host_histogram.h"
#include "transfer/worker_pool.h"

namespace ballast::node_manager {

struct DeviceUsage {
  int64_t memory_total_bytes = 0;
  int64_t memory_used_bytes = 0;  // weights + KV (+ charged workspace, elastic)
  int64_t weight_bytes = 0;       // resident models' weights (elastic: mapped pages)
  int64_t workspace_bytes = 0;    // engines' workspace (charged in both modes)
  // Static mode: the models' private pools. Elastic mode: blocks in use and
  // free blocks inside formatted slabs (unformatted room is in kv_bytes_free;
  // block counts of different sizes are not comparable).
  int64_t kv_blocks_total = 0;
  int64_t kv_blocks_free = 0;
  int64_t kv_bytes_used = 0, kv_bytes_free = 0;
  int waiting = 0;
  int running = 0;
  int64_t preemptions = 0;
  std::vector<std::string> models;
  std::vector<ModelMemory> model_memory;            // one per resident model
  std::vector<ModelPreemptions> model_preemptions;  // one per resident model
  // Elastic mode: KV arena state and page-pool driver calls (cumulative).
  int64_t slabs_formatted = 0, slabs_empty = 0;
  int64_t page_map_calls = 0, page_unmap_calls = 0;
  // Host time of every step taken on the device so far (cumulative).
  StepHostHistogram step_host;
  // The step thread's wall time by activity (cumulative).
  StepThreadTime step_thread;
  // How the device's steps were begun (cumulative).
  StepStarts step_starts;
  // Waits for every step in flight, by cause (cumulative).
  StepDrains step_drains;
  // Parameter remapping (elastic mode with remap enabled).
  RemapStats remap;
  // Other models asked for KV room (cumulative).
  KvReclaims kv_reclaims;
  // KV moved out of slabs to make room for weights (cumulative).
  KvCompactions kv_compactions;
  // Request arbitration (cumulative; expected_late: the last decision's).
  ArbitrationStats arbitration;
};

// How a device holds KV: one shared elastic arena, or a static pool per model.
struct DeviceMemoryOptions {
  bool elastic = true;
  // Physical page: 2 MiB (the CUDA VMM granularity on H100) for GPUs; the
  // host backend may use smaller pages (weights round up to a page).
  size_t page_bytes = 2u << 20;
  size_t slab_bytes = 2u << 20;  // KV slab, a multiple of page_bytes
  // CUDA ordinal whose memory backs the arena (CUDA VMM pages); -1: host
  // pages (the cpu backend).
  int gpu = -1;
  // Parameter remapping (elastic mode only; node_manager/remap_controller.h).
  RemapOptions remap;
};

struct DeviceArbitrationOptions {
  ArbitrationPolicy policy = ArbitrationPolicy::kMooreHodgson;
  // Deadline of requests that carry no TTFT SLO. Default 5 s.
  double default_ttft_ms = 5000;
  BatchLimits batch;  // fineserve_batch's batch caps
  // Overload bound: a waiting request whose first token is predicted more
  // than this far after its arrival (served back to back in the chosen
  // order, from the model's prefill cost) is refused RESOURCE_EXHAUSTED at
  // once, whether or not it asked to be, so a queue that cannot be served
  // in time sheds load early instead of failing every stream by its
  // deadline. 0 (the default): no bound.
  double max_queue_wait_ms = 0;
  // Aging (node_manager::Arbitrate's promote_after_slo): a request queued
  // more than this many times its TTFT SLO is admitted first, ahead of the
  // policy's order. It bounds how long a request Moore-Hodgson put behind
  // the others waits, at the cost of attainment under overload (the
  // simulator, rate-4 validation trace with remapping: 3 cuts the worst
  // TTFT from 11.0 s to 8.2 s and attainment from 74% to 63%;
  // docs/benchmarks.md).
  // 0 (the default): no aging; max_queue_wait_ms refuses instead.
  double promote_after_slo = 0;
  // Log, at info, each change in a queued request's arbitration state
  // (ArbitrationTracker: queued, late, on time, refused for KV, rejected,
  // left the queue) with its predicted start, deadline and cost and its
  // model's fitted prefill cost, so scripts/arbitration-timeline.py can
  // line a run up with the simulator's (`ballast simulate --step-log`).
  // Costs a few lines per request. Default off.
  bool log_decisions = false;
  // Begin every engine's step before finishing any, so the models' forwards
  // overlap on the device (their own streams) and with each other's host
  // work. Off: each engine's step runs whole before the next begins (the
  // serial baseline benchmarks compare against). Default on.
  bool overlap_steps = true;
  // With overlap_steps: threads that run the begun steps' host halves
  // (ModelEngine::FinishStep: streaming tokens, finishing sequences) in
  // parallel, besides the step thread, so several models' host work does
  // not queue on one core. 0: the step thread finishes every step.
  // Default 3 (4 engines' host work at once); each is an idle thread
  // until a device has two models stepping.
  int finish_threads = 3;
  // With overlap_steps, when several engines step in one pass: which steps
  // run on a stream of the device's greatest priority
  // (engine::Executor::SetUrgent). Default none. Costs an event record and
  // wait when an engine changes priority. Measured on an H200 (8B, two
  // copies): a batch-1 decode beside back-to-back 2K prefills takes 17.2
  // ms a step at default priority and 5.9 ms urgent (5.1 ms alone), while
  // the prefills nearly stop; an urgent 2K prefill beside a decoding batch
  // gains 0-7%.
  StreamPriorityPolicy priority_streams = StreamPriorityPolicy::kNone;
  // With overlap_steps: each model steps at its own pace. A model's step
  // is finished as soon as its own device work ends, and its next step
  // begins at once, while the other models' steps are still on the device.
  // While several steps are in flight, each one's end is signalled by the
  // engine (engine::ModelEngine::NotifyWhenDeviceDone: on CUDA a thread
  // waiting on an event after it, node.engine.step_done); one step alone
  // is waited for on its event. Off
  // (lockstep): a pass begins every model's step and finishes all of
  // them, so each model waits for the pass's slowest step (a short decode
  // behind another model's prefill chunk). Between-step tasks, retiring
  // engines and remapping's reversion (at most every 100 ms) still wait
  // for every step in flight. Arbitration orders every model's queue,
  // steps in flight or not (its hooks leave them running). Default on: on an
  // H200 it cut a chat model's TBT beside a bulk model's prefills from 15.0
  // to 5.0 ms and gave six small models 5-10% more tokens/s than lockstep;
  // one model under load was mixed (docs/benchmarks.md).
  bool rolling_steps = true;
  // With rolling_steps: each model keeps two steps queued on the device
  // when it can (engine::ModelEngine::CanBeginAhead): its next step is
  // planned and queued while its current one runs, its decodes fed from
  // the current one's samples on the device, so the device does not idle
  // while the host finishes one step and plans the next. Costs a wasted
  // token's work for each sequence that ends on EOS or a stop string, and
  // a new request waits up to one more step to be admitted. Backends that
  // sample on the host (cpu by default) never step ahead. Default on: on
  // an H200 (130M model, 64 streams of 2,048 tokens per model) it gave 1,
  // 2 and 6 models 3-8% more tokens/s and 3-8% lower TPOT, and lower TPOT
  // at low load, in every pair (docs/benchmarks.md).
  bool ahead_steps = true;
  // With rolling_steps and several models' steps in flight: the loop
  // polls the steps' ends itself (engine::StepDoneSignal::kWorkerPoll,
  // node.engine.step_done: poll) instead of asking each engine for a
  // signal and sleeping until one comes. Default off.
  bool poll_steps = false;
  // With rolling_steps: how the loop learns that a step's device work
  // ended, with several steps in flight; it calls `done` once it has (on
  // any thread, possibly after the worker is gone). Empty (the default):
  // the engine's own ModelEngine::NotifyWhenDeviceDone. Tests inject one
  // that holds steps in flight (a CPU step has no device work to wait for).
  std::function<void(engine::ModelEngine& engine, std::function<void()> done)> notify_device_done;
};

class DeviceWorker {
 public:
  // Fails if the elastic arena cannot be reserved, or if a GPU has less
  // than one slab free. A GPU's budget (memory_bytes) is cut to what the
  // device has free, with a warning.
  static absl::StatusOr<std::unique_ptr<DeviceWorker>> Create(
      std::string name, int64_t memory_bytes, const DeviceMemoryOptions& memory,
      const DeviceArbitrationOptions& arbitration = {});
  ~DeviceWorker();

  const std::string& name() const { return name_; }
  int64_t memory_bytes() const { return memory_bytes_; }
  // CUDA ordinal, or -1 for a host (cpu backend) device.
  int gpu() const { return gpu_; }
  // The device's balloon and its shared KV arena (elastic mode), else null.
  const std::shared_ptr<memory::Balloon>& balloon() const { return balloon_; }
  std::shared_ptr<memory::KvArena> arena() const { return balloon_ ? balloon_->arena() : nullptr; }
  // Called by engines when work arrives; wakes the step thread.
  void Wake();

  // Adds a loaded engine (elastic: charges its workspace to the balloon).
  // ALREADY_EXISTS if the name is taken.
  absl::Status Add(std::shared_ptr<engine::ModelEngine> engine);
  // Activation in elastic mode: maps `bytes` of weight pages from the
  // balloon, on the step thread (atomically with respect to steps). Empty
  // KV slabs go first; then the resident models shed KV
  // (ModelEngine::ShedKv: preempted sequences recompute later).
  // RESOURCE_EXHAUSTED, with nothing mapped, if even that is not enough;
  // FAILED_PRECONDITION in static mode.
  absl::StatusOr<std::unique_ptr<memory::WeightPages>> ReserveWeights(int64_t bytes);
  // Gives back at least `bytes` of KV on this device if it can, by the
  // memory ladder's KV rungs (idle sessions first; where lower tiers hold
  // a copy, a session's later layers first and only what is wanted; then
  // running requests, preempted), on the step thread. Returns the bytes
  // freed. For operators freeing device memory, benchmarks and tests.
  absl::StatusOr<int64_t> ShedKv(int64_t bytes);
  // Runs `fn` on the step thread between steps (engines quiescent) and
  // waits for it; UNAVAILABLE once the device is stopping.
  absl::Status RunOnStepThread(std::function<absl::Status()> fn);
  // ModelEngineOptions::reclaim_kv for `model`'s engine: the other models
  // on this device give back `bytes` of the shared arena, idle session KV
  // first, then running sequences admitted after `newer_than`. Called from
  // inside that engine's Step, on the step thread; never touches it.
  // For an admission (newer_than max), returns 0 at once, without waiting
  // for the steps in flight, when no other model holds idle session KV as
  // seen before those steps end and none could lend a layer. With no idle
  // session KV, lent layers come first and wait for the lenders' own
  // steps alone; only shedding (sessions, newer sequences) waits for
  // every step in flight.
  int64_t ReclaimFor(const std::string& model, int64_t bytes, uint64_t newer_than)
      ABSL_LOCKS_EXCLUDED(mu_);
  // ReclaimFor(model, ...) as an engine option (null in static mode: each
  // model has its own pool).
  std::function<int64_t(int64_t, uint64_t)> ReclaimKvFor(const std::string& model);
  // Removes an engine; false if absent.
  bool Remove(const std::string& model);
  // Returns once the step thread has let go of every engine removed before
  // the call (the loop retires them after its between-step tasks: two
  // barriers cover both orders). The caller's own reference is then the
  // last, so dropping it frees the weights and KV at once. Not from the
  // step thread.
  void AwaitRetired();
  std::shared_ptr<engine::ModelEngine> Find(const std::string& model) const;
  // The device's engines, in the order they were added.
  std::vector<std::shared_ptr<engine::ModelEngine>> Engines() const;
  DeviceUsage Usage() const;
  ArbitrationStats arbitration_stats() const;
  // `model`'s decode step, wall time in ms, when it stepped alone on this
  // device (no other engine's step in flight, no prefill): a moving average
  // (weight 0.2 on the newest step), 0 until one was measured.
  double DecodeStepMs(const std::string& model) const;
  void Stop();

 private:
  // Whether an engine but `spare` keeps idle session KV, seen without
  // finishing the steps in flight (ModelEngine::KeepsSessionKv). Step
  // thread.
  bool AnyIdleSessionKv(const engine::ModelEngine* spare) const ABSL_LOCKS_EXCLUDED(mu_);
  // A step begun and not yet finished. `device_done`: set by its
  // device-done callback, once the rolling loop asked for one (`notified`).
  // `overlapped`: another model's step was on the device at some time
  // beside it. `began`: when it began, or for an ahead step when the step
  // before it ended (its device work starts about then). Set by FinishOne:
  // what the finished step measured.
  struct InFlight {
    std::shared_ptr<engine::ModelEngine> engine;
    absl::Time began;
    std::shared_ptr<std::atomic<bool>> device_done;
    bool notified = false;
    bool overlapped = false;
    bool finished = false;
    absl::Time ended;
    double host_s = 0;
    int prefill_tokens = 0;
  };
  static InFlight Began(std::shared_ptr<engine::ModelEngine> engine, absl::Time at) {
    InFlight f;
    f.engine = std::move(engine);
    f.began = at;
    f.device_done = std::make_shared<std::atomic<bool>>(false);
    return f;
  }
  // What wakes the step thread: every event that may give it work (new
  // work, a task, an engine added or removed, a step's device work ended,
  // Stop) bumps a count; the loop reads the count before it looks at
  // anything and sleeps only while it is unchanged, so no wake is lost.
  struct StepSignal {
    absl::Mutex mu;
    int64_t events ABSL_GUARDED_BY(mu) = 0;
    void Bump() {
      absl::MutexLock lock(&mu);
      ++events;
    }
    int64_t Events() {
      absl::MutexLock lock(&mu);
      return events;
    }
    // Until the count differs from `seen` or `limit` passes; whether it did.
    bool AwaitChange(int64_t seen, absl::Duration limit) {
      absl::MutexLock lock(&mu);
      auto changed = [this, seen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return events != seen; };
      return mu.AwaitWithTimeout(absl::Condition(&changed), limit);
    }
  };
  DeviceWorker(std::string name, int64_t memory_bytes);
  // memory_bytes, or the GPU's free bytes when fewer (in whole slabs; the
  // cut is logged; none is an error). memory.gpu >= 0.
  static absl::StatusOr<int64_t> BudgetOnGpu(const std::string& name, int64_t memory_bytes,
                                             const DeviceMemoryOptions& memory);
  void Loop();
  // The loop with rolling_steps (device_worker_rolling.cc).
  void RollingLoop();
  // What one rolling pass takes from under mu_: the engines, and the
  // between-step work queued since the last pass.
  struct RollingIntake {
    std::vector<std::shared_ptr<engine::ModelEngine>> engines, retiring;
    std::vector<std::function<void(bool)>> tasks;
    bool stop = false;
  };
  // The rolling loop's phases (device_worker_rolling.cc), step thread only.
  // Takes the pass's intake and charges the step thread's clock and starts.
  RollingIntake TakeRollingIntake() ABSL_LOCKS_EXCLUDED(mu_);
  // Runs the intake's tasks, closes its retiring engines and ticks
  // remapping (`tick`), with every step finished first if there is any of
  // that (or stop); false on stop, with the tasks and engines handed back.
  bool RunBetweenSteps(RollingIntake* in, bool tick, absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);
  // Removes from in_flight_ the steps whose device work has ended.
  std::vector<InFlight> TakeEndedSteps();
  // Finishes the oldest step in flight, waiting on its own event.
  void FinishOldestStep();
  // Asks for the device-done callback of each engine's last step in flight.
  void NotifyLastSteps();
  // Waits (as idle time) for a step's end, new work or Stop; whether woken
  // before the limit.
  bool AwaitRollingWake(int64_t seen);
  // Arbitrates over `engines`' queues, then begins a step of each one with
  // work and no step in flight (in_flight_), in arbitration order, at the
  // stream priority the policy gives; then ahead steps (ahead_steps).
  // Returns whether any began. Step thread only.
  bool BeginSteps(std::vector<std::shared_ptr<engine::ModelEngine>> engines);
  absl::StatusOr<std::unique_ptr<memory::WeightPages>> ReclaimAndMap(int64_t bytes);
  // Makes `bytes` free for weights (ShedAndCompact, as ReclaimAndMap):
  // every model's KV but `spare`'s first, then `spare`'s own. Returns the
  // bytes shed. Step thread, no step in flight.
  int64_t MakeRoomForWeights(int64_t bytes, const engine::ModelEngine* spare);
  // The remapping tick (RemapController::Tick), a model over its cap
  // taking its layers back by MakeRoomForWeights. Step thread; it finishes
  // the steps in flight only when it reverts.
  void TickRemap(const std::vector<std::shared_ptr<engine::ModelEngine>>& engines, absl::Time now);
  // Who the memory freed by ShedForShortfall is for.
  enum class ShedFor {
    kModel,    // `spare`'s KV (its blocks' size)
    kWeights,  // an activating model's weight pages
    kAnyone,   // bytes, whoever uses them (ShedKv)
  };
  // One pass of the memory ladder's KV rungs over every engine on the
  // device but `spare` (memory::PlanKvShedding), considering only running
  // sequences admitted after `running_after` (KvRecencyNow units); returns
  // the bytes of blocks freed. An idle session gives back only its later
  // layers (ModelEngine::Shed) where those blocks serve as they are:
  // kAnyone, or kModel with `spare`'s block size. Otherwise it is dropped
  // whole: only a slab emptied of every block moves to another block size
  // or to weights, and shedding a few layers of many sessions empties none
  // (on the H100 chat trace it left admissions waiting 200-650 ms, one
  // 50 ms pass after another). Step thread only.
  // `peek`: the plan from the holdings as planned (PeekKvHoldings), so
  // only the engines shed from end their steps (ModelEngine::Shed); else
  // every engine's steps end first.
  int64_t ShedForShortfall(int64_t shortfall_bytes, ShedFor what,
                           const engine::ModelEngine* spare = nullptr, uint64_t running_after = 0,
                           bool peek = false);
  // Sheds `holding` of `e` (ModelEngine::Shed, `bytes` as there), counting
  // a running sequence's preemption for `what` in sheds_. Step thread.
  int64_t ShedHolding(engine::ModelEngine& e, const engine::KvHolding& holding, int64_t bytes,
                      ShedFor what) ABSL_LOCKS_EXCLUDED(mu_);
  // For weights: sheds, from every engine but `spare`, the holdings whose
  // blocks empty whole slabs (memory::PlanSlabShedding) until the pool's
  // free budget covers `bytes`, then unmaps the emptied slabs; returns the
  // bytes of blocks freed. Shedding by the ladder's order instead empties
  // a slab only once every sequence with a block in it is gone: on the
  // H200, a take-back of 16 layers shed 10.8 GB of running sequences for
  // about 5.9 GB of pages. Step thread only.
  int64_t ShedWholeSlabs(int64_t bytes, const engine::ModelEngine* spare);
  // For weights: drains the slabs whose blocks the free blocks of other
  // slabs can hold (KvArena::BeginDrain), has every engine move its
  // blocks out (ModelEngine::MoveKvOutOf) and unmaps the emptied slabs,
  // until the pool's free budget covers `bytes` or no slab can drain.
  // Moving costs a device copy (on the H200, milliseconds for a few GB)
  // where shedding costs the sequences' recompute. Step thread only.
  struct Compaction {
    int64_t freed = 0;    // bytes of pages given back
    bool failed = false;  // some model's blocks could not move
  };
  // `stuck` (ascending; may be null): slabs earlier drains left part-used,
  // not drained again; this drain's are merged in.
  Compaction CompactForWeights(int64_t bytes, std::vector<int64_t>* stuck = nullptr);
  // For weights, from every engine but `spare`: packs the blocks in use
  // (CompactForWeights), then sheds by the ladder's order only what is
  // still missing, and packs again, so that the freed blocks become whole
  // slabs, until the pool's free budget covers `bytes` or nothing is left
  // to shed. Shedding by the ladder alone empties a slab only once every
  // block in it is free: on the H200 a take-back of 16 layers shed 10.8 GB
  // of running sequences for about 7 GB of pages. Where blocks cannot
  // move, it sheds whole slabs (ShedWholeSlabs). Returns the bytes shed.
  // Step thread only.
  int64_t ShedAndCompact(int64_t bytes, const engine::ModelEngine* spare);
  // The holdings of every engine but `spare` (running sequences only when
  // admitted after `running_after`) as the ladder's plain data, with the
  // engine-side holdings they stand for (`source`, same order) and the
  // engines (`engines`, indexed by each holder's owner); `peek`: without
  // ending their steps in flight (ModelEngine::PeekKvHoldings), else after
  // (KvHoldings: a wait for each engine's steps). Step thread only.
  void GatherHolders(const engine::ModelEngine* spare, uint64_t running_after, bool with_slabs,
                     std::vector<std::shared_ptr<engine::ModelEngine>>* engines,
                     std::vector<memory::KvHolder>* holders, std::vector<engine::KvHolding>* source,
                     bool peek = false);
  // Finishes the steps begun in this pass (in_flight_), in order: tokens,
  // step host time, prefill cost. Step thread only.
  void FinishInFlight();
  // FinishInFlight, counted under `cause` when a step was in flight.
  void Drain(int64_t StepDrains::*cause);
  // Finishes `e`'s steps in flight only (a lender's: its weights are read
  // by them; a model about to shed sequences: they hold the blocks),
  // counted under `cause` when one was in flight. Step thread only.
  void DrainEngine(const engine::ModelEngine& e, int64_t StepDrains::*cause);
  // The engines PlanKvShedding would take running sequences newer than
  // `running_after` from for `shortfall_bytes` (ShedForShortfall's plan
  // with ShedFor::kModel, sparing `spare`), without shedding. Step thread
  // only.
  std::vector<const engine::ModelEngine*> ShedVictims(int64_t shortfall_bytes,
                                                      const engine::ModelEngine* spare,
                                                      uint64_t running_after);
  // PlanKvShedding over GatherHolders' holdings (`peek` as there): the
  // holdings, the engine-side ones and engines they stand for, and the
  // shedding order (indices into `holders`). Step thread only.
  struct ShedPlan {
    std::vector<std::shared_ptr<engine::ModelEngine>> engines;
    std::vector<memory::KvHolder> holders;
    std::vector<engine::KvHolding> source;
    std::vector<size_t> order;
  };
  ShedPlan PlanShed(int64_t shortfall_bytes, const engine::ModelEngine* spare,
                    uint64_t running_after, bool peek);
  // DrainEngine (cause shed) for each of ShedVictims' engines, planning
  // again after each round until none has a step in flight; returns how
  // many engines it asked. Step thread only.
  int DrainVictims(int64_t shortfall_bytes, const engine::ModelEngine* spare,
                   uint64_t running_after);
  // Where one ReclaimFor spent its time, in milliseconds.
  struct AskTimes {
    double lend_ms = 0;      // remapping's lends (with the lenders' steps ending)
    double sessions_ms = 0;  // the drain and the idle session KV shed
    int victims = 0;         // models whose sequences the plan sheds
    double victims_ms = 0;   // their steps in flight ending
    double shed_ms = 0;      // their sequences shed
  };
  // An ask of at least kSlowAskMs logs where its time went, at most one
  // line per kSlowAskLogEvery (the next line counts those not logged);
  // returns freed. Step thread only.
  static constexpr double kSlowAskMs = 5;
  static constexpr absl::Duration kSlowAskLogEvery = absl::Milliseconds(100);
  absl::Time slow_ask_logged_ = absl::InfinitePast();  // step thread only
  int64_t slow_asks_unlogged_ = 0;                     // step thread only
  int64_t LogSlowAsk(const std::string& model, int64_t bytes, bool admission, int64_t freed,
                     absl::Time began, const AskTimes& t);
  // Finishes `steps` (removed from in_flight_, each engine's in order),
  // several engines in parallel on the finishers. Step thread only.
  void FinishSteps(std::vector<InFlight> steps);
  // Finishes one step and records what it measured (any one thread).
  static void FinishOne(InFlight* f);
  // Asks for `f`'s device-done callback (rolling loop). Step thread only.
  void Notify(InFlight* f);
  // poll_steps: until a step in flight has ended (marked device_done),
  // the signal moves past `seen`, or `limit` passes (false then). Step
  // thread only.
  bool PollSteps(int64_t seen, absl::Duration limit);
  // With ahead_steps: every engine with one step in flight that can
  // (CanBeginAhead) begins its next one behind it. Step thread only.
  bool BeginAheadSteps();
  // Whether every step in flight is one engine's (the loop then waits on
  // the oldest step's own event). Step thread only.
  bool OneEngineInFlight() const;
  // One arbitration decision over the engines' queues: the engines in
  // stepping order, and whether the first holds the request the policy
  // put first. Step thread only.
  struct StepOrder {
    std::vector<std::shared_ptr<engine::ModelEngine>> engines;
    bool first_holds_first = false;
  };
  StepOrder Arbitrate(std::vector<std::shared_ptr<engine::ModelEngine>> engines);
  // `engines` by the place (`first`, per engine: INT32_MAX for none) of
  // their first request in the decision's order.
  static StepOrder InStepOrder(std::vector<std::shared_ptr<engine::ModelEngine>> engines,
                               const std::vector<int>& first);
  // Why a request of the decision is refused (overload bound, or late and
  // it asked to be rejected), if it is.
  std::optional<absl::Status> Refusal(bool on_time, bool rejectable, double wait_ms) const;
  // log_decisions: the decision's changes, one line each. Step thread only.
  void LogDecision(absl::Time now, const std::vector<ArbitrationEntry>& queued);

  const std::string name_;
  const int64_t memory_bytes_;
  int gpu_ = -1;
  std::shared_ptr<memory::Balloon> balloon_;
  size_t slab_bytes_ = 0;
  std::unique_ptr<RemapController> remap_;  // null: remapping off
  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::string, std::shared_ptr<engine::ModelEngine>> engines_ ABSL_GUARDED_BY(mu_);
  // When each engine was added (a count of Adds): Engines' order.
  std::map<std::string, int64_t> added_at_ ABSL_GUARDED_BY(mu_);
  int64_t adds_ ABSL_GUARDED_BY(mu_) = 0;
  // engines_ in the order they were added (activation order: ties among
  // equals, as remapping's MRU donor order, go by it). REQUIRES: mu_ held.
  std::vector<std::shared_ptr<engine::ModelEngine>> EnginesInOrder() const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::vector<std::shared_ptr<engine::ModelEngine>> retiring_ ABSL_GUARDED_BY(mu_);
  // Work for the step thread; called with false if the worker stops first.
  std::vector<std::function<void(bool run)>> tasks_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
  DeviceArbitrationOptions arbitration_;
  std::map<std::string, PrefillCostModel> costs_;  // per model; step thread only
  ArbitrationTracker decisions_;                   // log_decisions; step thread only
  // Per model: moving average of decode-only steps taken alone (DecodeStepMs).
  std::map<std::string, double> decode_step_ms_ ABSL_GUARDED_BY(mu_);
  std::vector<InFlight> in_flight_;  // begun, not finished, in order; step thread only
  int64_t finished_steps_ = 0;       // by FinishSteps, ever; step thread only
  StepThreadClock clock_;            // charged into thread_time_; step thread only
  StepStarts starts_;                // added to step_starts_ by the loop; step thread only
  StepDrains drains_;                // added to step_drains_ with starts_; step thread only
  // Bumped by Wake, Add, Remove, RunOnStepThread, Stop and the steps'
  // device-done callbacks (rolling_steps); both loops wait on it. Shared
  // with the callbacks, which may run after the worker is gone.
  std::shared_ptr<StepSignal> signal_ = std::make_shared<StepSignal>();
  std::unique_ptr<transfer::WorkerPool> finishers_;  // null: finish on the step thread
  StepHostHistogram step_host_ ABSL_GUARDED_BY(mu_);
  StepThreadTime thread_time_ ABSL_GUARDED_BY(mu_);
  StepStarts step_starts_ ABSL_GUARDED_BY(mu_);
  StepDrains step_drains_ ABSL_GUARDED_BY(mu_);
  KvReclaims reclaims_ ABSL_GUARDED_BY(mu_);
  KvCompactions compactions_ ABSL_GUARDED_BY(mu_);
  // Running sequences the device shed, per resident model (for_kv and
  // for_weights of ModelPreemptions; growth is the engine's rest). Reset
  // when a model of that name is added.
  std::map<std::string, ModelPreemptions> sheds_ ABSL_GUARDED_BY(mu_);
  ArbitrationStats arb_stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ballast::node_manager
