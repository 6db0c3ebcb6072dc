// SimDevice's session KV (sim_device.h's rules under "Session KV"): the KV
// of finished turns and Advise prefetches kept on the GPU in memory that
// weights and running requests leave, given back by the node's memory
// ladder (memory::PlanKvShedding).
#include <algorithm>
#include <string>
#include <vector>

#include "memory/memory_ladder.h"
#include "sim/sim_device.h"

namespace ballast::sim {

bool SimDevice::KeepsSessions(int model) const {
  return config_->policy.session_kv != SessionKv::kRecompute && Spec(model).tp == 1;
}

const CachedSession* SimDevice::Cached(int session, int model) const {
  auto it = sessions_.find(session);
  return it == sessions_.end() || it->second.model != model ? nullptr : &it->second;
}

void SimDevice::EraseSession(std::map<int, CachedSession>::iterator it) {
  session_bytes_ -= it->second.bytes;
  sessions_.erase(it);
}

void SimDevice::KeepSession(const Resident& res, const SimRequest& r) {
  if (r.session < 0 || res.phase == ModelPhase::kDraining || !KeepsSessions(r.model)) return;
  if (auto it = sessions_.find(r.session); it != sessions_.end()) EraseSession(it);
  // Every token but the last generated one (never fed), as the engine
  // keeps (model_engine_step.cc); the rest of the reservation is freed.
  const int tokens = r.prompt + r.output - 1;
  const int64_t bytes = static_cast<int64_t>(tokens) * Spec(r.model).Part().kv_bytes_per_token();
  sessions_[r.session] = {r.model, tokens, bytes, ++session_recency_};
  session_bytes_ += bytes;
}

int SimDevice::SessionPrefix(const SimRequest& r) const {
  if (r.requeued || r.session < 0 || r.history <= 0) return 0;
  int reused = 0;
  if (const CachedSession* c = Cached(r.session, r.model); c != nullptr) {
    reused = std::min(c->tokens, r.history);
  } else if (r.lease_tokens > 0) {
    reused = std::min(r.lease_tokens, r.history);
  }
  return std::min(reused, r.prompt - 1);
}

void SimDevice::TakeSession(SimRequest* r) {
  if (r->requeued) {  // preempted: the engine recomputes everything
    r->prefilled = 0;
    return;
  }
  r->origin = KvOrigin::kNone;
  r->reused = 0;
  if (r->session < 0 || r->history <= 0) return;
  auto it = sessions_.find(r->session);
  if (it != sessions_.end() && it->second.model == r->model) {
    r->origin = it->second.prefetch ? KvOrigin::kAdvised : KvOrigin::kDevice;
    r->reused = std::min(it->second.tokens, r->history);
    EraseSession(it);  // its bytes are now part of the request's reservation
  } else if (r->lease_tokens > 0) {
    r->origin = r->lease_origin;
    r->reused = std::min(r->lease_tokens, r->history);
  } else {
    r->origin = KvOrigin::kRecomputed;
  }
  // At least one token is computed (logits need one): the prompt has new ones.
  r->prefilled = std::min(r->reused, r->prompt - 1);
}

bool SimDevice::CanPrefetch(int model) const {
  const Resident* res = Find(model);
  return res != nullptr && res->phase == ModelPhase::kReady && !res->shadow && KeepsSessions(model);
}

bool SimDevice::Prefetch(int session, int model, int tokens, int64_t bytes, double ready_at,
                         double expires) {
  if (!CanPrefetch(model)) return false;
  const Resident* res = Find(model);
  const int64_t room =
      !config_->policy.elastic()
          ? (memory_ - weight_bytes()) / static_cast<int64_t>(residents_.size()) - res->kv_used
          : memory_ - weight_bytes() - kv_used();
  if (bytes > room) return false;
  if (auto it = sessions_.find(session); it != sessions_.end()) EraseSession(it);
  sessions_[session] = {model, tokens, bytes, ++session_recency_, true, ready_at, expires};
  session_bytes_ += bytes;
  ShedSessions();  // others give way: it is the most recent
  return true;
}

void SimDevice::ExpirePrefetch(int session, double expires) {
  auto it = sessions_.find(session);
  if (it == sessions_.end() || !it->second.prefetch || it->second.expires != expires) return;
  ++session_counters_.prefetch_expired;
  EraseSession(it);
}

void SimDevice::ShedSessions() {
  if (sessions_.empty()) return;
  if (config_->policy.elastic()) {
    ShedFrom(-1, weight_bytes() + kv_used() + session_bytes_ - memory_);
    return;
  }
  const int64_t share = (memory_ - weight_bytes()) / static_cast<int64_t>(residents_.size());
  for (const Resident& res : residents_) {
    int64_t kept = 0;
    for (const auto& [s, c] : sessions_) kept += c.model == res.model ? c.bytes : 0;
    ShedFrom(res.model, res.kv_used + kept - share);
  }
}

void SimDevice::ShedFrom(int model, int64_t over) {
  if (over <= 0) return;
  std::vector<memory::KvHolder> holders;
  std::vector<int> ids;
  for (const auto& [s, c] : sessions_) {
    if (model >= 0 && c.model != model) continue;
    holders.push_back({memory::KvHolder::Kind::kIdleSession,
                       c.model,
                       std::to_string(s),
                       0,
                       c.recency,
                       c.bytes,
                       {}});
    ids.push_back(s);
  }
  for (size_t i : memory::PlanKvShedding(holders, over)) {
    auto it = sessions_.find(ids[i]);
    ++session_counters_.shed;
    if (it->second.prefetch) ++session_counters_.prefetch_shed;
    EraseSession(it);
  }
}

void SimDevice::DropSessions(int model) {
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    if (it->second.model != model) {
      ++it;
      continue;
    }
    ++session_counters_.unloaded;
    session_bytes_ -= it->second.bytes;
    it = sessions_.erase(it);
  }
}

}  // namespace ballast::sim
