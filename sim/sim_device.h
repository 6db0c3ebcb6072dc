// One simulated GPU: its resident models, their shared request queue, and
// the engine steps that serve them, on the simulator's virtual clock.
//
// What it models (the rules, written here once):
//  * Memory. Weights of every resident model (loading ones included) plus
//    the KV of its running requests. A request reserves the KV of its
//    prompt and all its output tokens when it is admitted and frees it
//    when it ends (no preemption); with policy.kv_paged, as the daemon's
//    engine, only its next step's blocks, grown step by step, and the
//    newest requests are preempted where growth does not fit
//    (sim_device_kv.cc has those rules; they replace the admission rule
//    below where it differs). elastic: all models share what the
//    weights leave; static: each resident model gets an equal share of it.
//  * Admission (at step boundaries): the queue is ordered by the
//    configured arbitration policy (node_manager::Arbitrate, the node's own
//    code), with each request's cost predicted as the node does: by the
//    model's node_manager::PrefillCostModel, fitted from this device's
//    iterations that carried the model's prefill tokens (their whole time,
//    decodes and other models' steps included, as the node times them).
//    Requests are admitted in that order while their KV fits and their
//    model has fewer than max_seqs running; elastic: the first that does
//    not fit stops admission (no bypass) unless it could only fit once
//    another model's weights leave (it waits, the others go on); static:
//    it blocks its own model.
//  * Session KV (policy.session_kv tiers or device; tp 1 models only). A
//    finished turn's KV (every token but the last generated one, never
//    fed: the engine's) stays here (the engine's session cache) in memory
//    that weights and running KV leave: it counts as free for admission
//    and for loads, and whenever weights, running KV and kept KV exceed
//    the memory (static: a model's running and kept KV its share), idle
//    sessions give theirs back, least recently used first
//    (memory::PlanKvShedding, the node's memory ladder). An Advise's
//    prefetch is kept the same way until its turn takes it or its
//    deadline passes. At admission a turn takes its session's KV kept
//    here and prefills only its new tokens (a prefetch still loading
//    delayed its arrival instead); else the lease its node read on
//    arrival; else it prefills its whole history too. A model leaving
//    drops its sessions' KV.
//  * Steps, rolling (policy.rolling_steps with overlap_steps: the node's
//    default, node.engine.rolling_steps). Each model steps at its own
//    pace: it has at most one step in flight, a batch of its decode
//    tokens plus prefill chunks (in admission order) up to
//    max_batch_tokens, and it begins the next as soon as that one ends.
//    A step of alone-time s (TpStepSeconds) is host time
//    (policy.step_host_s) and the launch latency l = min(s, k0 + o), and
//    no more than s less its unhideable HBM reads
//    (EngineModel::OverlappedSeconds; k0 is LatencySeconds; o, for a
//    decode-only step, policy.rolling_overlap_share x
//    EngineModel::OverlapSeconds: the measured overlap of concurrent
//    small steps), during which the model
//    waits but takes none of the GPU, then GPU work s - l. The GPU is shared by
//    the steps whose work is on it: each progresses at g / G of its alone
//    rate, g its work to the power policy.rolling_share_exponent (times
//    policy.rolling_skinny_weight for a decode-only step of at most
//    rolling_skinny_rows rows, whose skinny GEMVs take more of the SMs)
//    and G the sum of those on the GPU (0: processor sharing, equal
//    shares; the default 0.5: a long step gets more than a short one, as
//    measured), where a step of the other kind (decode-only against one
//    with prefill chunks) counts policy.rolling_cross_weight of its
//    weight: below 1, HBM-bound decodes and compute-bound prefills
//    overlap, and their shares add up to more than the GPU. The shares add up to one: the device
//    does its steps' work at serial speed (the measurements below), but a short step is no longer
//    held by a long one. A step's tokens come when its work is done; its model then admits and
//    begins its next step. Without ahead steps, one model alone steps every host + s, as lockstep;
//    k identical models begun together take host + l + k (s - l) a step, as a lockstep iteration.
//  * Ahead steps (policy.ahead_steps, the node's node.engine.ahead_steps;
//    device_worker_rolling.cc's BeginAheadSteps, the engine's
//    CanBeginAhead). A model's next step is planned as its current one
//    begins (at the same instant) and queued behind it: when a step ends
//    the next one begins at once from the requests admitted before, and
//    the host time of its planning ran beside the last step (hidden, up
//    to that step's length; the launch latency l stays). The model's
//    admissions at that boundary are for the step after it, so a request
//    that arrives while a model steps waits for the step already queued
//    too. Not for tensor-parallel models (the node runs none) nor a model
//    streaming lent layers (remapping). One 1B model alone on the H200:
//    TPOT p50 1.41 ms measured, 1.42 simulated (1.44 without).
//  * One model stepping alone (rolling): the node's loop waits on that
//    step's own event (OneEngineInFlight), so work that arrives for
//    another model meanwhile is looked at, and that model begins, only
//    when the step ends (at the instant it began: at once). With two or
//    more models in flight the loop wakes on new work at once. Not on a
//    GPU holding a tensor-parallel part (the node runs none). A model with
//    a step in flight and none queued behind it (its last plan had no
//    work) is passed over until that step ends and then begins afresh,
//    its host time not hidden; the node would queue the new request's
//    step behind it at once (a little TTFT over, with step_host_s > 0).
//    Checked against the H200 (docs/benchmarks.md): beside a 2,048-token
//    prefill chunk, a small decode step got 22-33% of the GPU (bench-
//    engine's interference runs; work^0.5 predicts 22-37%, equal shares
//    50%), and the device did 1.05-1.11 of serial work (not modelled).
//    Through the daemon (2026-11-30), a 1B chat model beside another 1B
//    model's prefill chunks: TPOT p50 6.93 ms lockstep and 4.96 ms
//    rolling, simulated 5.93 and 4.02 ms; the bulk model 0.5% slower
//    rolling, simulated 2%. Concurrent decode steps overlap further on
//    the GPU: the calibration's concurrent points (N copies at once, one
//    host thread each) give EngineModel::OverlapSeconds, of which the
//    node realises policy.rolling_overlap_share (docs/benchmarks.md,
//    "Concurrent steps' overlap").
//  * Admission, rolling: at a model's step boundary (or at once when it
//    has no step in flight; with ahead steps, when its step begins, for
//    the step after), by the same arbitration over the whole queue; the
//    requests of models with a step in flight are passed over (their
//    model admits at its next boundary) and never stop admission.
//    The cost model times each model's own step (begin to end), as the
//    rolling node does.
//  * Steps, lockstep (rolling_steps: false, or overlap_steps: false). One
//    iteration steps every model that has running requests, each a batch
//    as above. With overlap_steps (the node's default) the steps run on
//    their own streams: the iteration takes the longest step's launch
//    latency plus the sum of the rest of the steps' times, which keep the
//    GPU busy; without, the sum of the step times. A decode-only step's
//    latency is k0 + policy.lockstep_overlap_share x
//    EngineModel::OverlapSeconds, bounded as in rolling steps
//    (EngineModel::OverlappedSeconds; the share is 0 by default, as the H100 measured; the
//    H200 realises about half: docs/benchmarks.md). The serving path's
//    host time (policy.step_host_s) comes on top: once per iteration
//    overlapped, once per model stepped serially.
//    Why the per-layer cost is not overlapped (either way): four 1B
//    models served on an
//    H100 ran at serial speed (TPOT p50 9.4-9.5 ms for the three bursty
//    ones, where serial stepping predicts 9.6 and overlapping the
//    per-layer cost 6.3; docs/benchmarks.md). Only
//    launch-bound models far below 1B gain from overlap (issue 13: six
//    130M models, 0.72 ms overlapped against 2.31 serial), which this rule
//    does not capture. A request's first token comes at the end of the
//    iteration that finishes its prefill, every later one at the end of an
//    iteration.
//  * Tensor parallelism (SimModel::tp > 1). A replica spans tp GPUs of one
//    node. Its first GPU leads: requests queue, are admitted and step
//    there, and its tokens follow that GPU's iterations. Every GPU of the
//    group holds the model's part (weights and each running request's KV,
//    TensorParallelPart); the others hold it as a shadow, which admits
//    nothing and whose KV moves with the leader's admissions (a request is
//    admitted only if every GPU of the group has room for its part). Each
//    of them runs the part's step (the leader's current step work, plus
//    the all-reduces, TpStepSeconds) once for each step the leader takes,
//    in its own next iteration, so the models sharing those GPUs slow down
//    by it. Lockstep: the leader starts the model's next step only once
//    every other GPU of the group has started the previous one (a real TP
//    step waits at its all-reduces), so the model steps at the pace of the
//    group's busiest GPU; meanwhile the leader steps its other models
//    alone. The leader may be one step ahead of that GPU, so its tokens
//    can come up to one of that GPU's iterations early. Each such
//    iteration is a single step (no decode stretches). Rolling, the same:
//    each part is a model of its GPU (a shadow's part begins once its
//    leader has begun a step it has not run, and its previous part step
//    has ended), and the leader's gate is the one above.
//  * Parameter remapping (policy.remap, elastic memory; tp 1 models lend;
//    sim_device_remap.cc, sim_remap.h's figures). Where a request does not
//    fit at admission (idle session KV already counts as free), the GPU's
//    models lend weight layers for the shortfall by the daemon's own
//    functions (memory::PlanRemap over DonorOrder: idle models first,
//    each to its cap, RemapCap), so the lent layers' bytes become KV room
//    (weights count less by them); past every cap the request waits as
//    before (a capped event). Layers come back as the daemon's
//    RemapController::Tick (memory::RevertNext): a model over its cap (a
//    lender that got requests) first, every layer past its cap at once,
//    the newest running requests preempted for their room with kv_paged;
//    else one layer at a time once no shortfall (a request lending could
//    not place, or a queued request of a serving model that does not fit)
//    was seen for revert_after_s, and only while its bytes are free
//    (beside weights, running and kept KV). Each layer taken back is
//    copied in from the host with every model's steps ended (the
//    controller's quiesce, then WeightRemapper::SetAlpha's copies): the
//    GPU begins no step until those in flight have ended and then T_T a
//    layer has passed. The tick runs at every step boundary
//    before admission (rolling: at most every 100 ms) and every 50 ms
//    while the GPU is idle (rolling: 100 ms). A model lending layers
//    streams them in every step: no cost while the plan's copies hide
//    behind the step, else the step waits for them (sim_remap.h), as
//    host-side time that takes none of the GPU (rolling: before its GPU
//    work; lockstep: the iteration lasts at least that model's launch,
//    wait and work). While any model lends, no stretches run.
//  * Speed. While only decodes run and no queued request could be admitted
//    by a later step (fcfs and edf: none fits now; other policies: none of
//    a serving model is queued), the device runs whole stretches of
//    steps in one event
//    (until the next request finishes; step time grows linearly with the
//    context, so the stretch's length is closed-form): lockstep, of
//    iterations; rolling, only while a single model (tp 1) has a step in
//    flight, as processor sharing between several has no such closed
//    form (with ahead steps, a stretch begins at a step whose host time
//    was hidden and admits nothing: every running request decodes).
//    Lockstep, an arrival or a model becoming ready cuts the stretch at
//    the next step boundary; rolling, at once: the step under way goes
//    on as an ordinary step (the time it has had counted), and the
//    newcomer is looked at when it ends (the lone-model rule above).
//
// Thread-safety: none (the simulator's single thread).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "ballast/v1/admin.pb.h"
#include "ballast/v1/node.pb.h"
#include "node_manager/arbitration_log.h"
#include "node_manager/prefill_cost_model.h"
#include "sim/engine_model.h"
#include "sim/event_queue.h"
#include "sim/sim_config.h"
#include "sim/sim_device_hooks.h"
#include "sim/sim_remap.h"
#include "sim/sim_request.h"
#include "sim/simulator.h"

namespace ballast::sim {

// One step of `model`'s replica on each of its GPUs: its part's step
// (EngineModel::StepSeconds of SimModel::Part) plus, for tp > 1, two
// all-reduces per layer of the step's tokens (SimPolicy's tp_* figures).
double TpStepSeconds(const EngineModel& engine, const SimPolicy& policy, const SimModel& model,
                     const StepWork& work);

class SimDevice {
 public:
  // The simulator's callbacks (sim_device_hooks.h).
  using Hooks = SimDeviceHooks;

  SimDevice(std::string node_id, std::string name, int64_t memory_bytes, const SimConfig* config,
            const EngineModel* engine, EventQueue* events, Hooks hooks);

  // Reserves `model`'s weights now; it serves from Ready(). A model still
  // draining here serves again at once (true: no activation needed).
  bool Load(int model);
  // Reserves the part of a tensor-parallel `model` whose replica another
  // GPU of this node leads (a shadow: see the rules above).
  void LoadShadow(int model);
  void Ready(int model);
  // No new admissions for `model`; it leaves (weights freed, `drained`
  // called) once its running and queued requests are done. Queued ones
  // are still served.
  void Drain(int model);
  void Enqueue(SimRequest* r);
  // A shadow's KV: whether `bytes` more fit now, and taking (> 0) or
  // freeing (< 0) them. TakeShadowKv starts an iteration if none runs.
  bool ShadowFits(int model, int64_t bytes) const;
  void TakeShadowKv(int model, int64_t bytes);
  // A tensor-parallel `model` led here: the steps started, and the work of
  // the last (its decodes and prefill chunks). A shadow's: steps started.
  int64_t TpSteps(int model) const;
  StepWork LastTpWork(int model) const;
  // Starts an iteration if none runs (a group's GPU may have a step to run).
  void Wake() { Kick(); }

  ModelPhase phase(int model) const;
  bool Busy(int model) const;  // running or queued requests
  int Requests() const;        // running or queued, every model's
  // Whether `weight_bytes` more weights fit beside what is resident and
  // the KV in use, leaving min_kv_fraction of the memory for KV.
  bool CanLoad(int64_t weight_bytes) const;
  // The most KV one request of `model` can ever get here (elastic: the
  // memory less its weights, once every other model has left).
  int64_t KvCapacity(int model) const;

  const std::string& node_id() const { return node_id_; }
  const std::string& name() const { return name_; }
  int64_t memory_bytes() const { return memory_; }
  int64_t weight_bytes() const;  // its residents' weights (and workspace, if charged)
  // A resident model's engine buffers (policy.charge_workspace; else 0).
  int64_t Workspace(int model) const;
  int64_t kv_used() const;
  int queue_length() const { return static_cast<int>(pending_.size()); }
  // The device and its residents as a heartbeat reports them (the
  // layers still lendable, as RemapController's last tick counts them).
  void Report(v1::DeviceState* state, std::vector<v1::ResidentModel>* models);
  int64_t model_steps() const { return model_steps_; }

  // Session KV kept here (sim_device_sessions.cc; the rules above).
  // The session's KV for `model` (null: none).
  const CachedSession* Cached(int session, int model) const;
  // Whether a Prefetch of model's KV can be kept here at all (the model
  // ready here, tp 1, session KV kept on GPUs); Prefetch may still find no
  // room.
  bool CanPrefetch(int model) const;
  // Moves a session's KV here ahead of its turn (an Advise), usable from
  // `ready_at`, dropped at `expires` unless a turn takes it first. False
  // if the room is held by weights and running requests (nothing done).
  bool Prefetch(int session, int model, int tokens, int64_t bytes, double ready_at, double expires);
  // Drops the session's prefetch if it is still the unused one that
  // expires at `expires`.
  void ExpirePrefetch(int session, double expires);
  int64_t session_bytes() const { return session_bytes_; }
  const SessionCounters& session_counters() const { return session_counters_; }
  const KvCounters& kv_counters() const { return kv_counters_; }

  // Parameter remapping (sim_device_remap.cc; the rules above). The
  // counters, layer-seconds up to now.
  RemapCounters remap_counters() const;

 private:
  struct Chunk {
    SimRequest* r;
    int tokens;
  };
  // Rolling: a model's step in flight (or a decode stretch of n steps).
  struct Step {
    bool on = false;
    double start = 0;     // when it began (its first step, for a stretch)
    double delay = 0;     // host time + launch latency, before its GPU work
    double work = 0;      // its GPU work, in seconds alone
    bool joined = false;  // its work is on the GPU (after the delay)
    double weight = 0;    // joined: its share of the GPU, relative
    int kind = 0;         // joined: 1 with prefill chunks, 0 decode-only
    double finish = 0;    // joined: its kind's served_ at which it is done
    StepWork w;
    std::vector<Chunk> chunks;
    // A stretch (n > 1): step i (from 0) takes t0 + i * delta alone.
    int n = 1;
    double t0 = 0, delta = 0;
    // Ahead steps: `ahead`, this step was planned while the model's last
    // one ran; `follows`, the step ended and the model's next one was
    // planned while it ran (last_s long).
    bool ahead = false;
    bool follows = false;
    double last_s = 0;
    // The model plans nothing while this step runs (a drain: Resident::
    // drain), so no step follows it.
    bool no_follow = false;
  };
  struct Resident {
    int model = 0;
    ModelPhase phase = ModelPhase::kLoading;
    std::vector<SimRequest*> running;  // in admission order
    int64_t kv_used = 0;
    bool shadow = false;    // a tensor-parallel part another GPU leads
    int64_t tp_steps = 0;   // tp > 1: steps started here (leader or shadow)
    StepWork tp_work = {};  // tp > 1, leading: the last step's work
    bool stepped = false;   // stepped in the iteration under way
    Step step{};            // rolling
    // Rolling, ahead steps, remapping: an ahead plan (made as a step
    // begins, for the one after) left out an admission that needed lent
    // layers, which the node's ahead plans never ask for (BatchPlanner):
    // the model plans again, with the whole ladder, only once its steps
    // in flight have ended (StepPlan::drain). Cleared by that plan.
    bool drain = false;
    // Remapping: the layers it lends and streams (alpha 0: none), whether
    // their plan was made under the timing constraint (the daemon's
    // set_respect_timing), and when it last stepped (MRU donor order).
    memory::StreamingPlan lent{};
    bool lent_respect = true;
    int64_t last_active = 0;
    // T_c as the daemon's WeightRemapper samples it: per-layer times of
    // the last decode-only steps that streamed nothing (0: none yet).
    std::array<double, 16> tc_recent{};
    size_t tc_next = 0;
    memory::StallCorrection stall_fix{};  // as the WeightRemapper's
  };

  Resident* Find(int model);
  const Resident* Find(int model) const;
  const SimModel& Spec(int model) const { return config_->models[static_cast<size_t>(model)]; }
  bool Rolling() const { return config_->policy.rolling_steps && config_->policy.overlap_steps; }
  // Rolling: whether exactly one model has a step in flight, begun before
  // now (the node's loop then waits on that step's end before it looks
  // at new work).
  bool LoneStepInFlight() const;
  // Whether `res` plans its next step while its current one runs (rolling
  // with policy.ahead_steps; as the engine's CanBeginAhead: no layers
  // streamed, and not tensor-parallel, which the node does not run).
  bool StepsAhead(const Resident& res) const;
  void Kick();
  void Admit();
  bool Fits(const Resident& res, int64_t bytes, int64_t total_kv) const;
  // The work of `res`'s next step; appends its prefill chunks to *chunks
  // and lowers *k to the fewest tokens a decode still owes.
  StepWork WorkOf(const Resident& res, int* k, std::vector<Chunk>* chunks);
  // The work `res` steps next (false: it does not step now). Tensor-
  // parallel residents step under the lockstep rule above.
  bool PlanResident(Resident* res, StepWork* w, int* k, std::vector<Chunk>* chunks);
  // Whether a queued request might be admitted at a later step of a
  // decode stretch (the rule under Speed above).
  bool AdmissionMayChange() const;
  // Credits `steps` decode tokens to `res`'s running decodes.
  static void CreditDecodes(Resident* res, int steps);
  void Finish(Resident* res, SimRequest* r);
  void RemoveDrained();

  // Sessions (sim_device_sessions.cc).
  bool KeepsSessions(int model) const;
  // A finished turn's KV stays here for the session's next turn.
  void KeepSession(const Resident& res, const SimRequest& r);
  // At admission: the request takes its session's KV kept here, else its
  // lease, else recomputes its history (sets origin, reused, prefilled).
  void TakeSession(SimRequest* r);
  // The tokens TakeSession would find computed for r now (0 for a
  // preempted request, which recomputes everything).
  int SessionPrefix(const SimRequest& r) const;
  // Gives back idle sessions' KV, least recently used first
  // (memory::PlanKvShedding), until weights, running KV and kept KV fit.
  void ShedSessions();
  void ShedFrom(int model, int64_t over);
  void DropSessions(int model);
  void EraseSession(std::map<int, CachedSession>::iterator it);

  // Remapping (sim_device_remap.cc).
  bool Remapping() const;
  bool Lending() const;    // some model lends layers
  bool KvWaiting() const;  // a queued request of a serving model does not fit
  // The daemon's RemapController::Tick: one layer back when the rules
  // allow.
  void RemapTick();
  // At a step boundary, before admission (rolling: at most every 100 ms).
  void RemapStep();
  // The GPU stops stepping: ticks at the daemon's idle cadence while it
  // lends layers and the simulation has requests outstanding.
  void RemapIdle();
  const RemapTimings& Timings(int model);
  // Timings with T_c as sampled now (sim_remap.h).
  RemapTimings TimingsNow(const Resident& res);
  // A decode-only step of `res` that took `seconds` (T_c's window).
  void ObserveDecode(Resident* res, double seconds);
  // The link the busy streaming models take (memory::LinkShare), by
  // resident index, and in all.
  std::vector<double> LinkShares(double* total);
  // The candidates, with the link each one's others take (`others`).
  std::vector<memory::RemapCandidate> RemapCandidates(std::vector<double>* others = nullptr);
  // Lends layers for `shortfall` bytes of KV; returns the bytes freed.
  int64_t Lend(int64_t shortfall);
  // A request of `res` (`bytes` of KV) short of room beside `total_kv`:
  // lends for the shortfall; whether it fits now.
  bool LendFor(const Resident& res, int64_t bytes, int64_t total_kv);
  // The wait of `res`'s step of `step_s` for its streamed layers (0 when
  // it lends none), counted, and fed to its stall correction.
  double RemapStall(Resident* res, double step_s);
  void RemapAccrue();  // layer-seconds up to now
  // A revert's copies (`seconds`): no step begins until every step in
  // flight has ended and then `seconds` have passed.
  void QuiesceForCopies(double seconds);
  // Whether steps must wait for a revert's copies (CopyPause begun, or
  // to begin once the steps in flight end); begins the pause when the
  // device has nothing in flight.
  bool CopyPaused();
  bool AnyStepOn() const;
  void NoteKvWait(SimRequest* r);
  // hooks_.arbitration: a decision over `reqs` (`requests` by their ids)
  // in `order` (arbitration's), its changes reported.
  void NoteDecision(const std::vector<node_manager::PendingRequest>& reqs,
                    const std::vector<uint64_t>& order,
                    const std::map<uint64_t, SimRequest*>& requests);

  // KV held block by block (policy.kv_paged; sim_device_kv.cc).
  bool Paged(int model) const;
  int64_t BlockBytes(int model) const;
  int64_t BlocksBytes(int model, int tokens) const;  // tokens rounded up to blocks
  // kv_paged admission's watermark: a block for every paged request
  // running on the GPU, of any model (the node's KvManager::FitsWatermark).
  int64_t GrowthWatermark() const;
  // The KV a queued request reserves at admission: whole, or (paged) its
  // first step's `take` tokens after what its session's KV covers.
  int64_t AdmitBytes(const SimRequest& r, int take) const;
  // The tokens of `res`'s next step already taken by its running requests.
  int StepTokens(const Resident& res) const;
  // Before `res` plans a step (and before the GPU's admissions at that
  // boundary): each running request, oldest first, holds the blocks of its
  // next step's tokens, preempting where they do not fit. False: a victim's
  // model has a step in flight, and `res` waits for it (policy.
  // growth_waits_for_victims; VictimDrain): it begins no step now.
  bool GrowKv(Resident* res);
  // Ahead steps: as `res` begins a step, the node plans its next one at
  // once (engine/batch_planner.cc's ahead plan): each running request,
  // oldest first, takes the blocks of its tokens in that step where they
  // fit now, preempting nobody (when that step begins, GrowAhead takes
  // what fits then; with ahead_growth_asks_nobody false, GrowKv takes what
  // is still missing, preempting).
  void ReserveAhead(Resident* res);
  // As a step planned ahead begins (policy.ahead_growth_asks_nobody): each
  // running request, oldest first, holds the blocks of its tokens in it
  // where they fit now, else sits out of it (SimRequest::sits_out). True
  // if one sat out: the model plans its next step once this one ended.
  bool GrowAhead(Resident* res);
  // The KV tokens r's next step writes, with at most `budget` of its
  // prompt; *take: the step's tokens it takes.
  static int StepKvTokens(const SimRequest& r, int budget, int* take);
  // r holds the blocks of `tokens` if they fit now, preempting nobody
  // (*took set when it took any); false if they do not fit.
  bool HoldIfFits(Resident* res, SimRequest* r, int tokens, bool* took);
  // The requests that sat out of res's step in flight are in its next.
  static void SitIn(Resident* res);
  enum class Grown { kHeld, kPreempted, kWaits };
  // Grows r's blocks to `tokens`: kPreempted if r itself was preempted,
  // kWaits if the next victim's model has a step in flight (its owner is
  // then set as victim_drain_.of; nothing of that model was taken).
  Grown Reserve(Resident* res, SimRequest* r, int tokens);
  // Whether a growth must wait for `owner`'s steps before preempting its
  // requests (rolling, policy.growth_waits_for_victims, a step in flight).
  bool WaitsForSteps(const Resident& owner) const;
  // Rolling: while a growth waits for a victim model's steps, the steps
  // already queued begin (planning none after them) and nothing else; true
  // while the wait lasts (RollStart does nothing more).
  bool VictimDrainHolds();
  // A running request of a model other than `res` (null: any) newer than
  // `than` (lowest priority first, then newest), or null.
  std::pair<Resident*, SimRequest*> NewerVictim(const Resident* res, int64_t than);
  void Preempt(Resident* owner, SimRequest* v);
  // A decode stretch of up to k steps of `stepping`: the most steps whose
  // blocks fit (paged; else k). Nothing is reserved: a stretch is cut
  // before anything else takes memory, and SyncHeld counts what it wrote.
  int StretchFits(const std::vector<const Resident*>& stepping, int k) const;
  // The blocks `res`'s decoding requests need for j more decode steps
  // beyond those they hold.
  int64_t StretchBytes(const Resident& res, int j) const;
  // After a stretch's steps are credited: each decoding request holds the
  // blocks of the KV it wrote.
  void SyncHeld(Resident* res);

  // Lockstep (sim_device_lockstep.cc).
  void StartIteration();
  // Plans the next iteration's chunks; returns its time, or < 0 if idle.
  double PlanIteration(bool* decode_only);
  void Cut();
  void EndIteration(uint64_t version, int iterations);

  // Rolling (sim_device_rolling.cc).
  // Admits, begins a step for each model that can, and reschedules.
  void RollStart();
  // RollStart's first part: each model whose step ended begins the one
  // planned ahead while it ran (counted in *began, *last the latest);
  // stops where a growth begins to wait for a victim's steps. While one
  // waits (victim_drain_), the waiting model's is left and none plans the
  // step after.
  void BeginQueuedSteps(int* k, int* began, Resident** last);
  // `ahead`: the step planned while the model's last one ran.
  bool RollBegin(Resident* res, int* k, bool ahead);
  void RollStretch(Resident* res, int k);
  // A stretch under way goes on as an ordinary step (Speed above).
  void RollUnstretch();
  // The weights of the steps whose work is on the GPU, as a step of
  // `kind` counts them (the other kind's at policy.rolling_cross_weight).
  double Sharing(int kind) const;
  void RollAdvance();  // served_ up to now
  // `s`'s work joins the GPU with `left` seconds of it (alone) to do.
  void RollJoin(Step* s, double left);
  void RollReschedule();
  void RollEvent(uint64_t version);
  void RollEnd(Resident* res);
  // Hooks::step for res's step(s) begun at `start` and ended at `end`.
  void RecordStep(const Resident& res, double start, double end, int steps,
                  const StepWork& w) const;

  const std::string node_id_, name_;
  const int64_t memory_;
  const SimConfig* config_;
  const EngineModel* engine_;
  EventQueue* events_;
  Hooks hooks_;
  std::vector<Resident> residents_;
  std::vector<SimRequest*> pending_;
  // The iteration (or decode stretch) under way.
  bool busy_ = false;
  bool ending_ = false;  // EndIteration is finishing requests: it starts the next itself
  uint64_t version_ = 0;
  double start_ = 0, t0_ = 0, delta_ = 0;  // stretch: iteration i takes t0 + i * delta
  int iterations_ = 0;
  int stepped_ = 0;  // models stepped per iteration
  bool decode_only_ = false;
  std::vector<Chunk> chunks_;                            // the prefill chunks of a single iteration
  std::map<int, node_manager::PrefillCostModel> costs_;  // per model, as the node's
  node_manager::ArbitrationTracker decisions_;           // hooks_.arbitration
  int64_t model_steps_ = 0;
  // Rolling: the service per unit of weight each step on the GPU of each
  // kind (decode-only, with prefill) has had since it was 0 (it grows by
  // dt / Sharing(kind)), as of served_at_.
  std::array<double, 2> served_{};
  double served_at_ = 0;
  double pending_at_ = -1;                 // when the pending RollEvent is due (-1: none)
  std::map<int, CachedSession> sessions_;  // by the simulator's session index
  int64_t session_bytes_ = 0;              // their bytes
  int64_t session_recency_ = 0;
  SessionCounters session_counters_;
  KvCounters kv_counters_;
  int64_t admit_clock_ = 0;  // admissions so far (SimRequest::admit_order)
  // Rolling: a growth of model `for_` waits for model `of`'s steps in
  // flight to end (the daemon's DrainVictims; -1: none), since when.
  struct VictimDrain {
    int for_ = -1, of = -1;
    double since = 0;
  } victim_drain_;
  bool growth_may_wait_ = true;  // false while queued steps grow during a wait
  // Remapping.
  std::map<int, RemapTimings> timings_;  // by model, as first needed
  double last_shortfall_ = -1e300;       // when a KV shortfall was last seen
  double remap_at_ = 0;                  // layer-seconds counted up to here
  double remap_ticked_ = -1e300;         // rolling: the last tick
  uint64_t remap_wake_ = 0;              // the idle tick's version
  double copies_due_s_ = 0;              // reverts' copies not begun (QuiesceForCopies)
  double paused_until_ = -1;             // their copies end then; no step begins before
  int64_t active_clock_ = 0;
  RemapCounters remap_counters_;
};

}  // namespace ballast::sim
