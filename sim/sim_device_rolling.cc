// SimDevice's rolling steps (sim_device.h's rules: rolling_steps with
// overlap_steps): each model steps at its own pace, and the steps whose
// work is on the GPU share it (processor sharing).
//
// The shared clock: a step on the GPU with weight g (its work to the
// power policy.rolling_share_exponent, times policy.rolling_skinny_weight
// for a decode-only step of at most rolling_skinny_rows rows) gets g / G
// of the GPU, G the sum of the weights on it (a step of the other kind,
// decode-only against one with prefill chunks, counted at
// policy.rolling_cross_weight). Each kind's served_ grows by dt / its G,
// so a step that joins with work w when its kind's served_ is v is done
// when that reaches v + w / g: one event per step end, whatever joins or
// leaves meanwhile.
#include <algorithm>
#include <climits>
#include <cmath>
#include <limits>
#include <utility>

#include "sim/sim_device.h"

namespace ballast::sim {
namespace {

// Service left below which a step counts as done (the rounding of the
// shared clock: far below any step's time).
constexpr double kServedEps = 1e-9;

// Time the first j steps of a stretch take.
double Cum(double t0, double delta, int j) { return j * t0 + delta * j * (j - 1) / 2.0; }

// The most steps of a stretch (at most n) whose time is within `elapsed`.
int StepsWithin(double t0, double delta, int n, double elapsed) {
  int j = 0;
  if (delta > 0) {
    const double b = t0 - delta / 2;
    j = static_cast<int>(std::floor((-b + std::sqrt(b * b + 2 * delta * elapsed)) / delta));
  } else if (t0 > 0) {
    j = static_cast<int>(std::floor(elapsed / t0));
  }
  j = std::clamp(j, 0, n);
  while (j < n && Cum(t0, delta, j + 1) <= elapsed) ++j;
  while (j > 0 && Cum(t0, delta, j) > elapsed) --j;
  return j;
}

}  // namespace

double SimDevice::Sharing(int kind) const {
  const double cross = config_->policy.rolling_cross_weight;
  double g = 0;
  for (const Resident& r : residents_) {
    const Step& s = r.step;
    if (s.on && s.joined) g += s.kind == kind ? s.weight : cross * s.weight;
  }
  return g;
}

void SimDevice::RollAdvance() {
  const double now = events_->now();
  for (int kind = 0; kind < 2; ++kind) {
    const double g = Sharing(kind);
    if (g > 0) served_[kind] += (now - served_at_) / g;
  }
  served_at_ = now;
}

void SimDevice::RollJoin(Step* s, double left) {
  s->joined = true;
  const SimPolicy& p = config_->policy;
  const bool skinny = s->w.prefill_tokens == 0 && s->w.decode_tokens <= p.rolling_skinny_rows;
  s->weight = std::pow(s->work, p.rolling_share_exponent) * (skinny ? p.rolling_skinny_weight : 1);
  s->kind = s->w.prefill_tokens > 0 ? 1 : 0;
  s->finish = served_[s->kind] + (left > 0 ? left / s->weight : 0);
}

bool SimDevice::LoneStepInFlight() const {
  // A step begun at this very instant: the loop has not blocked on it yet
  // (work that came at the same time is looked at together). A GPU with a
  // tensor-parallel part keeps the old rule (the node runs no tensor
  // parallelism): a part's step is never held behind another model's.
  const double now = events_->now();
  int on = 0, before = 0;
  for (const Resident& r : residents_) {
    if (r.shadow || Spec(r.model).tp > 1) return false;
    on += r.step.on ? 1 : 0;
    before += r.step.on && r.step.start < now ? 1 : 0;
  }
  return on == 1 && before == 1;
}

bool SimDevice::StepsAhead(const Resident& res) const {
  return Rolling() && config_->policy.ahead_steps && !res.shadow && Spec(res.model).tp == 1 &&
         res.lent.alpha == 0;
}

void SimDevice::SitIn(Resident* res) {
  for (SimRequest* r : res->running) r->sits_out = false;
}

bool SimDevice::VictimDrainHolds() {
  if (victim_drain_.of < 0) return false;
  // The steps queued behind those that ended begin: they are on the GPU's
  // streams already. The loop, waiting, plans none after them, and their
  // growth asks no one to wait (the daemon's ahead plans ask nobody).
  growth_may_wait_ = false;
  int k = INT_MAX, began = 0;
  Resident* last = nullptr;
  BeginQueuedSteps(&k, &began, &last);
  growth_may_wait_ = true;
  const Resident* of = Find(victim_drain_.of);
  if (of != nullptr && of->step.on) return true;
  kv_counters_.victim_drain_s += events_->now() - victim_drain_.since;
  victim_drain_ = {};
  return false;
}

void SimDevice::BeginQueuedSteps(int* k, int* began, Resident** last) {
  // Ahead steps: a model whose step just ended begins the one planned
  // while it ran, from the requests admitted before; this boundary's
  // admissions go to the step after (the node plans that one now).
  const bool holding = victim_drain_.of >= 0;
  for (Resident& res : residents_) {
    if (res.step.on || (holding && res.model == victim_drain_.for_) ||
        !std::exchange(res.step.follows, false)) {
      continue;
    }
    // kv_paged: the running requests' blocks for this step; planned
    // ahead, the node's plan asked nobody.
    const bool out = config_->policy.ahead_growth_asks_nobody && GrowAhead(&res);
    if (!config_->policy.ahead_growth_asks_nobody && !GrowKv(&res)) {
      res.step.follows = true;  // begins once the victims' steps have ended
      return;
    }
    if (RollBegin(&res, k, /*ahead=*/true)) {
      ++*began;
      *last = &res;
    } else {
      SitIn(&res);  // nothing to step: it plans afresh
    }
    // The node plans the next one now, unless its last plan drained or
    // its loop waits for a victim's steps.
    res.step.no_follow = res.step.on && (holding || res.drain || out);
    if (!res.step.no_follow) ReserveAhead(&res);
  }
}

void SimDevice::RollStart() {
  // A growth waits for a victim model's steps: the loop does nothing else.
  if (VictimDrainHolds()) {
    RollReschedule();
    return;
  }
  RemapStep();
  // A revert's copies: the steps in flight end, then the copies run alone.
  if (CopyPaused()) {
    RollReschedule();
    return;
  }
  int k = INT_MAX, began = 0, flying = 0;
  Resident* last = nullptr;
  auto begin = [&](Resident& res, bool ahead) {
    if (RollBegin(&res, &k, ahead)) {
      ++began;
      last = &res;
    }
  };
  auto held = [&] {  // a growth began to wait for a victim model's steps
    if (!VictimDrainHolds()) return false;
    RollReschedule();
    return true;
  };
  BeginQueuedSteps(&k, &began, &last);
  if (held()) return;
  // kv_paged: the models about to begin grow their running requests first
  // (the engine's PlanRunning before PlanAdmissions).
  for (Resident& res : residents_) {
    if (!res.step.on && !GrowKv(&res)) break;
  }
  if (held()) return;
  Admit();
  for (Resident& res : residents_) {
    if (!res.step.on) {
      begin(res, false);
      if (res.step.on) res.drain = false;  // planned with nothing in flight
      if (res.step.on && StepsAhead(res)) ReserveAhead(&res);
    }
    flying += res.step.on ? 1 : 0;
  }
  // One model alone, decodes only (none admitted for its next step): a
  // stretch until its next request ends (with ahead steps, from a step
  // whose host time the last one hid, as each of the stretch's steps
  // hides the next one's).
  const double host = config_->policy.step_host_s;
  auto decoding = [](const SimRequest* r) {
    return r->prefilled >= PrefillEnd(*r) && !r->sits_out;
  };
  if (began == 1 && flying == 1 && k > 1 && last->step.chunks.empty() &&
      std::all_of(last->running.begin(), last->running.end(), decoding) && !last->shadow &&
      Spec(last->model).tp == 1 && !Lending() && !AdmissionMayChange() &&
      (!StepsAhead(*last) ||
       (last->step.ahead && host <= std::min(last->step.last_s, last->step.t0)))) {
    k = StretchFits({last}, k);  // kv_paged: the steps whose blocks fit
    if (k > 1) RollStretch(last, k);
  }
  RollReschedule();
  if (flying == 0) {
    RemoveDrained();
    RemapIdle();
  }
}

bool SimDevice::RollBegin(Resident* res, int* k, bool ahead) {
  Step& s = res->step;
  s.chunks.clear();
  StepWork w;
  if (!PlanResident(res, &w, k, &s.chunks)) return false;
  const SimModel& spec = Spec(res->model);
  const double step = TpStepSeconds(*engine_, config_->policy, spec, w);
  // A decode-only step overlaps other models' steps further (the node's
  // share of the engine's measured concurrent overlap).
  const double share = w.prefill_tokens == 0 ? config_->policy.rolling_overlap_share : 0.0;
  const double lat = engine_->OverlappedSeconds(spec.Part(), w, share, step);
  // The host time before the step: an ahead step's ran beside the last
  // step (the node finishes one step and plans the next meanwhile).
  const double host =
      ahead ? std::max(0.0, config_->policy.step_host_s - s.last_s) : config_->policy.step_host_s;
  s.on = true;
  s.ahead = ahead;
  s.start = events_->now();
  // A step streaming lent layers waits for copies its compute does not
  // hide (remapping): the model waits, the GPU serves the others.
  s.delay = host + lat + RemapStall(res, step);
  s.work = step - lat;
  s.joined = false;
  s.w = w;
  s.n = 1;
  s.t0 = s.delay + s.work;
  s.delta = 0;
  return true;
}

void SimDevice::RollStretch(Resident* res, int k) {
  Step& s = res->step;
  const SimModel& spec = Spec(res->model);
  StepWork next = s.w;
  next.decode_context += s.w.decode_tokens;
  s.delta = TpStepSeconds(*engine_, config_->policy, spec, next) -
            TpStepSeconds(*engine_, config_->policy, spec, s.w);
  s.n = k;
}

void SimDevice::RollUnstretch() {
  const double now = events_->now();
  for (Resident& res : residents_) {
    Step& s = res.step;
    if (!s.on || s.n <= 1) continue;
    const int j = StepsWithin(s.t0, s.delta, s.n, now - s.start);
    if (j >= s.n) continue;  // it ends now: its event comes next
    CreditDecodes(&res, j);
    SyncHeld(&res);  // the blocks its j steps wrote
    if (j > 0) RecordStep(res, s.start, s.start + Cum(s.t0, s.delta, j), j, s.w);
    model_steps_ += j;
    const double last = s.t0 + (j - 1) * s.delta;  // step j - 1's time, if j > 0
    s.start += Cum(s.t0, s.delta, j);
    s.w.decode_context += static_cast<double>(j) * s.w.decode_tokens;
    s.work = s.t0 + j * s.delta - s.delay;  // step j's work alone
    s.n = 1;
    s.delta = 0;
    const double in = now - s.start;
    if (in <= 0) {  // at a boundary: the model begins its next step (and admits)
      s.on = false;
      s.follows = StepsAhead(res);
      if (j > 0) s.last_s = last;
      continue;
    }
    s.joined = false;
    if (in >= s.delay) {
      RollAdvance();  // nothing else was on the GPU: only moves served_at_
      RollJoin(&s, s.work - (in - s.delay));
    }
  }
}

void SimDevice::RollReschedule() {
  double next = std::numeric_limits<double>::infinity();
  const double g[2] = {Sharing(0), Sharing(1)};
  for (const Resident& r : residents_) {
    const Step& s = r.step;
    if (!s.on) continue;
    if (s.n > 1) {
      next = std::min(next, s.start + Cum(s.t0, s.delta, s.n));
    } else if (!s.joined) {
      next = std::min(next, s.start + s.delay);
    } else {
      next = std::min(next, served_at_ + std::max(0.0, s.finish - served_[s.kind]) * g[s.kind]);
    }
  }
  if (next == pending_at_) return;  // the event due then still stands
  const uint64_t v = ++version_;
  pending_at_ = next;
  if (std::isfinite(next)) events_->At(next, [this, v] { RollEvent(v); });
}

void SimDevice::RollEvent(uint64_t version) {
  if (version != version_) return;
  pending_at_ = -1;
  const double now = events_->now();
  RollAdvance();
  for (Resident& r : residents_) {
    Step& s = r.step;
    if (s.on && s.n == 1 && !s.joined && s.start + s.delay <= now) RollJoin(&s, s.work);
  }
  std::vector<int> ended;  // models, in resident order
  for (const Resident& r : residents_) {
    const Step& s = r.step;
    if (!s.on) continue;
    const bool done = s.n > 1 ? s.start + Cum(s.t0, s.delta, s.n) <= now
                              : s.joined && s.finish <= served_[s.kind] + kServedEps;
    if (done) ended.push_back(r.model);
  }
  std::vector<std::pair<Resident*, SimRequest*>> done;
  for (int m : ended) {
    Resident* res = Find(m);
    RollEnd(res);
    for (SimRequest* r : res->running) {
      if (r->generated >= r->output) done.emplace_back(res, r);
    }
  }
  ending_ = true;
  for (auto& [res, r] : done) Finish(res, r);
  RemoveDrained();
  ending_ = false;
  RollStart();
}

void SimDevice::RollEnd(Resident* res) {
  const double now = events_->now();
  Step& s = res->step;
  CreditDecodes(res, s.n);
  if (s.n > 1) SyncHeld(res);  // a stretch's blocks, as written
  // The node's prefill cost model: the model's prefill tokens in this step
  // against the step's whole time, begin to end.
  int tokens = 0;
  for (const Chunk& c : s.chunks) tokens += c.tokens;
  if (tokens > 0) costs_[res->model].Record(tokens, (now - s.start) * 1e3);
  for (const Chunk& c : s.chunks) {
    c.r->prefilled += c.tokens;
    if (c.r->prefilled == PrefillEnd(*c.r)) {
      if (c.r->first_token < 0) c.r->first_token = now;
      c.r->generated = c.r->recompute + 1;  // after a preemption, the next token
    }
  }
  s.chunks.clear();
  SitIn(res);
  RecordStep(*res, s.start, now, s.n, s.w);
  model_steps_ += s.n;
  s.follows = StepsAhead(*res) && !s.no_follow;
  s.no_follow = false;
  s.last_s = s.t0 + (s.n - 1) * s.delta;
  if (s.n == 1) s.last_s = now - s.start;
  // T_c's sample, as the daemon times a decode step alone on its stream
  // (not ahead): launch to end, beside the other models' steps.
  if (tokens == 0 && !s.ahead) ObserveDecode(res, s.last_s - config_->policy.step_host_s);
  s.on = false;
  s.joined = false;
  s.n = 1;
}

}  // namespace ballast::sim
