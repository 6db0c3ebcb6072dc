// The simulator's multi-turn sessions and their KV tiers
// (SimPolicy::session_kv), as the scheduler and the node run them.
//
// Rules (written once, here; the GPU's side is in sim_device.h, the
// node's DRAM and SSD in sim_kv_tiers.h):
//  * A session is the trace's session id. A turn's prompt is the
//    session's history (every finished turn's prompt and output tokens)
//    plus its own tokens, as the session directory sends it. A failed
//    turn leaves the history as it was.
//  * Affinity: a turn goes to the GPU of its session's last turn or
//    prefetch while that one is ready and can hold it (Simulator::
//    PickReplica); else as any request.
//  * On arrival at a GPU that keeps none of the session's KV, the node
//    reads a lease from its tiers (tiers only): the session's copy in
//    DRAM, else on SSD (promoted into DRAM); when the affinity GPU is on
//    another node whose tiers hold more of it, the rest comes from that
//    peer and is kept in this node's tiers. A copy is of one model's KV
//    (SimKvTiers): a turn never reads another model's. The turn is queued
//    once the lease has loaded: EngineModel::KvLoadSeconds of the local
//    read plus that of the peer's fetch, one after the other (the node's
//    KvTierStore::Acquire, then the fetch), as the node reads and verifies
//    a lease before it queues the request. A DRAM read moves a tensor-
//    parallel part's bytes on each GPU's own link; an SSD read and a
//    peer's fetch move the whole KV through the node's. A GPU
//    that keeps the KV reads no tier (as the node); a prefetch still
//    loading holds the turn until its load ends.
//  * At admission (SimDevice::TakeSession) the turn takes its session's
//    KV kept on the GPU, else its lease, else prefills its whole history
//    (recomputed); only the rest of the prompt is prefilled, at least one
//    token, with attention over the reused prefix.
//  * A finished turn's KV (prompt and output but the last generated
//    token, never fed, as the engine keeps) stays on its GPU
//    (sim_device.h; device and tiers, tp 1) and, with tiers, is written
//    through to its node's tiers (SimKvTiers::Put).
//  * Advise (an advisory with a session id; device and tiers): the
//    scheduler's rule (global_scheduler/scheduler_advise.cc). The GPU is
//    the session's affinity GPU if its model is ready there, else the
//    least loaded ready replica's. Nothing is done if the session has no
//    finished turn, its model differs, or the GPU keeps its KV already
//    (with tiers: no copy below either). Otherwise the lease is read as
//    on arrival and the KV moved onto the GPU (SimDevice::Prefetch; no
//    room: nothing; a tp > 1 model's GPUs keep none, so nothing is read
//    for it), usable once loaded, and dropped unused after the
//    advisory's expected arrival plus 30 s (2 min without one), the
//    scheduler's kAdviseGrace and kAdviseDefaultTtl. The GPU becomes the
//    session's affinity. Traces carry no Invalidate, so none is modelled.
#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "sim/simulator_impl.h"

namespace ballast::sim {
namespace {

constexpr double kAdviseGraceS = 30;        // scheduler_advise.cc's kAdviseGrace
constexpr double kAdviseDefaultTtlS = 120;  // ... and kAdviseDefaultTtl

const char* OriginName(KvOrigin o) {
  switch (o) {
    case KvOrigin::kNone:
      return "none";
    case KvOrigin::kDevice:
      return "device";
    case KvOrigin::kAdvised:
      return "advised";
    case KvOrigin::kDram:
      return "host_dram";
    case KvOrigin::kSsd:
      return "ssd";
    case KvOrigin::kPeer:
      return "peer";
    case KvOrigin::kRecomputed:
      return "recomputed";
  }
  return "none";
}

const char* TierName(KvTier t) {
  return t == KvTier::kDram ? "host_dram" : t == KvTier::kSsd ? "ssd" : "peer";
}

}  // namespace

int Simulator::SessionFor(const std::string& id) {
  auto [it, added] = session_index_.try_emplace(id, static_cast<int>(sessions_.size()));
  if (added) sessions_.emplace_back();
  return it->second;
}

void Simulator::Arrive(SimRequest* r, int d) {
  r->device = d;
  const double now = events_.now();
  if (r->session < 0 || r->history <= 0 || config_.policy.session_kv == SessionKv::kRecompute) {
    EnqueueAt(r, d, now);
    return;
  }
  const SimDevice& dev = *devices_[static_cast<size_t>(d)];
  if (const CachedSession* c = dev.Cached(r->session, r->model); c != nullptr) {
    const double t = c->prefetch ? std::max(now, c->ready_at) : now;
    r->load_s += t - now;
    EnqueueAt(r, d, t);
    return;
  }
  const Lease l = ReadLease(r->session, r->model, NodeOf(d), r->priority);
  r->lease_tokens = l.tokens;
  r->lease_origin = l.origin;
  r->load_s += l.seconds;
  stats_.sessions.lease_wait_s += l.seconds;
  EnqueueAt(r, d, now + l.seconds);
}

void Simulator::EnqueueAt(SimRequest* r, int d, double t) {
  auto enqueue = [this, r, d] {
    SimDevice& dev = *devices_[static_cast<size_t>(d)];
    if (dev.phase(r->model) == ModelPhase::kAbsent) {  // it left while the KV loaded
      Route(r);
      return;
    }
    ++changes_;  // the device's queue (and its model's busyness) changed
    dev.Enqueue(r);
  };
  if (t <= events_.now()) {
    enqueue();
  } else {
    events_.At(t, enqueue);
  }
}

Simulator::Lease Simulator::ReadLease(int session, int model, int node, int priority) {
  Lease l;
  const Session& s = sessions_[static_cast<size_t>(session)];
  if (!Tiers() || s.model != model || s.history <= 0) return l;
  const SimModel& spec = config_.models[static_cast<size_t>(model)];
  const int64_t part = spec.Part().kv_bytes_per_token(), full = spec.shape.kv_bytes_per_token();
  SessionKvStats& st = stats_.sessions;
  auto count = [&](KvTier tier, int tokens) {
    ++st.loads[TierName(tier)];
    st.loaded_bytes[TierName(tier)] += tokens * full;
    // DRAM: each GPU's link carries its part; SSD and peer: the node's, all.
    l.seconds += engine_.KvLoadSeconds(tier, tokens * (tier == KvTier::kDram ? part : full));
  };
  SimKvTiers& local = *tiers_[static_cast<size_t>(node)];
  const SimKvTiers::Held here = local.Read(session, model);
  if (here.tokens > 0) {
    const KvTier tier = here.in_dram ? KvTier::kDram : KvTier::kSsd;
    count(tier, here.tokens);
    l.tokens = here.tokens;
    l.origin = here.in_dram ? KvOrigin::kDram : KvOrigin::kSsd;
  }
  const int peer = s.device >= 0 ? NodeOf(s.device) : -1;
  if (peer < 0 || peer == node) return l;
  SimKvTiers& there = *tiers_[static_cast<size_t>(peer)];
  if (there.Find(session, model).tokens <= here.tokens) return l;
  const SimKvTiers::Held got = there.Read(session, model);
  count(KvTier::kPeer, got.tokens - here.tokens);
  local.Put(session, model, got.tokens, got.tokens * full, priority);
  l.tokens = got.tokens;
  l.origin = KvOrigin::kPeer;
  return l;
}

int Simulator::AdviseTarget(int session, int model) const {
  const std::vector<int>& replicas = models_[static_cast<size_t>(model)].devices;
  auto ready = [&](int d) {
    return devices_[static_cast<size_t>(d)]->phase(model) == ModelPhase::kReady;
  };
  const int a = sessions_[static_cast<size_t>(session)].device;
  if (a >= 0 && std::find(replicas.begin(), replicas.end(), a) != replicas.end() && ready(a)) {
    return a;
  }
  int best = -1, best_load = 0;
  for (int d : replicas) {
    if (!ready(d)) continue;
    const int load = NodeLoad(d);
    if (best < 0 || load < best_load || (load == best_load && d < best)) {
      best = d;
      best_load = load;
    }
  }
  return best;
}

void Simulator::Advise(int i) {
  const bench::TraceRecord& rec = trace_[static_cast<size_t>(i)];
  SessionKvStats& st = stats_.sessions;
  ++st.advisories;
  auto it = session_index_.find(rec.session);
  const int s = it == session_index_.end() ? -1 : it->second;
  if (s < 0 || sessions_[static_cast<size_t>(s)].history <= 0) {
    ++st.advise_no_kv;  // no finished turn yet: nothing to move
    return;
  }
  Session& ses = sessions_[static_cast<size_t>(s)];
  const int m = ses.model;
  if (!rec.model.empty() && config_.models[static_cast<size_t>(m)].name != rec.model) {
    ++st.advise_no_kv;  // another model's turn: its KV is not this one's
    return;
  }
  const int d = AdviseTarget(s, m);
  if (d < 0) {
    ++st.advise_no_replica;
    return;
  }
  SimDevice& dev = *devices_[static_cast<size_t>(d)];
  if (dev.Cached(s, m) != nullptr) {
    ++st.advise_on_device;
    ses.device = d;
    return;
  }
  if (!dev.CanPrefetch(m)) {  // tp > 1: its GPUs keep no session KV; nothing is read
    ++st.advise_no_room;
    return;
  }
  const Lease l = ReadLease(s, m, NodeOf(d), rec.priority);
  if (l.tokens == 0) {
    ++st.advise_no_kv;
    return;
  }
  const double now = events_.now();
  const double expires = now + (rec.expected_arrival_s > 0 ? rec.expected_arrival_s + kAdviseGraceS
                                                           : kAdviseDefaultTtlS);
  const int64_t bytes =
      l.tokens * config_.models[static_cast<size_t>(m)].Part().kv_bytes_per_token();
  if (!dev.Prefetch(s, m, l.tokens, bytes, now + l.seconds, expires)) {
    ++st.advise_no_room;
    return;
  }
  ++st.advise_prefetched[OriginName(l.origin)];
  ses.device = d;
  events_.At(expires, [this, d, s, expires] {
    ++expiries_run_;  // not a real event for simulated_s (RunEvents)
    devices_[static_cast<size_t>(d)]->ExpirePrefetch(s, expires);
  });
}

void Simulator::TurnEnded(const SimRequest& r) {
  if (r.session < 0) return;
  Session& s = sessions_[static_cast<size_t>(r.session)];
  s.model = r.model;
  s.history = r.prompt + r.output;
  s.device = r.device;
  if (!Tiers()) return;
  const int64_t full = config_.models[static_cast<size_t>(r.model)].shape.kv_bytes_per_token();
  tiers_[static_cast<size_t>(NodeOf(r.device))]->Put(r.session, r.model, s.history,
                                                     s.history * full, r.priority);
}

void Simulator::FillKvOutcome(const SimRequest& r, bench::RequestOutcome* o) const {
  static const v1::KvSource kProto[] = {
      v1::KV_SOURCE_NONE, v1::KV_SOURCE_DEVICE, v1::KV_SOURCE_DEVICE,    v1::KV_SOURCE_HOST_DRAM,
      v1::KV_SOURCE_SSD,  v1::KV_SOURCE_PEER,   v1::KV_SOURCE_RECOMPUTED};
  if (r.session < 0) return;  // no session: nothing to say (as a replay without one)
  o->kv_source = bench::KvSourceName(kProto[static_cast<int>(r.origin)]);
  o->cached_tokens = r.reused;
  o->kv_load_ms = r.load_s * 1e3;
}

void Simulator::SummarizeSessions() {
  SessionKvStats& st = stats_.sessions;
  st.mode = SessionKvName(config_.policy.session_kv);
  st.rates = engine_.kv_rates();
  std::set<std::string> ids;
  std::map<std::string, std::vector<double>> ttft;
  for (size_t i = 0; i < trace_.size(); ++i) {
    const bench::TraceRecord& rec = trace_[i];
    if (!rec.is_request() || rec.session.empty()) continue;
    ids.insert(rec.session);
    ++st.turns;
    const SimRequest* r = requests_[i].get();
    const bench::RequestOutcome& o = outcomes_[i];
    if (o.release_s < 0) {
      ++st.not_released;
    } else if (o.status != "OK" || r == nullptr) {
      ++st.failed;
    } else if (r->history <= 0) {
      ++st.first_turns;
      ttft["first"].push_back(o.ttft_ms());
    } else {
      ++st.next_turns;
      ++st.next_by_origin[OriginName(r->origin)];
      ttft[OriginName(r->origin)].push_back(o.ttft_ms());
      st.reused_tokens += r->reused;
      st.recomputed_tokens += r->history - r->reused;
    }
  }
  st.sessions = static_cast<int>(ids.size());
  for (auto& [name, v] : ttft) st.ttft_ms[name] = bench::SummarizeLatency(std::move(v));
  for (const auto& d : devices_) {
    const SessionCounters& c = d->session_counters();
    st.hbm_shed += c.shed;
    st.prefetch_shed += c.prefetch_shed;
    st.prefetch_expired += c.prefetch_expired;
    st.hbm_unloaded += c.unloaded;
  }
  for (const auto& t : tiers_) {
    st.dram_demoted += t->counters().demoted;
    st.ssd_evicted += t->counters().ssd_evicted;
    st.tier_dropped += t->counters().dropped;
  }
}

nlohmann::json ToJson(const SessionKvStats& s) {
  nlohmann::json ttft = nlohmann::json::object();
  for (const auto& [name, l] : s.ttft_ms) {
    ttft[name] = bench::ToJson(l);
  }
  nlohmann::json gib = nlohmann::json::object();
  for (const auto& [tier, b] : s.loaded_bytes) gib[tier] = static_cast<double>(b) / (1LL << 30);
  return {{"mode", s.mode},
          {"sessions", s.sessions},
          {"turns", s.turns},
          {"first_turns", s.first_turns},
          {"next_turns", s.next_turns},
          {"failed", s.failed},
          {"not_released", s.not_released},
          {"next_turns_by_kv", s.next_by_origin},
          {"ttft_ms", ttft},
          {"reused_tokens", s.reused_tokens},
          {"recomputed_tokens", s.recomputed_tokens},
          {"loads", s.loads},
          {"loaded_gib", gib},
          {"lease_wait_s", s.lease_wait_s},
          {"gpu",
           {{"shed", s.hbm_shed},
            {"prefetch_shed", s.prefetch_shed},
            {"prefetch_expired", s.prefetch_expired},
            {"unloaded", s.hbm_unloaded}}},
          {"tiers",
           {{"dram_demoted", s.dram_demoted},
            {"ssd_evicted", s.ssd_evicted},
            {"dropped", s.tier_dropped}}},
          {"advise",
           {{"advisories", s.advisories},
            {"prefetched", s.advise_prefetched},
            {"on_device", s.advise_on_device},
            {"no_kv", s.advise_no_kv},
            {"no_room", s.advise_no_room},
            {"no_replica", s.advise_no_replica}}},
          {"load_bytes_per_s",
           {{"host_dram", s.rates.dram_bytes_per_s},
            {"ssd", s.rates.ssd_bytes_per_s},
            {"peer", s.rates.peer_bytes_per_s}}}};
}

}  // namespace ballast::sim
