// One simulated GPU: its resident models, their shared request queue, and
// the engine steps that serve them, on the simulator's virtual clock.
//
// What it models (the rules, written here once):
//  * Memory. Weights of every resident model (loading ones included) plus
//    the KV of its running requests. A request reserves the KV of its
//    prompt and all its output tokens when it is admitted and frees it
//    when it ends (no preemption). elastic: all models share what the
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
//  * Steps (the node's lockstep loop, node.engine.rolling_steps: false;
//    the node's default is now rolling, which this does not model yet).
//    One iteration steps every model that has running requests,
//    each a batch of its decode tokens plus prefill chunks (in admission
//    order) up to max_batch_tokens. With overlap_steps (the node's
//    default) the steps run on their own streams: the iteration takes the
//    longest step's launch latency (the per-step constant k0,
//    EngineModel::LatencySeconds) plus the sum of the rest of the steps'
//    times, which keep the GPU busy; without, the sum of the step times.
//    The serving path's host time (policy.step_host_s) comes on top: once
//    per iteration overlapped, once per model stepped serially.
//    Why the per-layer cost is not overlapped: four 1B models served on an
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
//    iteration is a single step (no decode stretches).
//  * Speed. While only decodes run and no queued request could be admitted
//    by a later step (fcfs and edf: none fits now; other policies: none of
//    a serving model is queued), the device runs whole stretches of
//    iterations in one event
//    (until the next request finishes; step time grows linearly with the
//    context, so the stretch's length is closed-form). An arrival or a
//    model becoming ready cuts the stretch at the next step boundary.
//
// Thread-safety: none (the simulator's single thread).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "ballast/v1/admin.pb.h"
#include "ballast/v1/node.pb.h"
#include "node_manager/prefill_cost_model.h"
#include "sim/engine_model.h"
#include "sim/event_queue.h"
#include "sim/sim_config.h"

namespace ballast::sim {

struct SimRequest {
  int index = 0;  // into the simulator's requests
  int model = 0;  // into the catalogue
  double release = 0, deadline = 0;
  int prompt = 0, output = 0;
  int64_t kv_bytes = 0;
  int prefilled = 0, generated = 0;
  double admitted = -1, first_token = -1, end = -1;
};

enum class ModelPhase { kAbsent, kLoading, kReady, kDraining };

// One step of `model`'s replica on each of its GPUs: its part's step
// (EngineModel::StepSeconds of SimModel::Part) plus, for tp > 1, two
// all-reduces per layer of the step's tokens (SimPolicy's tp_* figures).
double TpStepSeconds(const EngineModel& engine, const SimPolicy& policy, const SimModel& model,
                     const StepWork& work);

class SimDevice {
 public:
  struct Hooks {
    std::function<void(SimRequest*)> done;   // a request's last token
    std::function<void(int model)> drained;  // a draining model left
    // Tensor-parallel models this device leads: whether every other GPU of
    // the group can take `bytes` more KV now, and KV taken (> 0) or freed
    // (< 0) there. Unset: tp = 1 models only.
    std::function<bool(int model, int64_t bytes)> group_fits;
    std::function<void(int model, int64_t bytes)> group_kv;
    // A shadow here: the work of the last step of `model` that its leader
    // started, and how many it has started.
    std::function<StepWork(int model)> lead_work;
    std::function<int64_t(int model)> lead_steps;
    // Leading: the fewest steps of `model` the group's other GPUs have
    // started (the lockstep gate).
    std::function<int64_t(int model)> members_steps;
    // Tells the group's other GPUs (a leader's) or its leader (a shadow's)
    // that `model` stepped here: they may have a step to run now.
    std::function<void(int model)> stepped;
  };

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
  int64_t weight_bytes() const;
  int64_t kv_used() const;
  int queue_length() const { return static_cast<int>(pending_.size()); }
  // The device and its residents as a heartbeat reports them.
  void Report(v1::DeviceState* state, std::vector<v1::ResidentModel>* models) const;
  int64_t model_steps() const { return model_steps_; }

 private:
  struct Resident {
    int model = 0;
    ModelPhase phase = ModelPhase::kLoading;
    std::vector<SimRequest*> running;  // in admission order
    int64_t kv_used = 0;
    bool shadow = false;    // a tensor-parallel part another GPU leads
    int64_t tp_steps = 0;   // tp > 1: steps started here (leader or shadow)
    StepWork tp_work = {};  // tp > 1, leading: the last step's work
    bool stepped = false;   // stepped in the iteration under way
  };
  struct Chunk {
    SimRequest* r;
    int tokens;
  };

  Resident* Find(int model);
  const Resident* Find(int model) const;
  const SimModel& Spec(int model) const { return config_->models[static_cast<size_t>(model)]; }
  void Kick();
  void StartIteration();
  void Admit();
  bool Fits(const Resident& res, int64_t bytes, int64_t total_kv) const;
  // The work of `res`'s next step; appends its prefill chunks to chunks_
  // and lowers *k to the fewest tokens a decode still owes.
  StepWork WorkOf(const Resident& res, int* k);
  // Plans the next iteration's chunks; returns its time, or < 0 if idle.
  double PlanIteration(bool* decode_only);
  // The work `res` steps in the next iteration (false: it does not step).
  // Tensor-parallel residents step under the lockstep rule above.
  bool PlanResident(Resident* res, StepWork* w, int* k);
  void Cut();
  void EndIteration(uint64_t version, int iterations);
  void Finish(Resident* res, SimRequest* r);
  void RemoveDrained();

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
  int64_t model_steps_ = 0;
};

}  // namespace ballast::sim
