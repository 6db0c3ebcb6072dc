// SimDevice's lockstep iterations (sim_device.h's rules: rolling_steps
// false, or overlap_steps false): one iteration steps every model, and
// decode stretches of iterations run in one event.
#include <algorithm>
#include <climits>
#include <cmath>
#include <map>
#include <vector>

#include "sim/sim_device.h"

namespace ballast::sim {

double SimDevice::PlanIteration(bool* decode_only) {
  chunks_.clear();
  // solo: the longest of a streaming model's launch, wait and work alone.
  double work = 0, latency = 0, serial = 0, delta = 0, solo = 0;
  int k = INT_MAX, stepped = 0;
  for (Resident& res : residents_) {
    StepWork w;
    res.stepped = PlanResident(&res, &w, &k, &chunks_);
    if (!res.stepped) continue;
    res.step.w = w;  // for RecordStep (the rest of `step` is rolling's)
    const SimModel& spec = Spec(res.model);
    const double step = TpStepSeconds(*engine_, config_->policy, spec, w);
    const double share = w.prefill_tokens == 0 ? config_->policy.lockstep_overlap_share : 0.0;
    const double lat = engine_->OverlappedSeconds(spec.Part(), w, share, step);
    // Remapping: the wait for copies its compute does not hide, before
    // its work (the other models' work goes on meanwhile).
    const double stall = RemapStall(&res, step);
    if (w.prefill_tokens == 0) ObserveDecode(&res, step);  // T_c: the model's own step
    if (stall > 0) solo = std::max(solo, step + stall);
    serial += step + stall;
    work += step - lat;
    latency = std::max(latency, lat);
    StepWork next = w;
    next.decode_context += w.decode_tokens;
    delta += TpStepSeconds(*engine_, config_->policy, spec, next) - step;
    ++stepped;
  }
  const double host = config_->policy.step_host_s;
  const double t = config_->policy.overlap_steps ? std::max(solo, latency + work) + host
                                                 : serial + host * stepped;
  *decode_only = chunks_.empty();
  if (*decode_only && (Lending() || AdmissionMayChange())) k = 1;
  if (k == INT_MAX) k = 1;  // no decode among the stepped (prefills starved of budget)
  iterations_ = *decode_only ? std::max(k, 1) : 1;
  if (iterations_ > 1) {  // kv_paged: the iterations whose blocks fit
    std::vector<const Resident*> stepping;
    for (const Resident& res : residents_) {
      if (res.stepped) stepping.push_back(&res);
    }
    iterations_ = StretchFits(stepping, iterations_);
  }
  t0_ = t;
  delta_ = *decode_only ? delta : 0;
  stepped_ = stepped;
  return stepped > 0 ? t : -1;
}

void SimDevice::StartIteration() {
  RemapStep();
  if (CopyPaused()) return;  // the device idle: its resume event starts the next
  // kv_paged: every model's running requests grow first (the engine's
  // PlanRunning before PlanAdmissions), so no request of this iteration's
  // plan is preempted after it was planned.
  for (Resident& res : residents_) GrowKv(&res);
  Admit();
  bool decode_only = false;
  if (PlanIteration(&decode_only) < 0) {
    busy_ = false;
    RemoveDrained();
    RemapIdle();
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
    // Not stepped: a tensor-parallel model waiting for its group.
    if (!res.stepped) continue;
    CreditDecodes(&res, decode_only_ ? iterations : 1);
    SyncHeld(&res);  // a stretch's blocks, as written
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
    if (c.r->prefilled == PrefillEnd(*c.r)) {
      if (c.r->first_token < 0) c.r->first_token = now;
      c.r->generated = c.r->recompute + 1;  // after a preemption, the next token
    }
  }
  chunks_.clear();
  if (hooks_.step) {
    for (const Resident& res : residents_) {
      if (res.stepped) RecordStep(res, start_, now, decode_only_ ? iterations : 1, res.step.w);
    }
  }
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

}  // namespace ballast::sim
