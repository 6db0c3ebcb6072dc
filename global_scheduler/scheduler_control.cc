// The scheduler's control loop: one tick's named steps, and the node calls
// they start (loads, evictions; migrations and KVPR rebalancing are in
// scheduler_migration.cc). See scheduler.h for the order and its rules.
#include <grpcpp/grpcpp.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "global_scheduler/idle_eviction.h"
#include "global_scheduler/kvpr.h"
#include "global_scheduler/scheduler.h"
#include "spdlog/spdlog.h"

namespace ballast::global_scheduler {

LoadFailure ClassifyLoadError(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return LoadFailure::kNoRoom;
    // The checkpoint, its shape or its files: loading it again cannot help.
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::NOT_FOUND:
    case grpc::StatusCode::UNIMPLEMENTED:
    case grpc::StatusCode::FAILED_PRECONDITION:
    case grpc::StatusCode::DATA_LOSS:
    case grpc::StatusCode::OUT_OF_RANGE:
    case grpc::StatusCode::PERMISSION_DENIED:
      return LoadFailure::kPermanent;
    default:  // UNAVAILABLE, DEADLINE_EXCEEDED, ABORTED, INTERNAL, ...
      return LoadFailure::kTransient;
  }
}

absl::Duration Scheduler::Tick::Idle(const std::string& model) const {
  auto it = last_request.find(model);
  return it == last_request.end() ? absl::InfiniteDuration() : now - it->second;
}

void Scheduler::ControlTick() {
  SweepDeadNodes();
  ExpireSessions();
  AdvanceMigrations();
  AdvanceDrains();
  MaybeRebalance();
  Tick tick = BeginTick();
  ReconcileReplicas(&tick);
  RelieveKvPressure(&tick);
  EvictUnlisted(tick);
}

void Scheduler::SweepDeadNodes() {
  for (const auto& id : cluster_.SweepDead()) {
    spdlog::warn("node {} missed heartbeats for {}: marked dead", id,
                 absl::FormatDuration(options_.heartbeat_timeout));
    sessions_.ForgetNode(id);
  }
}

Scheduler::Tick Scheduler::BeginTick() {
  Tick t;
  t.now = clock_();
  // Pending operations first, the cluster after: a load ends by recording
  // its replica and then leaving pending_, so one that ends in between is
  // in the snapshot. (The other order could see it in neither and load the
  // model a second time.)
  std::map<PendingKey, std::string> pending;
  {
    absl::MutexLock lock(&mu_);
    pending = pending_;
    for (const auto& [model, n] : inflight_by_model_) {
      if (n > 0) t.busy.insert(model);
    }
  }
  t.nodes = cluster_.Snapshot();
  const std::vector<ModelStatus> models = registry_.List();
  for (const ModelStatus& m : models) t.last_request[m.spec.name] = m.last_request;
  for (const auto& entry : pending) {
    // Not a structured binding: clang 14 cannot capture one in the lambdas.
    const auto& key = entry.first;
    const auto& device = entry.second;
    if (key.kind == PendingKind::kEvict) {
      t.leaving.insert(key.model);
      continue;
    }
    // Loads still under way count against their device, so models
    // registered one after another spread over the devices.
    const bool listed = std::any_of(t.nodes.begin(), t.nodes.end(), [&](const NodeInfo& n) {
      return n.node_id == key.node_id &&
             std::any_of(n.models.begin(), n.models.end(),
                         [&](const auto& r) { return r.name() == key.model; });
    });
    if (listed) continue;
    auto st = std::find_if(models.begin(), models.end(),
                           [&](const ModelStatus& m) { return m.spec.name == key.model; });
    AddPlaceholder(&t.nodes, Target{key.node_id, device}, key.model,
                   st == models.end() ? 0 : st->weight_bytes);
  }
  return t;
}

void Scheduler::ReconcileReplicas(Tick* tick) {
  for (const ModelStatus& m : registry_.List()) {
    if (!m.wanted()) continue;  // idle-evicted: waits for a request
    ReconcileModel(m, tick);
  }
}

void Scheduler::ReconcileModel(const ModelStatus& m, Tick* tick) {
  if (tick->leaving.count(m.spec.name)) return;  // being evicted: not reloaded now
  if (TrimReplicas(m, tick)) return;             // more replicas than wanted
  // Nodes that hold the model or are loading it.
  std::set<std::string> exclude;
  for (const auto& n : tick->nodes) {
    if (!n.alive) continue;
    for (const auto& r : n.models) {
      if (r.name() == m.spec.name) exclude.insert(n.node_id);
    }
  }
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [key, device] : pending_) {
      if (key.kind == PendingKind::kLoad && key.model == m.spec.name) exclude.insert(key.node_id);
    }
  }
  if (m.failed) return;  // until registered again
  if (static_cast<int>(exclude.size()) >= m.spec.replicas || tick->now < m.retry_after) return;
  {
    absl::MutexLock lock(&mu_);
    exclude.insert(cordoned_.begin(), cordoned_.end());  // no new replica on a draining node
  }
  // Just started: the nodes holding replicas may not have re-registered
  // yet. A request since the start loads the model now.
  if (tick->now < started_ + options_.startup_grace && m.last_request <= started_) return;
  {
    // An eviction made for this model is still under way: wait for it.
    absl::MutexLock lock(&mu_);
    auto it = evicting_for_.find(m.spec.name);
    if (it != evicting_for_.end()) {
      if (tick->leaving.count(it->second)) return;
      evicting_for_.erase(it);
    }
  }
  // Eviction for room only after a load was refused for room (needs_room):
  // a node's death, or a guess from reported memory, is no lack of room.
  bool candidates = false, fits = false;
  for (const auto& n : tick->nodes) {
    if (!n.alive || exclude.count(n.node_id)) continue;
    candidates = true;
    fits |= m.weight_bytes <= 0 || HasWeightRoom(n, m.weight_bytes);
  }
  if (!candidates) return;  // every live node holds it already, or none is live
  if (m.needs_room) {
    MakeRoomFor(m, tick);
    return;
  }
  if (!fits) {
    // The weights seem to fit no device: ask the freest one. Only its
    // refusal (RESOURCE_EXHAUSTED) makes the next tick evict for room.
    if (auto target = ChooseNodeForLoad(tick->nodes, exclude)) {
      StartLoad(m.spec, *target);
      AddPlaceholder(&tick->nodes, *target, m.spec.name, m.weight_bytes);
    }
    return;
  }
  PlaceReplica(m, exclude, tick);
}

bool Scheduler::TrimReplicas(const ModelStatus& m, Tick* tick) {
  std::vector<std::string> ready;
  int holders = 0;
  for (const auto& n : tick->nodes) {
    if (!n.alive) continue;
    for (const auto& r : n.models) {
      if (r.name() != m.spec.name || r.state() == v1::MODEL_STATE_DRAINING) continue;
      ++holders;
      if (r.state() == v1::MODEL_STATE_READY) ready.push_back(n.node_id);
    }
  }
  if (holders <= m.spec.replicas || ready.empty()) return holders > m.spec.replicas;
  {
    absl::MutexLock lock(&mu_);
    if (migrations_.count(m.spec.name)) return true;  // the move drains its source itself
    for (const auto& [key, device] : pending_) {
      if (key.model == m.spec.name) return true;  // one change at a time
    }
  }
  // Snapshot order is by id: the last READY replica goes, drained.
  const std::string& node_id = ready.back();
  spdlog::info("model {} has {} replicas, {} wanted: draining the one on node {}", m.spec.name,
               holders, m.spec.replicas, node_id);
  StartEvict(m.spec.name, node_id, /*drain=*/true);
  tick->leaving.insert(m.spec.name);
  return true;
}

void Scheduler::MakeRoomFor(const ModelStatus& m, Tick* tick) {
  if (options_.idle_evict_after <= absl::ZeroDuration()) return;
  std::set<std::string> skip = tick->leaving;
  skip.insert(tick->busy.begin(), tick->busy.end());
  skip.insert(m.spec.name);
  auto victim = ChooseIdleVictim(
      tick->nodes, [tick](const std::string& model) { return tick->Idle(model); },
      options_.idle_evict_after, skip);
  if (!victim) return;
  spdlog::info("model {} needs room: evicting {} from node {} (idle {})", m.spec.name,
               victim->model, victim->node_id, absl::FormatDuration(tick->Idle(victim->model)));
  registry_.RecordIdleEvicted(victim->model, tick->now);
  registry_.ClearNeedsRoom(m.spec.name);  // try loading once the room is there
  StartEvict(victim->model, victim->node_id, /*drain=*/true);
  {
    absl::MutexLock lock(&mu_);
    evicting_for_[m.spec.name] = victim->model;
  }
  tick->leaving.insert(victim->model);
  for (auto& n : tick->nodes) {  // the working copy: that node has room now
    if (n.node_id != victim->node_id) continue;
    std::erase_if(n.models, [&](const v1::ResidentModel& r) { return r.name() == victim->model; });
  }
}

std::set<std::string> Scheduler::KvPressureHeld(const Tick& tick) {
  std::set<std::string> held;
  absl::MutexLock lock(&mu_);
  for (auto it = kv_pressure_holds_.begin(); it != kv_pressure_holds_.end();) {
    KvPressureHold& h = it->second;
    if (h.ended == absl::InfiniteFuture() && !tick.leaving.count(h.model)) h.ended = tick.now;
    auto n = std::find_if(tick.nodes.begin(), tick.nodes.end(),
                          [&](const NodeInfo& x) { return x.node_id == h.node_id; });
    // Forgotten once the node is gone or a heartbeat after the end came.
    if (n == tick.nodes.end() || !n->alive || n->last_heartbeat > h.ended) {
      it = kv_pressure_holds_.erase(it);
      continue;
    }
    held.insert(it->first);
    ++it;
  }
  return held;
}

void Scheduler::EndKvPressureHold(const std::string& model, const std::string& node_id) {
  for (auto& [device, h] : kv_pressure_holds_) {
    if (h.model == model && h.node_id == node_id && h.ended == absl::InfiniteFuture()) {
      h.ended = clock_();
    }
  }
}

void Scheduler::RelieveKvPressure(Tick* tick) {
  if (options_.idle_evict_after <= absl::ZeroDuration() ||
      options_.kv_pressure_free_fraction <= 0) {
    return;
  }
  const std::set<std::string> held = KvPressureHeld(*tick);
  std::set<std::string> skip = tick->leaving;
  skip.insert(tick->busy.begin(), tick->busy.end());
  auto victim = ChooseKvPressureVictim(
      tick->nodes, [tick](const std::string& model) { return tick->Idle(model); },
      options_.idle_evict_after, skip, options_.kv_pressure_free_fraction, held);
  if (!victim) return;
  std::string device;
  for (const auto& n : tick->nodes) {
    if (n.node_id != victim->node_id) continue;
    for (const auto& r : n.models) {
      if (r.name() == victim->model) device = r.device();
    }
  }
  spdlog::info("node {} device {}: requests wait for KV memory: evicting {} (idle {})",
               victim->node_id, device, victim->model,
               absl::FormatDuration(tick->Idle(victim->model)));
  {
    absl::MutexLock lock(&mu_);
    kv_pressure_holds_[DeviceKey(victim->node_id, device)] =
        KvPressureHold{victim->model, victim->node_id};
  }
  registry_.RecordIdleEvicted(victim->model, tick->now);
  StartEvict(victim->model, victim->node_id, /*drain=*/true);
  tick->leaving.insert(victim->model);
}

void Scheduler::PlaceReplica(const ModelStatus& m, const std::set<std::string>& exclude,
                             Tick* tick) {
  std::optional<Target> target;
  if (options_.placement_policy == "kvpr") {
    StepBudget budget;
    budget.step_s = [&](const std::string& model) { return StepSeconds(model); };
    budget.tpot_s = [&](const std::string& model) { return TpotSeconds(model); };
    budget.new_step_s = m.decode_step_ms / 1000.0;
    budget.new_tpot_s = TpotSeconds(m.spec.name);
    budget.headroom = options_.step_budget_headroom;
    target = ChooseNodeKvpr(
        tick->nodes, exclude, [&](const std::string& model) { return Demand(model); },
        Demand(m.spec.name), m.weight_bytes, &budget);
  } else if (options_.placement_policy == "mme") {
    target = ChooseNodeMme(
        tick->nodes, exclude, [&](const std::string& model) { return Mme(model); },
        Mme(m.spec.name), m.weight_bytes);
  } else {
    target = ChooseNodeForLoad(tick->nodes, exclude);
  }
  if (!target) return;
  StartLoad(m.spec, *target);
  AddPlaceholder(&tick->nodes, *target, m.spec.name, m.weight_bytes);
}

void Scheduler::EvictUnlisted(const Tick& tick) {
  for (const auto& n : tick.nodes) {
    if (!n.alive) continue;
    for (const auto& r : n.models) {
      const std::optional<ModelStatus> listed = registry_.Get(r.name());
      if (!listed) {
        StartEvict(r.name(), n.node_id);
        continue;
      }
      // A ready replica with other weights (the model was registered again
      // with another quantization, or the scheduler restarted with a
      // changed catalogue) is not the listed model: it goes, and the
      // replica reconciliation loads the listed one. Nodes from before
      // the field report none.
      const std::string quant = r.quantization().empty() ? "none" : r.quantization();
      if (r.state() == v1::MODEL_STATE_READY && quant != listed->spec.quantization) {
        spdlog::info("model {} on node {} is served with quantization {}, listed with {}: evicting",
                     r.name(), n.node_id, quant, listed->spec.quantization);
        StartEvict(r.name(), n.node_id);
      }
    }
  }
}

void Scheduler::AddPlaceholder(std::vector<NodeInfo>* nodes, const Target& target,
                               const std::string& model, int64_t weight_bytes) {
  for (auto& n : *nodes) {
    if (n.node_id != target.node_id) continue;
    v1::ResidentModel placeholder;
    placeholder.set_name(model);
    placeholder.set_state(v1::MODEL_STATE_LOADING);
    placeholder.set_weight_bytes(weight_bytes);
    v1::DeviceState* on = n.devices.empty() ? nullptr : &n.devices.front();
    for (auto& d : n.devices) {
      if (d.name() == target.device) on = &d;
    }
    if (on != nullptr) {
      placeholder.set_device(on->name());
      on->set_memory_used_bytes(on->memory_used_bytes() + weight_bytes);
    }
    n.models.push_back(placeholder);
  }
}

bool Scheduler::IsLoading(const std::string& model) const {
  absl::MutexLock lock(&mu_);
  for (const auto& [key, device] : pending_) {
    if (key.kind == PendingKind::kLoad && key.model == model) return true;
  }
  return false;
}

void Scheduler::StartLoad(const ModelSpec& spec, const Target& target) {
  auto stub = Stub(target.node_id);
  if (!stub) return;
  const PendingKey key{PendingKind::kLoad, spec.name, target.node_id};
  {
    absl::MutexLock lock(&mu_);
    if (!pending_.emplace(key, target.device).second) return;
  }
  spdlog::info("loading model {} on node {} {}", spec.name, target.node_id, target.device);
  const bool queued = pool_->Schedule([this, spec, target, stub, key] {
    v1::LoadModelRequest req;
    req.set_name(spec.name);
    req.set_path(spec.path);
    req.set_kv_dtype(spec.kv_dtype);
    req.set_quantization(spec.quantization);
    req.set_device(target.device);
    req.set_kv_floor_bytes(spec.kv_floor_bytes);
    req.set_kv_limit_bytes(spec.kv_limit_bytes);
    v1::LoadModelResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.load_timeout));
    // A node that just restarted at its old address finds the channel in
    // reconnect backoff: a call now would fail at once and wait load_retry.
    if (auto channels = ChannelsOf(target.node_id)) {
      channels->WaitForConnected(absl::Now() + options_.node_connect_wait);
    }
    grpc::Status st = stub->LoadModel(&ctx, req, &resp);
    if (st.ok()) {
      cluster_.AddResident(target.node_id, resp.model());
      registry_.RecordLoaded(spec.name, resp.model().architecture(), resp.model().context_window(),
                             resp.model().weight_bytes(), resp.model().kv_bytes_per_token());
      spdlog::info("model {} ready on node {} ({})", spec.name, target.node_id,
                   resp.model().device());
    } else {
      const std::string err =
          absl::StrCat("load on node ", target.node_id, " failed: ", st.error_message());
      spdlog::error("model {}: {}", spec.name, err);
      if (st.error_code() == grpc::StatusCode::UNAVAILABLE) ReportUnavailable(target.node_id);
      registry_.RecordLoadError(spec.name, err, ClassifyLoadError(st.error_code()), clock_(),
                                options_.load_retry);
      cluster_.NotifyRoutingChange();  // waiting requests see a permanent failure now
    }
    absl::MutexLock lock(&mu_);
    pending_.erase(key);
  });
  if (!queued) {
    absl::MutexLock lock(&mu_);
    pending_.erase(key);
  }
}

void Scheduler::StartEvict(const std::string& model, const std::string& node_id, bool drain) {
  auto stub = Stub(node_id);
  if (!stub) return;
  const PendingKey key{PendingKind::kEvict, model, node_id};
  {
    absl::MutexLock lock(&mu_);
    if (!pending_.emplace(key, "").second) return;
  }
  if (drain) cluster_.SetResidentState(node_id, model, v1::MODEL_STATE_DRAINING);
  const bool queued = pool_->Schedule([this, model, node_id, stub, drain, key] {
    v1::EvictModelRequest req;
    req.set_name(model);
    req.set_drain(drain);
    req.set_drain_timeout_ms(
        static_cast<uint32_t>(absl::ToInt64Milliseconds(options_.drain_timeout)));
    v1::EvictModelResponse resp;
    grpc::ClientContext ctx;
    // The node may drain for drain_timeout; the margin covers the rest.
    const absl::Duration budget =
        (drain ? options_.drain_timeout : absl::ZeroDuration()) + options_.evict_rpc_margin;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + budget));
    grpc::Status st = stub->EvictModel(&ctx, req, &resp);
    {
      // Before the replica goes from the cluster: whoever sees it gone sees
      // the hold's end too.
      absl::MutexLock lock(&mu_);
      EndKvPressureHold(model, node_id);
    }
    if (st.ok() || st.error_code() == grpc::StatusCode::NOT_FOUND) {
      cluster_.RemoveResident(node_id, model);
      spdlog::info("model {} evicted from node {}", model, node_id);
    } else {
      spdlog::warn("evicting {} from node {} failed: {}", model, node_id, st.error_message());
      if (st.error_code() == grpc::StatusCode::UNAVAILABLE) ReportUnavailable(node_id);
    }
    {
      absl::MutexLock lock(&mu_);
      pending_.erase(key);
    }
    Kick();  // a load may be waiting for this room
  });
  if (!queued) {
    absl::MutexLock lock(&mu_);
    pending_.erase(key);
  }
}

}  // namespace ballast::global_scheduler
