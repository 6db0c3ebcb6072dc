#include "sim/sim_device.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <map>
#include <set>

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
  return false;
}

void SimDevice::LoadShadow(int model) {
  residents_.push_back(Resident{model, ModelPhase::kLoading, {}, 0, /*shadow=*/true});
}

bool SimDevice::ShadowFits(int model, int64_t bytes) const {
  const Resident* r = Find(model);
  return r != nullptr && Fits(*r, bytes, kv_used());
}

void SimDevice::TakeShadowKv(int model, int64_t bytes) {
  Resident* r = Find(model);
  if (r == nullptr) return;
  r->kv_used += bytes;
  if (bytes > 0) Kick();  // its steps start (or a decode stretch is cut)
}

void SimDevice::Ready(int model) {
  if (Resident* r = Find(model); r != nullptr && r->phase == ModelPhase::kLoading) {
    r->phase = ModelPhase::kReady;
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
  int64_t w = 0;
  for (const auto& r : residents_) w += Spec(r.model).Part().weight_bytes();
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
  if (config_->policy.memory_mode == "static") {
    return residents_.empty()
               ? 0
               : (memory_ - weight_bytes()) / static_cast<int64_t>(residents_.size());
  }
  // Elastic: all but its own weights, once the other models have left.
  return memory_ - Spec(model).Part().weight_bytes();
}

void SimDevice::Report(v1::DeviceState* s, std::vector<v1::ResidentModel>* models) const {
  const int64_t w = weight_bytes(), kv = kv_used();
  s->set_name(name_);
  s->set_memory_total_bytes(memory_);
  s->set_memory_used_bytes(w + kv);
  s->set_kv_bytes_used(kv);
  s->set_kv_bytes_free(memory_ - w - kv);
  s->set_queue_length(queue_length());
  s->set_elastic(config_->policy.memory_mode != "static");
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
  if (!busy_) {
    StartIteration();
  } else if (decode_only_ && iterations_ > 1) {
    Cut();
  }
}

bool SimDevice::Fits(const Resident& res, int64_t bytes, int64_t total_kv) const {
  const int64_t room = memory_ - weight_bytes();
  if (config_->policy.memory_mode == "static") {
    return res.kv_used + bytes <= room / static_cast<int64_t>(residents_.size());
  }
  return total_kv + bytes <= room;
}

void SimDevice::Admit() {
  std::vector<node_manager::PendingRequest> reqs;
  std::map<uint64_t, SimRequest*> by_id;
  for (SimRequest* r : pending_) {
    const ModelPhase p = phase(r->model);
    if (p != ModelPhase::kReady && p != ModelPhase::kDraining) continue;
    const double cost_s = costs_[r->model].PredictMs(r->prompt - r->prefilled) / 1e3;
    reqs.push_back({static_cast<uint64_t>(r->index), r->release, r->deadline, cost_s, r->prompt});
    by_id[static_cast<uint64_t>(r->index)] = r;
  }
  if (reqs.empty()) return;
  const node_manager::Arbitration a =
      node_manager::Arbitrate(config_->policy.arbitration, std::move(reqs), events_->now(),
                              {256, config_->policy.max_batch_tokens});
  const bool elastic = config_->policy.memory_mode != "static";
  int64_t total_kv = kv_used();
  std::set<int> blocked;  // static: models whose next request does not fit
  std::set<SimRequest*> admitted;
  for (uint64_t id : a.order) {
    SimRequest* r = by_id.at(id);
    if (blocked.count(r->model)) continue;
    Resident* res = Find(r->model);
    if (static_cast<int>(res->running.size()) >= Spec(r->model).max_seqs) continue;
    const bool tp = Spec(r->model).tp > 1;
    if (!Fits(*res, r->kv_bytes, total_kv) ||
        (tp && hooks_.group_fits && !hooks_.group_fits(r->model, r->kv_bytes))) {
      // Elastic: the first request that does not fit stops admission,
      // unless it cannot fit even with no KV in use (only once another
      // model's weights leave): it waits without blocking the others.
      if (elastic && r->kv_bytes <= memory_ - weight_bytes()) break;
      if (!elastic) blocked.insert(r->model);
      continue;
    }
    r->admitted = events_->now();
    res->running.push_back(r);
    res->kv_used += r->kv_bytes;
    total_kv += r->kv_bytes;
    if (tp && hooks_.group_kv) hooks_.group_kv(r->model, r->kv_bytes);
    admitted.insert(r);
  }
  std::erase_if(pending_, [&](SimRequest* r) { return admitted.count(r) > 0; });
}

StepWork SimDevice::WorkOf(const Resident& res, int* k) {
  StepWork w;
  for (const SimRequest* r : res.running) {
    if (r->prefilled < r->prompt) continue;
    ++w.decode_tokens;
    w.decode_context += r->prompt + r->generated;
    *k = std::min(*k, r->output - r->generated);
  }
  int budget = config_->policy.max_batch_tokens - w.decode_tokens;
  for (SimRequest* r : res.running) {
    if (r->prefilled >= r->prompt || budget <= 0) continue;
    const int n = std::min(budget, r->prompt - r->prefilled);
    chunks_.push_back({r, n});
    w.prefill_tokens += n;
    w.prefill_attention += PrefillAttentionPairs(n, r->prefilled);
    budget -= n;
  }
  return w;
}

int64_t SimDevice::TpSteps(int model) const {
  const Resident* res = Find(model);
  return res == nullptr ? 0 : res->tp_steps;
}

bool SimDevice::PlanResident(Resident* res, StepWork* w, int* k) {
  if (res->shadow) {
    // One part step per step the leader started, with the work of its last.
    if (!hooks_.lead_steps || hooks_.lead_steps(res->model) <= res->tp_steps) return false;
    *w = hooks_.lead_work(res->model);
    ++res->tp_steps;
  } else {
    if (res->running.empty()) return false;
    const bool tp = Spec(res->model).tp > 1 && hooks_.members_steps;
    if (tp && hooks_.members_steps(res->model) < res->tp_steps) return false;  // lockstep
    *w = WorkOf(*res, k);
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

double SimDevice::PlanIteration(bool* decode_only) {
  chunks_.clear();
  double work = 0, latency = 0, serial = 0, delta = 0;
  int k = INT_MAX, stepped = 0;
  for (Resident& res : residents_) {
    StepWork w;
    res.stepped = PlanResident(&res, &w, &k);
    if (!res.stepped) continue;
    const SimModel& spec = Spec(res.model);
    const double step = TpStepSeconds(*engine_, config_->policy, spec, w);
    const double lat = std::min(step, engine_->LatencySeconds(spec.Part()));
    serial += step;
    work += step - lat;
    latency = std::max(latency, lat);
    StepWork next = w;
    next.decode_context += w.decode_tokens;
    delta += TpStepSeconds(*engine_, config_->policy, spec, next) - step;
    ++stepped;
  }
  const double host = config_->policy.step_host_s;
  const double t = config_->policy.overlap_steps ? latency + work + host : serial + host * stepped;
  *decode_only = chunks_.empty();
  // A stretch skips the admission checks of the steps inside it: only when
  // no queued request's model serves, or the order cannot change with time
  // (fcfs, edf: a request that does not fit now still heads the queue).
  const auto policy = config_->policy.arbitration;
  const bool static_order = policy == node_manager::ArbitrationPolicy::kFcfs ||
                            policy == node_manager::ArbitrationPolicy::kEdf;
  if (*decode_only && !static_order) {
    for (const SimRequest* r : pending_) {
      const ModelPhase p = phase(r->model);
      if (p == ModelPhase::kReady || p == ModelPhase::kDraining) k = 1;
    }
  }
  iterations_ = *decode_only ? std::max(k, 1) : 1;
  t0_ = t;
  delta_ = *decode_only ? delta : 0;
  stepped_ = stepped;
  return stepped > 0 ? t : -1;
}

void SimDevice::StartIteration() {
  Admit();
  bool decode_only = false;
  if (PlanIteration(&decode_only) < 0) {
    busy_ = false;
    RemoveDrained();
    return;
  }
  busy_ = true;
  decode_only_ = decode_only;
  start_ = events_->now();
  const uint64_t v = ++version_;
  const int k = iterations_;
  const double end = start_ + k * t0_ + delta_ * k * (k - 1) / 2.0;
  events_->At(end, [this, v, k] { EndIteration(v, k); });
}

void SimDevice::Cut() {
  const double elapsed = events_->now() - start_;
  // Smallest j >= 1 with j * t0 + delta * j (j - 1) / 2 >= elapsed.
  auto cum = [&](int j) { return j * t0_ + delta_ * j * (j - 1) / 2.0; };
  int j = 1;
  if (delta_ > 0) {
    const double b = t0_ - delta_ / 2;
    j = static_cast<int>(std::ceil((-b + std::sqrt(b * b + 2 * delta_ * elapsed)) / delta_));
  } else if (t0_ > 0) {
    j = static_cast<int>(std::ceil(elapsed / t0_));
  }
  j = std::max(j, 1);
  while (j > 1 && cum(j - 1) >= elapsed) --j;
  while (cum(j) < elapsed) ++j;
  if (j >= iterations_) return;
  iterations_ = j;
  const uint64_t v = ++version_;
  events_->At(start_ + cum(j), [this, v, j] { EndIteration(v, j); });
}

void SimDevice::EndIteration(uint64_t version, int iterations) {
  if (version != version_) return;
  const double now = events_->now();
  for (Resident& res : residents_) {
    if (!res.stepped) continue;  // a tensor-parallel model waiting for its group
    for (SimRequest* r : res.running) {
      if (r->prefilled >= r->prompt) r->generated += decode_only_ ? iterations : 1;
    }
  }
  // The node's prefill cost model: each model's prefill tokens in this
  // iteration against the iteration's whole time.
  std::map<int, int> prefill_tokens;
  for (const Chunk& c : chunks_) prefill_tokens[c.r->model] += c.tokens;
  for (const auto& [model, tokens] : prefill_tokens) {
    costs_[model].Record(tokens, (now - start_) * 1e3);
  }
  for (const Chunk& c : chunks_) {
    c.r->prefilled += c.tokens;
    if (c.r->prefilled == c.r->prompt) {
      c.r->first_token = now;
      c.r->generated = 1;
    }
  }
  chunks_.clear();
  model_steps_ += static_cast<int64_t>(stepped_) * iterations;
  std::vector<std::pair<Resident*, SimRequest*>> done;
  for (Resident& res : residents_) {
    for (SimRequest* r : res.running) {
      if (r->generated >= r->output) done.emplace_back(&res, r);
    }
  }
  ending_ = true;
  for (auto& [res, r] : done) Finish(res, r);
  ending_ = false;
  busy_ = false;
  RemoveDrained();
  if (!busy_) StartIteration();
}

void SimDevice::Finish(Resident* res, SimRequest* r) {
  r->end = events_->now();
  res->kv_used -= r->kv_bytes;
  if (Spec(r->model).tp > 1 && hooks_.group_kv) hooks_.group_kv(r->model, -r->kv_bytes);
  std::erase(res->running, r);
  hooks_.done(r);
}

void SimDevice::RemoveDrained() {
  std::vector<int> gone;
  for (const Resident& r : residents_) {
    if (r.phase == ModelPhase::kDraining && !Busy(r.model)) gone.push_back(r.model);
  }
  for (int m : gone) {
    std::erase_if(residents_, [&](const Resident& r) { return r.model == m; });
  }
  for (int m : gone) hooks_.drained(m);
  // Freed weights may let queued requests in.
  if (!gone.empty() && !busy_ && !ending_) StartIteration();
}

}  // namespace ballast::sim
