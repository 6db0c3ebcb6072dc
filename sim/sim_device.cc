#include "sim/sim_device.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "memory/remap_plan.h"

namespace ballast::sim {

double TpStepSeconds(const EngineModel& engine, const SimPolicy& policy, const SimModel& model,
                     const StepWork& work) {
  const ModelShape part = model.Part();
  double t = engine.StepSeconds(part, work);
  if (model.tp > 1) {
    const double tokens = work.decode_tokens + work.prefill_tokens;
    const double bytes = tokens * model.shape.hidden * 2;  // BF16 activations
    const double ring = 2.0 * (model.tp - 1) / model.tp;
    t += 2.0 * model.shape.layers *
         (policy.tp_allreduce_latency_s + bytes * ring / policy.tp_allreduce_bus_bytes_per_s);
  }
  return t;
}

SimDevice::SimDevice(std::string node_id, std::string name, int64_t memory_bytes,
                     const SimConfig* config, const EngineModel* engine, EventQueue* events,
                     Hooks hooks)
    : node_id_(std::move(node_id)),
      name_(std::move(name)),
      memory_(memory_bytes),
      config_(config),
      engine_(engine),
      events_(events),
      hooks_(std::move(hooks)) {}

SimDevice::Resident* SimDevice::Find(int model) {
  for (auto& r : residents_) {
    if (r.model == model) return &r;
  }
  return nullptr;
}

const SimDevice::Resident* SimDevice::Find(int model) const {
  return const_cast<SimDevice*>(this)->Find(model);
}

bool SimDevice::Load(int model) {
  if (Resident* r = Find(model); r != nullptr) {
    if (r->phase != ModelPhase::kDraining) return false;
    r->phase = ModelPhase::kReady;  // its weights never left: serves at once
    Kick();
    return true;
  }
  residents_.push_back(Resident{model, ModelPhase::kLoading, {}, 0});
  ShedSessions();  // the memory ladder: kept sessions' KV gives way to weights
  return false;
}

void SimDevice::LoadShadow(int model) {
  residents_.push_back(Resident{model, ModelPhase::kLoading, {}, 0, /*shadow=*/true});
  ShedSessions();
}

bool SimDevice::ShadowFits(int model, int64_t bytes) const {
  const Resident* r = Find(model);
  return r != nullptr && Fits(*r, bytes, kv_used());
}

void SimDevice::TakeShadowKv(int model, int64_t bytes) {
  Resident* r = Find(model);
  if (r == nullptr) return;
  r->kv_used += bytes;
  if (bytes > 0) ShedSessions();
  if (bytes > 0) Kick();  // its steps start (or a decode stretch is cut)
}

void SimDevice::Ready(int model) {
  if (Resident* r = Find(model); r != nullptr && r->phase == ModelPhase::kLoading) {
    r->phase = ModelPhase::kReady;
    // As the daemon's RemapController::NoteEngines: a model just loaded
    // is the most recently activated (MRU among remapping's donors).
    r->last_active = ++active_clock_;
    Kick();
  }
}

void SimDevice::Drain(int model) {
  if (Resident* r = Find(model); r != nullptr) r->phase = ModelPhase::kDraining;
  // With nothing running or queued it leaves now (an iteration in flight
  // does not step it); EndIteration removes it otherwise.
  if (!ending_) RemoveDrained();
}

void SimDevice::Enqueue(SimRequest* r) {
  pending_.push_back(r);
  Kick();
}

ModelPhase SimDevice::phase(int model) const {
  const Resident* r = Find(model);
  return r == nullptr ? ModelPhase::kAbsent : r->phase;
}

bool SimDevice::Busy(int model) const {
  const Resident* r = Find(model);
  if (r != nullptr && !r->running.empty()) return true;
  return std::any_of(pending_.begin(), pending_.end(),
                     [&](const SimRequest* p) { return p->model == model; });
}

int SimDevice::Requests() const {
  int n = static_cast<int>(pending_.size());
  for (const Resident& r : residents_) n += static_cast<int>(r.running.size());
  return n;
}

int64_t SimDevice::weight_bytes() const {
  const int64_t page = static_cast<int64_t>(config_->policy.page_mib) << 20;
  int64_t w = 0;
  for (const auto& r : residents_) {
    const int64_t weights = Spec(r.model).Part().weight_bytes();
    w += (page > 0 ? (weights + page - 1) / page * page : weights) + Workspace(r.model);
    // Lent layers' bytes are KV room now (remapping).
    if (r.lent.alpha > 0) w -= r.lent.alpha * LayerBytes(Spec(r.model).Part());
  }
  // The KV arena's whole pages: the room left over, rounded down, is the
  // KV's (what is below a page counts with the weights).
  if (page > 0 && w < memory_) w = memory_ - (memory_ - w) / page * page;
  return w;
}

int64_t SimDevice::kv_used() const {
  int64_t kv = 0;
  for (const auto& r : residents_) kv += r.kv_used;
  return kv;
}

bool SimDevice::CanLoad(int64_t weight_bytes) const {
  const double left = static_cast<double>(memory_ - this->weight_bytes() - weight_bytes);
  return left >= static_cast<double>(kv_used()) &&
         left >= config_->policy.min_kv_fraction * static_cast<double>(memory_);
}

int64_t SimDevice::KvCapacity(int model) const {
  if (!config_->policy.elastic()) {
    return residents_.empty()
               ? 0
               : (memory_ - weight_bytes()) / static_cast<int64_t>(residents_.size());
  }
  // Elastic: all but its own weights, once the other models have left.
  return memory_ - Spec(model).Part().weight_bytes() - Workspace(model);
}

int64_t SimDevice::Workspace(int model) const {
  if (!config_->policy.charge_workspace) return 0;
  const SimPolicy& p = config_->policy;
  return EngineWorkspaceBytes(Spec(model).Part(), p.max_batch_tokens, Spec(model).max_seqs,
                              {p.max_context, p.kv_block_tokens, p.gpu_sms});
}

void SimDevice::Report(v1::DeviceState* s, std::vector<v1::ResidentModel>* models) {
  const int64_t w = weight_bytes(), kv = kv_used();
  s->set_name(name_);
  s->set_memory_total_bytes(memory_);
  s->set_memory_used_bytes(w + kv);
  s->set_kv_bytes_used(kv);
  s->set_kv_bytes_free(memory_ - w - kv);
  if (Remapping()) s->set_kv_bytes_lendable(memory::LendableBytes(RemapCandidates()));
  s->set_queue_length(queue_length());
  s->set_elastic(config_->policy.elastic());
  int running = 0;
  for (const auto& r : residents_) {
    running += static_cast<int>(r.running.size());
    const SimModel& spec = Spec(r.model);
    s->add_resident_models(spec.name);
    v1::ResidentModel m;
    m.set_name(spec.name);
    m.set_device(name_);
    m.set_state(r.phase == ModelPhase::kLoading    ? v1::MODEL_STATE_LOADING
                : r.phase == ModelPhase::kDraining ? v1::MODEL_STATE_DRAINING
                                                   : v1::MODEL_STATE_READY);
    const ModelShape part = spec.Part();
    m.set_weight_bytes(part.weight_bytes());
    m.set_kv_bytes_per_token(part.kv_bytes_per_token());
    models->push_back(std::move(m));
  }
  s->set_running(running);
}

void SimDevice::Kick() {
  if (ending_) return;
  if (Rolling()) {
    RollUnstretch();
    // One model stepping alone: the node's loop is waiting on its step's
    // event and begins (or admits) nothing before that step ends.
    if (LoneStepInFlight()) {
      RollReschedule();
    } else {
      RollStart();
    }
    return;
  }
  if (!busy_) {
    StartIteration();
  } else if (decode_only_ && iterations_ > 1) {
    Cut();
  }
}

bool SimDevice::Fits(const Resident& res, int64_t bytes, int64_t total_kv) const {
  const int64_t room = memory_ - weight_bytes();
  if (!config_->policy.elastic()) {
    return res.kv_used + bytes <= room / static_cast<int64_t>(residents_.size());
  }
  return total_kv + bytes <= room;
}

void SimDevice::Admit() {
  // Rolling: a model with a step in flight admits at its next boundary;
  // with ahead steps, when a step begins, for the step after it (the node
  // plans that one at once).
  const bool rolling = Rolling();
  const double now = events_->now();
  // A model whose step begins now plans the one after (the node's ahead
  // plan), unless it drains (Resident::drain).
  auto ahead_plan = [&](const Resident& res) {
    return rolling && res.step.on && StepsAhead(res) && res.step.start == now;
  };
  auto flying = [&](int model) {
    const Resident* res = Find(model);
    return rolling && res != nullptr && res->step.on && (!ahead_plan(*res) || res->step.no_follow);
  };
  std::vector<node_manager::PendingRequest> reqs;
  std::map<uint64_t, SimRequest*> by_id;
  std::vector<uint64_t> order;  // kv_paged: preempted requests first, as queued
  bool any = false;             // a request whose model admits now
  for (SimRequest* r : pending_) {
    const ModelPhase p = phase(r->model);
    if (p != ModelPhase::kReady && p != ModelPhase::kDraining) continue;
    by_id[static_cast<uint64_t>(r->index)] = r;
    any = any || !flying(r->model);
    if (r->requeued) {
      order.push_back(static_cast<uint64_t>(r->index));
      continue;
    }
    const double cost_s = costs_[r->model].PredictMs(PrefillEnd(*r) - r->prefilled) / 1e3;
    reqs.push_back({static_cast<uint64_t>(r->index), r->release, r->deadline, cost_s, r->prompt});
  }
  if (!any) {
    if (reqs.empty() && hooks_.arbitration) NoteDecision({}, {}, {});  // those admitted left
    return;
  }
  // The requests are copied only when their decision is recorded.
  std::vector<node_manager::PendingRequest> logged;
  if (hooks_.arbitration) logged = reqs;
  const node_manager::Arbitration a = node_manager::Arbitrate(
      config_->policy.arbitration, std::move(reqs), events_->now(),
      {256, config_->policy.max_batch_tokens}, {}, config_->policy.promote_after_slo);
  if (hooks_.arbitration) NoteDecision(logged, a.order, by_id);
  order.insert(order.end(), a.order.begin(), a.order.end());
  const bool elastic = config_->policy.elastic();
  int64_t total_kv = kv_used();
  // Static, and kv_paged: models whose next request does not fit.
  std::set<int> blocked;
  std::map<int, int> budget;  // kv_paged: tokens left in a model's next step
  std::set<SimRequest*> admitted;
  for (uint64_t id : order) {
    SimRequest* r = by_id.at(id);
    if (blocked.count(r->model) || flying(r->model)) continue;
    Resident* res = Find(r->model);
    if (static_cast<int>(res->running.size()) >= Spec(r->model).max_seqs) continue;
    const bool tp = Spec(r->model).tp > 1;
    const bool paged = Paged(r->model);
    int take = 0;
    // paged: a block for the next step of each request running on the GPU,
    // whichever model's (any of them may preempt a newcomer to grow).
    int64_t watermark = 0;
    if (paged) {
      // One that could not fit even with no KV in use (only once another
      // model's weights leave) waits without blocking its model: admitted,
      // it would only grow into preempting itself, again and again.
      if (BlocksBytes(r->model, r->prompt + r->output) > memory_ - weight_bytes()) continue;
      auto [left, fresh] = budget.try_emplace(r->model, 0);
      if (fresh) left->second = config_->policy.max_batch_tokens - StepTokens(*res);
      if (left->second <= 0) {
        blocked.insert(r->model);
        continue;
      }
      take = std::min(PrefillEnd(*r) - SessionPrefix(*r), left->second);
      watermark = GrowthWatermark();
    }
    const int64_t bytes = AdmitBytes(*r, take);
    bool fits = Fits(*res, bytes + watermark, total_kv);
    // The memory ladder's next rung: remapped layers (idle session KV
    // already counts as free).
    if (!fits && Remapping()) {
      if (ahead_plan(*res) && !config_->policy.ahead_admissions_lend) {
        // Asks nobody (Resident::drain): it waits for the model's next plan.
        res->drain = true;
        blocked.insert(r->model);
        continue;
      }
      fits = LendFor(*res, bytes + watermark, total_kv);
    }
    if (!fits || (tp && hooks_.group_fits && !hooks_.group_fits(r->model, r->kv_bytes))) {
      if (!fits) {
        NoteKvWait(r);
        r->kv_refused = true;
      }
      // Elastic: the first request that does not fit stops admission,
      // unless it cannot fit even with no KV in use (only once another
      // model's weights leave): it waits without blocking the others.
      // kv_paged: it stops its own model's admissions.
      if (elastic && !paged && r->kv_bytes <= memory_ - weight_bytes()) break;
      if (!elastic || paged) blocked.insert(r->model);
      continue;
    }
    if (r->admitted < 0) r->admitted = events_->now();
    r->kv_refused = false;
    TakeSession(r);
    r->requeued = false;
    r->admit_order = ++admit_clock_;
    if (paged) budget[r->model] -= take;
    res->running.push_back(r);
    r->kv_held = bytes;
    res->kv_used += bytes;
    total_kv += bytes;
    if (tp && hooks_.group_kv) hooks_.group_kv(r->model, r->kv_bytes);
    admitted.insert(r);
  }
  std::erase_if(pending_, [&](SimRequest* r) { return admitted.count(r) > 0; });
  if (!admitted.empty()) ShedSessions();
}

void SimDevice::NoteDecision(const std::vector<node_manager::PendingRequest>& reqs,
                             const std::vector<uint64_t>& order,
                             const std::map<uint64_t, SimRequest*>& requests) {
  // As the node's DeviceWorker::Arbitrate: times from now, each request's
  // predicted start the costs of those before it in the order.
  const double now = events_->now();
  std::map<uint64_t, const node_manager::PendingRequest*> by_id;
  for (const auto& p : reqs) by_id[p.id] = &p;
  std::vector<node_manager::ArbitrationEntry> entries;
  double t = 0;
  for (uint64_t id : order) {
    const node_manager::PendingRequest& p = *by_id.at(id);
    const SimRequest& r = *requests.at(id);
    const node_manager::PrefillCostModel& fit = costs_[r.model];
    node_manager::ArbitrationEntry e;
    e.id = absl::StrCat(r.index);
    e.model = Spec(r.model).name;
    e.tokens = p.tokens;
    e.arrival_s = p.arrival_s - now;
    e.start_s = t;
    e.deadline_s = p.deadline_s - now;
    e.cost_s = p.cost_s;
    t += p.cost_s;
    e.late = t > e.deadline_s;
    e.kv_refused = r.kv_refused;
    e.fit_intercept_ms = fit.intercept_ms();
    e.fit_ms_per_token = fit.ms_per_token();
    e.fit_steps = fit.samples();
    entries.push_back(std::move(e));
  }
  const int64_t kv_free = memory_ - weight_bytes() - kv_used();
  for (const node_manager::ArbitrationEvent& ev : decisions_.Decide(now, entries)) {
    hooks_.arbitration(now, ev, kv_free);
  }
}

StepWork SimDevice::WorkOf(const Resident& res, int* k, std::vector<Chunk>* chunks) {
  StepWork w;
  for (const SimRequest* r : res.running) {
    if (r->prefilled < PrefillEnd(*r) || r->sits_out) continue;
    ++w.decode_tokens;
    w.decode_context += r->prompt + r->generated;
    *k = std::min(*k, r->output - r->generated);
  }
  int budget = config_->policy.max_batch_tokens - w.decode_tokens;
  for (SimRequest* r : res.running) {
    if (r->prefilled >= PrefillEnd(*r) || r->sits_out || budget <= 0) continue;
    const int n = std::min(budget, PrefillEnd(*r) - r->prefilled);
    const bool last = n == PrefillEnd(*r) - r->prefilled;  // its last token is sampled
    chunks->push_back({r, n});
    budget -= n;
    if (n == 1 && last) {  // a decode row, as the engine plans it (engine/batch_planner.cc)
      ++w.decode_tokens;
      w.decode_context += PrefillEnd(*r);
      continue;
    }
    w.prefill_tokens += n;
    w.prefill_attention += PrefillAttentionPairs(n, r->prefilled);
    if (last) ++w.prefill_logits;
  }
  return w;
}

int64_t SimDevice::TpSteps(int model) const {
  const Resident* res = Find(model);
  return res == nullptr ? 0 : res->tp_steps;
}

bool SimDevice::PlanResident(Resident* res, StepWork* w, int* k, std::vector<Chunk>* chunks) {
  if (res->shadow) {
    // One part step per step the leader started, with the work of its last.
    if (!hooks_.lead_steps || hooks_.lead_steps(res->model) <= res->tp_steps) return false;
    *w = hooks_.lead_work(res->model);
    ++res->tp_steps;
  } else {
    if (res->running.empty()) return false;
    const bool tp = Spec(res->model).tp > 1 && hooks_.members_steps;
    if (tp && hooks_.members_steps(res->model) < res->tp_steps) return false;  // lockstep
    *w = WorkOf(*res, k, chunks);
    // Every running request sat out (a plan made ahead found no room for
    // any): no step, as the node launches none.
    if (w->decode_tokens + w->prefill_tokens == 0) return false;
    res->last_active = ++active_clock_;  // MRU order among remapping's donors
    if (!tp) return true;
    ++res->tp_steps;
    res->tp_work = *w;
  }
  *k = 1;
  if (hooks_.stepped) {
    const int model = res->model;
    events_->At(events_->now(), [this, model] { hooks_.stepped(model); });
  }
  return w->decode_tokens + w->prefill_tokens > 0;
}

StepWork SimDevice::LastTpWork(int model) const {
  const Resident* res = Find(model);
  return res == nullptr ? StepWork{} : res->tp_work;
}

bool SimDevice::AdmissionMayChange() const {
  // A stretch skips the admission checks of the steps inside it: only when
  // no queued request's model serves, or the order cannot change with time
  // (fcfs, edf: a request that does not fit now still heads the queue).
  const auto policy = config_->policy.arbitration;
  if (policy == node_manager::ArbitrationPolicy::kFcfs ||
      policy == node_manager::ArbitrationPolicy::kEdf) {
    return false;
  }
  return std::any_of(pending_.begin(), pending_.end(), [&](const SimRequest* r) {
    const ModelPhase p = phase(r->model);
    return p == ModelPhase::kReady || p == ModelPhase::kDraining;
  });
}

void SimDevice::CreditDecodes(Resident* res, int steps) {
  for (SimRequest* r : res->running) {
    if (r->prefilled >= PrefillEnd(*r) && !r->sits_out) r->generated += steps;
  }
}

void SimDevice::RecordStep(const Resident& res, double start, double end, int steps,
                           const StepWork& w) const {
  if (!hooks_.step) return;
  SimStepRecord rec;
  rec.model = res.model;
  rec.start_s = start;
  rec.end_s = end;
  rec.steps = steps;
  rec.work = w;
  rec.running = static_cast<int>(res.running.size());
  rec.waiting =
      static_cast<int>(std::count_if(pending_.begin(), pending_.end(),
                                     [&](const SimRequest* r) { return r->model == res.model; }));
  rec.kv_bytes = res.kv_used;
  rec.lent_layers = res.lent.alpha;
  for (const Resident& r : residents_) rec.device_lent += r.lent.alpha;
  hooks_.step(rec);
}

void SimDevice::Finish(Resident* res, SimRequest* r) {
  r->end = events_->now();
  res->kv_used -= r->kv_held;
  r->kv_held = 0;
  KeepSession(*res, *r);
  if (Spec(r->model).tp > 1 && hooks_.group_kv) hooks_.group_kv(r->model, -r->kv_bytes);
  std::erase(res->running, r);
  hooks_.done(r);
}

void SimDevice::RemoveDrained() {
  std::vector<int> gone;
  for (const Resident& r : residents_) {
    if (r.phase == ModelPhase::kDraining && !Busy(r.model)) gone.push_back(r.model);
  }
  if (gone.empty()) return;
  // Rolling: a shadow may leave with its part step on the GPU; the others
  // share it from now.
  if (Rolling()) RollAdvance();
  if (Remapping()) RemapAccrue();  // a leaving model's lent layers leave with it
  for (int m : gone) {
    std::erase_if(residents_, [&](const Resident& r) { return r.model == m; });
    DropSessions(m);
  }
  for (int m : gone) hooks_.drained(m);
  // Freed weights may let queued requests in. Rolling, as any new work:
  // a lone model's step is waited for (the node finishes every step in
  // flight before it closes a retiring engine) and a stretch is cut.
  if (ending_) return;
  if (Rolling()) {
    Kick();
  } else if (!busy_) {
    StartIteration();
  }
}

}  // namespace ballast::sim
