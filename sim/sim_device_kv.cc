// SimDevice's KV held block by block (policy.kv_paged), as the daemon's
// engine holds it (engine/batch_planner.cc, node_manager's ReclaimFor):
//  * Admission reserves the blocks of the request's first step only: the
//    tokens its session's KV covers plus a chunk of at most what the
//    model's next step has left of max_batch_tokens (none left: the model
//    admits no more now), and only while the blocks of one more step for
//    each request running on the GPU, of any model, stay free beside them
//    (the KV manager's watermark: any of them may preempt the newcomer to
//    grow). A model's first request that does not fit
//    stops that model's admissions; the other models go on (each engine
//    admits from its own queue in the arbitration's order).
//  * Growth: before a model plans a step, its running requests, oldest
//    first, grow their blocks to that step's tokens (a decode: its
//    context; a prefill: its next chunk, within the step's budget). Where
//    that does not fit (idle session KV counting as free, then remapped
//    layers), the GPU's running requests of other models admitted after
//    this model's newest give theirs back, lowest priority and newest
//    first, as far as the shortfall; then this model's newest, and so on
//    until it fits or the growing request was the one preempted (the
//    model's pass ends).
//  * Ahead steps: as a model begins a step, the node plans the next one at
//    once, and that plan's running requests take their blocks then where
//    they fit, preempting nobody (ReserveAhead); another model admitting
//    before that next step begins sees them held.
//  * A preempted request frees all its blocks and waits again, ahead of
//    the arbitration's order (admitted first); it then prefills its prompt
//    and the output it had generated (its session's KV is not reused) and
//    samples its next token. Its first token's time stays the first one.
//  * A decode stretch runs only as many steps as its blocks fit, and its
//    requests hold the blocks they wrote when it ends or is cut.
//  * A victim's steps in flight (rolling, policy.growth_waits_for_victims,
//    the daemon's DrainVictims): where the next victim's model has a step
//    in flight, the growing model begins nothing and the device's loop
//    waits (victim_drain_): the steps already queued on the GPU (each
//    model's ahead step) begin, planning none after them, and no other
//    step is planned or admitted until that model's steps have ended. Its
//    requests keep those steps' tokens, and the growth then plans again
//    (the room may have come from requests that ended). Growth that
//    queued steps take meanwhile preempts at once (the daemon's ahead
//    plans ask nobody; such growth is the simulator's own).
#include <algorithm>
#include <climits>
#include <map>

#include "sim/sim_device.h"

namespace ballast::sim {

bool SimDevice::Paged(int model) const { return config_->policy.kv_paged && Spec(model).tp == 1; }

int64_t SimDevice::BlockBytes(int model) const {
  return static_cast<int64_t>(config_->policy.kv_block_tokens) *
         Spec(model).Part().kv_bytes_per_token();
}

int64_t SimDevice::BlocksBytes(int model, int tokens) const {
  const int64_t b = config_->policy.kv_block_tokens;
  return (tokens + b - 1) / b * BlockBytes(model);
}

int64_t SimDevice::GrowthWatermark() const {
  int64_t bytes = 0;
  for (const Resident& o : residents_) {
    if (!o.shadow && Paged(o.model)) {
      bytes += static_cast<int64_t>(o.running.size()) * BlockBytes(o.model);
    }
  }
  return bytes;
}

int64_t SimDevice::AdmitBytes(const SimRequest& r, int take) const {
  if (!Paged(r.model)) return r.kv_bytes;
  return BlocksBytes(r.model, std::min(PrefillEnd(r), SessionPrefix(r) + take));
}

int SimDevice::StepTokens(const Resident& res) const {
  // A step in flight has computed its chunks already (the engine advances
  // a sequence as it launches a step; an ahead plan sees that).
  std::map<const SimRequest*, int> flying;
  if (res.step.on) {
    for (const Chunk& c : res.step.chunks) flying[c.r] += c.tokens;
  }
  int tokens = 0;
  for (const SimRequest* r : res.running) {
    auto it = flying.find(r);
    const int done = r->prefilled + (it == flying.end() ? 0 : it->second);
    tokens += done >= PrefillEnd(*r) ? 1 : PrefillEnd(*r) - done;
  }
  return std::min(tokens, config_->policy.max_batch_tokens);
}

int SimDevice::StepKvTokens(const SimRequest& r, int budget, int* take) {
  const bool decoding = r.prefilled >= PrefillEnd(r);
  *take = decoding ? 1 : std::min(PrefillEnd(r) - r.prefilled, budget);
  // A decode writes the KV of its last sampled token: prompt + generated.
  return decoding ? r.prompt + r.generated : r.prefilled + *take;
}

bool SimDevice::HoldIfFits(Resident* res, SimRequest* r, int tokens, bool* took) {
  const int64_t need = BlocksBytes(res->model, tokens) - r->kv_held;
  if (need <= 0) return true;
  if (!Fits(*res, need, kv_used())) return false;
  r->kv_held += need;
  res->kv_used += need;
  *took = true;
  return true;
}

bool SimDevice::GrowKv(Resident* res) {
  if (!Paged(res->model) || res->shadow) return true;
  int budget = config_->policy.max_batch_tokens;
  for (size_t i = 0; i < res->running.size() && budget > 0; ++i) {
    SimRequest* r = res->running[i];
    int take = 0;
    const int tokens = StepKvTokens(*r, budget, &take);
    const Grown g = Reserve(res, r, tokens);
    if (g == Grown::kWaits) {
      victim_drain_.for_ = res->model;
      victim_drain_.since = events_->now();
      ++kv_counters_.victim_drains;
      return false;
    }
    if (g == Grown::kPreempted) break;  // r was the newest: the rest went before it
    budget -= take;
  }
  return true;
}

bool SimDevice::GrowAhead(Resident* res) {
  if (!Paged(res->model) || res->shadow) return false;
  int budget = config_->policy.max_batch_tokens;
  bool out = false, took = false;
  for (SimRequest* r : res->running) {
    if (budget <= 0) break;
    int take = 0;
    if (!HoldIfFits(res, r, StepKvTokens(*r, budget, &take), &took)) {
      r->sits_out = out = true;
      continue;
    }
    budget -= take;
  }
  if (took) ShedSessions();  // idle sessions' KV counted as free: it gives way
  return out;
}

bool SimDevice::WaitsForSteps(const Resident& owner) const {
  return Rolling() && growth_may_wait_ && config_->policy.growth_waits_for_victims && owner.step.on;
}

void SimDevice::ReserveAhead(Resident* res) {
  if (!Paged(res->model) || res->shadow || !res->step.on) return;
  std::map<const SimRequest*, int> flying;  // the step just begun computes these
  for (const Chunk& c : res->step.chunks) flying[c.r] += c.tokens;
  int budget = config_->policy.max_batch_tokens;
  bool took = false;
  for (SimRequest* r : res->running) {
    if (budget <= 0) break;
    auto it = flying.find(r);
    const int f = it == flying.end() ? 0 : it->second;
    const int done = r->prefilled + f;
    int tokens = 0, take = 1;
    if (r->prefilled >= PrefillEnd(*r)) {
      if (r->generated + 1 >= r->output) continue;  // its last token comes now: left out
      tokens = r->prompt + r->generated + 1;        // the next token's KV
    } else if (done >= PrefillEnd(*r)) {
      if (r->recompute + 1 >= r->output) continue;  // its prompt's token is its last
      tokens = PrefillEnd(*r) + 1;                  // its first token's KV
    } else {
      take = std::min(PrefillEnd(*r) - done, budget);
      tokens = done + take;
    }
    if (!HoldIfFits(res, r, tokens, &took)) continue;  // the ahead plan asks nobody
    budget -= take;
  }
  if (took) ShedSessions();  // idle sessions' KV counted as free: it gives way
}

SimDevice::Grown SimDevice::Reserve(Resident* res, SimRequest* r, int tokens) {
  const int64_t need = BlocksBytes(res->model, tokens) - r->kv_held;
  if (need <= 0) return Grown::kHeld;
  auto fits = [&] {
    if (!Fits(*res, need, kv_used()) && !(Remapping() && LendFor(*res, need, kv_used()))) {
      return false;
    }
    r->kv_held += need;
    res->kv_used += need;
    ShedSessions();  // idle sessions' KV counted as free: it gives way
    return true;
  };
  while (true) {
    if (fits()) return Grown::kHeld;
    SimRequest* own = res->running.back();
    for (auto v = NewerVictim(res, own->admit_order); v.second != nullptr;
         v = NewerVictim(res, own->admit_order)) {
      if (WaitsForSteps(*v.first)) {
        victim_drain_.of = v.first->model;
        return Grown::kWaits;
      }
      Preempt(v.first, v.second);
      if (fits()) return Grown::kHeld;
    }
    Preempt(res, own);
    if (own == r) return Grown::kPreempted;
  }
}

std::pair<SimDevice::Resident*, SimRequest*> SimDevice::NewerVictim(const Resident* res,
                                                                    int64_t than) {
  std::pair<Resident*, SimRequest*> best{nullptr, nullptr};
  if (!config_->policy.elastic()) return best;  // static: each model its own share
  for (Resident& o : residents_) {
    if (&o == res || o.shadow || !Paged(o.model)) continue;
    for (SimRequest* v : o.running) {
      if (v->admit_order <= than) continue;
      const SimRequest* b = best.second;
      if (b == nullptr || v->priority < b->priority ||
          (v->priority == b->priority && v->admit_order > b->admit_order)) {
        best = {&o, v};
      }
    }
  }
  return best;
}

void SimDevice::Preempt(Resident* owner, SimRequest* v) {
  ++kv_counters_.preemptions;
  kv_counters_.recomputed_tokens +=
      v->prefilled >= PrefillEnd(*v) ? v->prompt + v->generated - 1 : v->prefilled;
  owner->kv_used -= v->kv_held;
  v->kv_held = 0;
  std::erase(owner->running, v);
  v->sits_out = false;
  // A step in flight that carried its chunk no longer advances it.
  std::erase_if(owner->step.chunks, [&](const Chunk& c) { return c.r == v; });
  std::erase_if(chunks_, [&](const Chunk& c) { return c.r == v; });
  v->recompute = v->generated;
  v->prefilled = 0;
  ++v->preemptions;
  v->requeued = true;
  pending_.insert(pending_.begin(), v);
}

int64_t SimDevice::StretchBytes(const Resident& res, int j) const {
  int64_t bytes = 0;
  if (!Paged(res.model) || res.shadow) return 0;
  for (const SimRequest* r : res.running) {
    if (r->prefilled < PrefillEnd(*r)) continue;  // not decoding: no chunk this stretch
    bytes +=
        std::max<int64_t>(0, BlocksBytes(res.model, r->prompt + r->generated + j - 1) - r->kv_held);
  }
  return bytes;
}

int SimDevice::StretchFits(const std::vector<const Resident*>& stepping, int k) const {
  if (k <= 1 || !config_->policy.kv_paged) return k;
  const int64_t room = memory_ - weight_bytes();
  auto fit = [&](int j) {
    if (config_->policy.elastic()) {
      int64_t extra = 0;
      for (const Resident* res : stepping) extra += StretchBytes(*res, j);
      return kv_used() + extra <= room;
    }
    const int64_t share = room / static_cast<int64_t>(residents_.size());
    return std::all_of(stepping.begin(), stepping.end(), [&](const Resident* res) {
      return res->kv_used + StretchBytes(*res, j) <= share;
    });
  };
  int lo = 1, hi = k;  // one step's blocks are held (GrowKv)
  while (lo < hi) {
    const int mid = lo + (hi - lo + 1) / 2;
    if (fit(mid)) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

void SimDevice::SyncHeld(Resident* res) {
  if (!Paged(res->model) || res->shadow) return;
  for (SimRequest* r : res->running) {
    if (r->prefilled < PrefillEnd(*r)) continue;
    // The KV written: every token but the last one sampled.
    const int64_t grow = BlocksBytes(res->model, r->prompt + r->generated - 1) - r->kv_held;
    if (grow <= 0) continue;
    r->kv_held += grow;
    res->kv_used += grow;
  }
}

}  // namespace ballast::sim
