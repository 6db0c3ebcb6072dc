// SimDevice's parameter remapping (sim_device.h's rules under "Parameter
// remapping"; the figures in sim_remap.h): the daemon's RemapController
// (node_manager/remap_controller.cc) on the simulated GPU, its decisions
// by memory/remap_plan.h's own functions.
#include <algorithm>
#include <utility>
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

RemapTimings SimDevice::TimingsNow(const Resident& res) {
  RemapTimings t = Timings(res.model);
  double best = 0;
  for (double tc : res.tc_recent) {
    if (tc > 0) best = best > 0 ? std::min(best, tc) : tc;
  }
  if (best > 0) t.t_compute = best;
  t.t_compute *= res.stall_fix.factor;
  return t;
}

void SimDevice::ObserveDecode(Resident* res, double seconds) {
  // As WeightRemapper::ObserveForward: streaming steps are not sampled.
  if (!Remapping() || res->lent.alpha > 0 || seconds <= 0) return;
  const int layers = Spec(res->model).Part().layers;
  if (layers <= 0) return;
  res->tc_recent[res->tc_next] = seconds / layers;
  res->tc_next = (res->tc_next + 1) % res->tc_recent.size();
}

std::vector<double> SimDevice::LinkShares(double* total) {
  std::vector<double> own(residents_.size(), 0.0);
  *total = 0;
  for (size_t i = 0; i < residents_.size(); ++i) {
    const Resident& res = residents_[i];
    // Only a busy model steps, so only its copies take the link.
    if (res.lent.alpha <= 0 || !Busy(res.model)) continue;
    const RemapTimings t = TimingsNow(res);
    own[i] = memory::LinkShare(t.layers, res.lent, t.t_transfer, t.t_compute);
    *total += own[i];
  }
  return own;
}

std::vector<memory::RemapCandidate> SimDevice::RemapCandidates(std::vector<double>* others) {
  double total = 0;
  const std::vector<double> own = LinkShares(&total);
  if (others != nullptr) others->assign(residents_.size(), 0.0);
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
      const RemapTimings t = TimingsNow(res);
      c.active = Busy(res.model);
      c.last_active = res.last_active;
      c.alpha_cap = RemapCap(t, config_->policy.remap, c.active, total - own[i]);
      c.layer_bytes = t.layer_bytes;
      if (others != nullptr) (*others)[i] = total - own[i];
    }
    out.push_back(c);
  }
  return out;
}

int64_t SimDevice::Lend(int64_t shortfall) {
  last_shortfall_ = events_->now();
  if (shortfall <= 0) return 0;
  RemapAccrue();
  int64_t freed = 0;
  std::vector<bool> asked(residents_.size(), false);
  // As RemapController::Lend: one donor at a time, each asked once, the
  // caps computed again after each (a busy donor's copies take link time
  // from the next).
  while (freed < shortfall) {
    std::vector<double> others;
    std::vector<memory::RemapCandidate> cands = RemapCandidates(&others);
    for (size_t i = 0; i < cands.size(); ++i) {
      if (asked[i]) cands[i].alpha_cap = std::min(cands[i].alpha_cap, cands[i].alpha);
    }
    const std::vector<int> target = memory::PlanRemap(cands, shortfall - freed);
    size_t i = cands.size();
    for (size_t d : memory::DonorOrder(cands)) {
      if (target[d] > cands[d].alpha) {
        i = d;
        break;
      }
    }
    if (i == cands.size()) break;
    asked[i] = true;
    Resident& res = residents_[i];
    // As the controller: the timing constraint only for a busy model.
    const bool respect = config_->policy.remap.respect_timing && cands[i].active;
    memory::StreamingPlan plan = PlanFor(TimingsNow(res), target[i], respect, others[i]);
    if (plan.alpha == 0) continue;  // SetAlpha's FAILED_PRECONDITION: nothing changes
    freed += static_cast<int64_t>(target[i] - cands[i].alpha) * cands[i].layer_bytes;
    res.lent = std::move(plan);
    res.stall_fix.Restart();
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
  if (!Remapping() || !Lending() || events_->now() < paused_until_) return;
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
  // The idle loop's next pass: after a revert's copies, if they end later.
  const double at = std::max(events_->now() + period, paused_until_);
  events_->At(at, [this, v] {
    // A step boundary ticks for a GPU stepping (RemapStep).
    if (v != remap_wake_ || AnyStepOn()) return;
    RemapTick();
    RemapIdle();
  });
}

void SimDevice::RemapTick() {
  if (!Remapping() || !Lending()) return;
  const double now = events_->now();
  // The daemon's loop is copying a revert's layers: no tick till it ends.
  if (now < paused_until_) return;
  // A queued request that does not fit is a shortfall too (admission,
  // which would lend for it, is skipped while its model steps).
  if (KvWaiting()) last_shortfall_ = now;
  std::vector<double> others;
  const std::vector<memory::RemapCandidate> cands = RemapCandidates(&others);
  // A model lending more than its cap now allows (an idle lender that got
  // requests, or the link oversubscribed) goes first, with no quiet time;
  // else the reverse donor order once no shortfall was seen for
  // revert_after_s.
  // Several over: the furthest past its cap first (ties: the reverse of
  // donor order), as the controller.
  int next = -1, excess = 0;
  const std::vector<size_t> order = memory::DonorOrder(cands);
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    if (cands[*it].alpha - cands[*it].alpha_cap > excess) {
      excess = cands[*it].alpha - cands[*it].alpha_cap;
      next = static_cast<int>(*it);
    }
  }
  const bool over = next >= 0;
  if (next < 0) {
    const double quiet = config_->policy.remap.revert_after_s;
    if (now - last_shortfall_ < quiet) return;
    next = memory::RevertNext(cands);
  }
  if (next < 0) return;
  Resident& res = residents_[static_cast<size_t>(next)];
  const RemapTimings t = TimingsNow(res);
  // Over its cap (the daemon's forced revert): back to the cap at once;
  // else one layer.
  const int target = over ? cands[static_cast<size_t>(next)].alpha_cap : res.lent.alpha - 1;
  const int64_t need = (res.lent.alpha - target) * t.layer_bytes;
  auto free = [&] { return memory_ - weight_bytes() - kv_used() - session_bytes_; };
  // kv_paged, over its cap: running requests give their KV back for the
  // layers, the other models' newest first, then the model's own
  // (DeviceWorker::MakeRoomForWeights; idle sessions' KV counts as free
  // here already).
  bool forced = false;
  for (const Resident* skip :
       {static_cast<const Resident*>(&res), static_cast<const Resident*>(nullptr)}) {
    while (over && free() < need) {
      const auto v = NewerVictim(skip, -1);
      if (v.second == nullptr) break;
      Preempt(v.first, v.second);
      forced = true;
    }
  }
  // The layers' bytes must be free: beside weights, running and kept KV.
  if (free() < need) return;
  memory::StreamingPlan plan =
      PlanFor(t, target, res.lent_respect, others[static_cast<size_t>(next)]);
  if (target > 0 && plan.alpha == 0) return;  // no plan for that many
  RemapAccrue();
  const int back = res.lent.alpha - plan.alpha;
  res.lent = std::move(plan);
  res.stall_fix.Restart();
  QuiesceForCopies(back * t.t_transfer);
  ++remap_counters_.revert_events;
  if (forced) ++remap_counters_.forced_reverts;
}

bool SimDevice::AnyStepOn() const {
  if (!Rolling()) return busy_;
  return std::any_of(residents_.begin(), residents_.end(),
                     [](const Resident& r) { return r.step.on; });
}

void SimDevice::QuiesceForCopies(double seconds) {
  if (seconds <= 0) return;
  copies_due_s_ += seconds;
  CopyPaused();  // an idle device copies at once
}

bool SimDevice::CopyPaused() {
  const double now = events_->now();
  if (copies_due_s_ > 0 && !AnyStepOn()) {
    ++remap_counters_.copy_pauses;
    remap_counters_.copy_s += copies_due_s_;
    paused_until_ = std::max(paused_until_, now) + std::exchange(copies_due_s_, 0.0);
    events_->At(paused_until_, [this] { Kick(); });
  }
  return copies_due_s_ > 0 || now < paused_until_;
}

double SimDevice::RemapStall(Resident* res, double step_s) {
  if (res->lent.alpha <= 0) return 0;
  const RemapTimings t = TimingsNow(*res);
  double total = 0;
  const std::vector<double> own = LinkShares(&total);
  const auto i = static_cast<size_t>(res - residents_.data());
  const double stall = StreamingStall(t, res->lent, step_s, total - own[i]);
  // The daemon's share: the stall over the forward it lengthened.
  if (step_s + stall > 0) res->stall_fix.Observe(stall / (step_s + stall));
  ++remap_counters_.streamed_steps;
  remap_counters_.streamed_bytes += memory::CopiesPerStep(res->lent) * t.layer_bytes;
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
