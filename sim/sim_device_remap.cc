// SimDevice's parameter remapping (sim_device.h's rules under "Parameter
// remapping"; the figures in sim_remap.h): the daemon's RemapController
// (node_manager/remap_controller.cc) on the simulated GPU, its decisions
// by memory/remap_plan.h's own functions.
#include <algorithm>
#include <vector>

#include "memory/remap_plan.h"
#include "sim/sim_device.h"

namespace ballast::sim {
namespace {

// The daemon's RemapController::Tick cadence (node_manager/device_worker*.cc):
// lockstep, before every pass of DeviceWorker::Loop, which waits 50 ms when
// idle; rolling, at most every 100 ms (kRemapTickEvery).
constexpr double kIdleLoopS = 0.05;
constexpr double kRollingTickS = 0.1;

}  // namespace

bool SimDevice::Remapping() const {
  return config_->policy.remap.enabled && config_->policy.elastic();
}

const RemapTimings& SimDevice::Timings(int model) {
  auto it = timings_.find(model);
  if (it == timings_.end()) {
    it = timings_.emplace(model, TimingsOf(*engine_, config_->policy, Spec(model))).first;
  }
  return it->second;
}

bool SimDevice::Lending() const {
  return std::any_of(residents_.begin(), residents_.end(),
                     [](const Resident& r) { return r.lent.alpha > 0; });
}

bool SimDevice::KvWaiting() const {
  const int64_t kv = kv_used();
  return std::any_of(pending_.begin(), pending_.end(), [&](const SimRequest* r) {
    const ModelPhase p = phase(r->model);
    if (p != ModelPhase::kReady && p != ModelPhase::kDraining) return false;
    const Resident* res = Find(r->model);
    return res != nullptr && !Fits(*res, AdmitBytes(*r, config_->policy.max_batch_tokens), kv);
  });
}

std::vector<memory::RemapCandidate> SimDevice::RemapCandidates() {
  std::vector<memory::RemapCandidate> out;
  for (size_t i = 0; i < residents_.size(); ++i) {
    const Resident& res = residents_[i];
    memory::RemapCandidate c;
    c.owner = static_cast<int>(i);
    c.alpha = res.lent.alpha;
    // Only a serving single-GPU model has layers to lend (a loading one
    // has no engine yet; tensor-parallel parts are left out).
    const bool lends = !res.shadow && Spec(res.model).tp == 1 &&
                       (res.phase == ModelPhase::kReady || res.phase == ModelPhase::kDraining);
    if (lends) {
      const RemapTimings& t = Timings(res.model);
      c.active = Busy(res.model);
      c.last_active = res.last_active;
      c.alpha_cap = RemapCap(t, config_->policy.remap, c.active);
      c.layer_bytes = t.layer_bytes;
    }
    out.push_back(c);
  }
  return out;
}

int64_t SimDevice::Lend(int64_t shortfall) {
  last_shortfall_ = events_->now();
  if (shortfall <= 0) return 0;
  const std::vector<memory::RemapCandidate> cands = RemapCandidates();
  const std::vector<int> target = memory::PlanRemap(cands, shortfall);
  RemapAccrue();
  int64_t freed = 0;
  for (size_t i = 0; i < residents_.size(); ++i) {
    if (target[i] <= cands[i].alpha) continue;
    Resident& res = residents_[i];
    // As the controller: the timing constraint only for a busy model.
    const bool respect = config_->policy.remap.respect_timing && cands[i].active;
    memory::StreamingPlan plan = PlanFor(Timings(res.model), target[i], respect);
    if (plan.alpha == 0) continue;  // SetAlpha's FAILED_PRECONDITION: nothing changes
    freed += static_cast<int64_t>(target[i] - cands[i].alpha) * cands[i].layer_bytes;
    res.lent = std::move(plan);
    res.lent_respect = respect;
    ++remap_counters_.remap_events;
    int& most = remap_counters_.max_alpha[res.model];
    most = std::max(most, res.lent.alpha);
  }
  if (freed < shortfall) ++remap_counters_.capped_events;
  int64_t lent = 0;
  for (const Resident& res : residents_) {
    if (res.lent.alpha > 0) lent += res.lent.alpha * LayerBytes(Spec(res.model).Part());
  }
  remap_counters_.max_lent_bytes = std::max(remap_counters_.max_lent_bytes, lent);
  return freed;
}

bool SimDevice::LendFor(const Resident& res, int64_t bytes, int64_t total_kv) {
  Lend(total_kv + bytes - (memory_ - weight_bytes()));
  return Fits(res, bytes, total_kv);
}

void SimDevice::RemapStep() {
  if (!Remapping() || !Lending()) return;
  if (Rolling()) {
    if (events_->now() - remap_ticked_ < kRollingTickS) return;
    remap_ticked_ = events_->now();
  }
  RemapTick();
}

void SimDevice::RemapIdle() {
  if (!Remapping() || !Lending() || (hooks_.outstanding && !hooks_.outstanding())) return;
  const uint64_t v = ++remap_wake_;
  const double period = Rolling() ? kRollingTickS : kIdleLoopS;
  events_->At(events_->now() + period, [this, v] {
    // A step boundary ticks for a GPU stepping (RemapStep).
    const bool stepping = Rolling() ? std::any_of(residents_.begin(), residents_.end(),
                                                  [](const Resident& r) { return r.step.on; })
                                    : busy_;
    if (v != remap_wake_ || stepping) return;
    RemapTick();
    RemapIdle();
  });
}

void SimDevice::RemapTick() {
  if (!Remapping() || !Lending()) return;
  const double now = events_->now();
  // A queued request that does not fit is a shortfall too (admission,
  // which would lend for it, is skipped while its model steps).
  if (KvWaiting()) last_shortfall_ = now;
  const std::vector<memory::RemapCandidate> cands = RemapCandidates();
  // A model lending more than its cap now allows (an idle lender that got
  // requests) goes first, with no quiet time; else the reverse donor
  // order once no shortfall was seen for revert_after_s.
  int next = -1;
  for (size_t i = 0; i < cands.size() && next < 0; ++i) {
    if (cands[i].alpha > cands[i].alpha_cap) next = static_cast<int>(i);
  }
  const bool over = next >= 0;
  if (next < 0) {
    const double quiet = config_->policy.remap.revert_after_s;
    if (now - last_shortfall_ < quiet) return;
    next = memory::RevertNext(cands);
  }
  if (next < 0) return;
  Resident& res = residents_[static_cast<size_t>(next)];
  const RemapTimings& t = Timings(res.model);
  // Over its cap (the daemon's forced revert): back to the cap at once;
  // else one layer.
  const int target = over ? cands[static_cast<size_t>(next)].alpha_cap : res.lent.alpha - 1;
  const int64_t need = (res.lent.alpha - target) * t.layer_bytes;
  auto free = [&] { return memory_ - weight_bytes() - kv_used() - session_bytes_; };
  // kv_paged, over its cap: the other models' newest running requests
  // give their KV back for the layers (DeviceWorker::MakeRoomForWeights,
  // sparing the model taking them back; idle sessions' KV counts as free
  // here already).
  bool forced = false;
  while (over && free() < need) {
    const auto v = NewerVictim(&res, -1);
    if (v.second == nullptr) break;
    Preempt(v.first, v.second);
    forced = true;
  }
  // The layers' bytes must be free: beside weights, running and kept KV.
  if (free() < need) return;
  memory::StreamingPlan plan = PlanFor(t, target, res.lent_respect);
  if (target > 0 && plan.alpha == 0) return;  // no plan for that many
  RemapAccrue();
  res.lent = std::move(plan);
  ++remap_counters_.revert_events;
  if (forced) ++remap_counters_.forced_reverts;
}

double SimDevice::RemapStall(const Resident& res, double step_s) {
  if (res.lent.alpha <= 0) return 0;
  const RemapTimings& t = Timings(res.model);
  const double stall = StreamingStall(t, res.lent, step_s);
  ++remap_counters_.streamed_steps;
  remap_counters_.streamed_bytes += CopiesPerStep(res.lent) * t.layer_bytes;
  remap_counters_.stall_s += stall;
  return stall;
}

void SimDevice::RemapAccrue() {
  const double now = events_->now();
  const double dt = now - remap_at_;
  remap_at_ = now;
  if (dt <= 0) return;
  for (const Resident& res : residents_) {
    if (res.lent.alpha > 0) remap_counters_.layer_seconds[res.model] += res.lent.alpha * dt;
  }
}

RemapCounters SimDevice::remap_counters() const {
  RemapCounters c = remap_counters_;
  const double dt = events_->now() - remap_at_;
  for (const Resident& res : residents_) {
    if (res.lent.alpha > 0 && dt > 0) c.layer_seconds[res.model] += res.lent.alpha * dt;
  }
  return c;
}

void SimDevice::NoteKvWait(SimRequest* r) {
  if (r->kv_waited) return;
  r->kv_waited = true;
  ++remap_counters_.kv_wait_requests;
}

}  // namespace ballast::sim
