#include "global_scheduler/scheduler.h"

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "global_scheduler/idle_eviction.h"
#include "global_scheduler/kvpr.h"
#include "global_scheduler/placement.h"
#include "spdlog/spdlog.h"

namespace ballast::global_scheduler {

absl::StatusOr<std::unique_ptr<Scheduler>> Scheduler::Create(const SchedulerOptions& options,
                                                             Clock clock) {
  if (options.heartbeat_timeout <= options.heartbeat_interval) {
    return absl::InvalidArgumentError("heartbeat_timeout must exceed heartbeat_interval");
  }
  std::unique_ptr<Scheduler> s(new Scheduler(options, std::move(clock)));
  for (const auto& m : options.models) {
    if (auto st = s->registry_.Add(m); !st.ok()) return st;
    s->registry_.RecordRequest(m.name, s->clock_());
  }
  return s;
}

Scheduler::Scheduler(const SchedulerOptions& options, Clock clock)
    : options_(options),
      clock_(clock),
      cluster_(options.heartbeat_timeout, clock),
      stats_(options.stats_window) {}

Scheduler::~Scheduler() { Stop(); }

void Scheduler::Start() {
  if (control_.joinable()) return;
  control_ = std::thread([this] { ControlLoop(); });
}

void Scheduler::Stop() {
  if (!stop_.HasBeenNotified()) stop_.Notify();
  Kick();
  if (control_.joinable()) control_.join();
  std::vector<Worker> workers;
  {
    absl::MutexLock lock(&mu_);
    workers.swap(workers_);
  }
  for (auto& w : workers) w.thread.join();
}

void Scheduler::RunAsync(std::function<void()> fn) {
  auto done = std::make_shared<std::atomic<bool>>(false);
  std::thread t([fn = std::move(fn), done] {
    fn();
    done->store(true);
  });
  absl::MutexLock lock(&mu_);
  workers_.push_back({std::move(t), done});
}

void Scheduler::Kick() {
  absl::MutexLock lock(&kick_mu_);
  kicked_ = true;
  kick_cv_.Signal();
}

void Scheduler::ControlLoop() {
  while (!stop_.HasBeenNotified()) {
    {
      absl::MutexLock lock(&kick_mu_);
      if (!kicked_) kick_cv_.WaitWithTimeout(&kick_mu_, options_.control_interval);
      kicked_ = false;
    }
    if (stop_.HasBeenNotified()) break;
    ControlTick();
  }
}

void Scheduler::ControlTick() {
  // Reap finished load/evict calls.
  {
    absl::MutexLock lock(&mu_);
    for (auto it = workers_.begin(); it != workers_.end();) {
      if (it->done->load()) {
        it->thread.join();
        it = workers_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (const auto& id : cluster_.SweepDead()) {
    spdlog::warn("node {} missed heartbeats for {}: marked dead", id,
                 absl::FormatDuration(options_.heartbeat_timeout));
    sessions_.ForgetNode(id);
  }
  AdvanceMigrations();
  if (options_.placement_policy == "kvpr" && options_.rebalance_interval > absl::ZeroDuration() &&
      clock_() - last_rebalance_ >= options_.rebalance_interval) {
    last_rebalance_ = clock_();
    Rebalance();
  }
  // A working copy: loads started in this tick count against their node, so
  // several models registered at once spread over the nodes.
  auto nodes = cluster_.Snapshot();
  const absl::Time now = clock_();
  const std::vector<ModelStatus> models = registry_.List();
  std::map<std::string, absl::Time> last_request;
  for (const ModelStatus& m : models) last_request[m.spec.name] = m.last_request;
  auto idle = [&](const std::string& model) {
    auto it = last_request.find(model);
    return it == last_request.end() ? absl::InfiniteDuration() : now - it->second;
  };
  std::set<std::string> leaving;  // models evicted this tick or already being evicted
  {
    // Loads still under way count against their node in the working copy,
    // so models registered one after another spread over the nodes.
    absl::MutexLock lock(&mu_);
    for (const auto& [model, node] : pending_) {
      if (model.rfind("evict:", 0) == 0) {
        leaving.insert(model.substr(6));
        continue;
      }
      auto st = std::find_if(models.begin(), models.end(),
                             [&](const ModelStatus& m) { return m.spec.name == model; });
      const bool listed = std::any_of(nodes.begin(), nodes.end(), [&](const NodeInfo& n) {
        return n.node_id == node && std::any_of(n.models.begin(), n.models.end(),
                                                [&](const auto& r) { return r.name() == model; });
      });
      if (!listed) AddPlaceholder(&nodes, node, model, st == models.end() ? 0 : st->weight_bytes);
    }
  }
  for (const ModelStatus& m : models) {
    if (!m.wanted()) continue;  // idle-evicted: waits for a request
    std::set<std::string> exclude;
    int have = 0;
    for (const auto& n : nodes) {
      if (!n.alive) continue;
      for (const auto& r : n.models) {
        if (r.name() == m.spec.name) {
          exclude.insert(n.node_id);
          ++have;
        }
      }
    }
    {
      absl::MutexLock lock(&mu_);
      for (const auto& [model, node] : pending_) {
        if (model == m.spec.name && !exclude.count(node)) {
          exclude.insert(node);
          ++have;
        }
      }
    }
    if (have >= m.spec.replicas || now < m.retry_after) continue;
    // Room for the weights? If no candidate node has it (or the last load
    // was refused for memory), evict the idlest model past the threshold
    // and load next tick.
    bool room = !m.needs_room;
    if (room && m.weight_bytes > 0) {
      room = false;
      for (const auto& n : nodes) {
        if (n.alive && !exclude.count(n.node_id) && HasWeightRoom(n, m.weight_bytes)) room = true;
      }
    }
    {
      // An eviction made for this model is still under way: wait for it.
      absl::MutexLock lock(&mu_);
      auto it = evicting_for_.find(m.spec.name);
      if (it != evicting_for_.end()) {
        if (leaving.count(it->second)) continue;
        evicting_for_.erase(it);
      }
    }
    if (!room) {
      if (options_.idle_evict_after <= absl::ZeroDuration()) continue;
      std::set<std::string> skip = leaving;
      skip.insert(m.spec.name);
      auto victim = ChooseIdleVictim(nodes, idle, options_.idle_evict_after, skip);
      if (!victim) continue;
      spdlog::info("model {} needs room: evicting {} from node {} (idle {})", m.spec.name,
                   victim->model, victim->node_id, absl::FormatDuration(idle(victim->model)));
      registry_.RecordIdleEvicted(victim->model, now);
      registry_.ClearNeedsRoom(m.spec.name);  // try loading once the room is there
      StartEvict(victim->model, victim->node_id, /*drain=*/true);
      {
        absl::MutexLock lock(&mu_);
        evicting_for_[m.spec.name] = victim->model;
      }
      leaving.insert(victim->model);
      for (auto& n : nodes) {  // the working copy: that node has room now
        if (n.node_id != victim->node_id) continue;
        std::erase_if(n.models,
                      [&](const v1::ResidentModel& r) { return r.name() == victim->model; });
      }
      continue;
    }
    std::optional<std::string> target;
    if (options_.placement_policy == "kvpr") {
      target = ChooseNodeKvpr(
          nodes, exclude, [&](const std::string& model) { return Demand(model); },
          Demand(m.spec.name), m.weight_bytes);
    } else if (options_.placement_policy == "mme") {
      target = ChooseNodeMme(
          nodes, exclude, [&](const std::string& model) { return Mme(model); }, Mme(m.spec.name),
          m.weight_bytes);
    } else {
      target = ChooseNodeForLoad(nodes, exclude);
    }
    if (target) {
      StartLoad(m.spec, *target);
      AddPlaceholder(&nodes, *target, m.spec.name, m.weight_bytes);
    }
  }
  // Models that nodes hold but the catalogue no longer lists.
  for (const auto& n : nodes) {
    if (!n.alive) continue;
    for (const auto& r : n.models) {
      if (!registry_.Contains(r.name())) StartEvict(r.name(), n.node_id);
    }
  }
}

void Scheduler::AddPlaceholder(std::vector<NodeInfo>* nodes, const std::string& node_id,
                               const std::string& model, int64_t weight_bytes) {
  for (auto& n : *nodes) {
    if (n.node_id != node_id) continue;
    v1::ResidentModel placeholder;
    placeholder.set_name(model);
    placeholder.set_state("LOADING");
    placeholder.set_weight_bytes(weight_bytes);
    n.models.push_back(placeholder);
    if (!n.devices.empty()) {
      auto& d = n.devices.front();
      d.set_memory_used_bytes(d.memory_used_bytes() + weight_bytes);
    }
  }
}

void Scheduler::StartLoad(const ModelSpec& spec, const std::string& node_id) {
  auto stub = Stub(node_id);
  if (!stub) return;
  {
    absl::MutexLock lock(&mu_);
    if (!pending_.insert({spec.name, node_id}).second) return;
  }
  spdlog::info("loading model {} on node {}", spec.name, node_id);
  RunAsync([this, spec, node_id, stub] {
    v1::LoadModelRequest req;
    req.set_name(spec.name);
    req.set_path(spec.path);
    req.set_kv_dtype(spec.kv_dtype);
    req.set_kv_floor_bytes(spec.kv_floor_bytes);
    req.set_kv_limit_bytes(spec.kv_limit_bytes);
    v1::LoadModelResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.load_timeout));
    grpc::Status st = stub->LoadModel(&ctx, req, &resp);
    if (st.ok()) {
      cluster_.AddResident(node_id, resp.model());
      registry_.RecordLoaded(spec.name, resp.model().architecture(), resp.model().context_window(),
                             resp.model().weight_bytes(), resp.model().kv_bytes_per_token());
      spdlog::info("model {} ready on node {} ({})", spec.name, node_id, resp.model().device());
    } else {
      const std::string err =
          absl::StrCat("load on node ", node_id, " failed: ", st.error_message());
      spdlog::error("model {}: {}", spec.name, err);
      // Out of memory: evict an idle model and retry at once (the control
      // loop does both); other failures back off.
      const bool no_room = st.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED;
      registry_.RecordLoadError(spec.name, err, no_room ? clock_() : clock_() + options_.load_retry,
                                no_room);
    }
    absl::MutexLock lock(&mu_);
    pending_.erase({spec.name, node_id});
  });
}

void Scheduler::StartEvict(const std::string& model, const std::string& node_id, bool drain) {
  auto stub = Stub(node_id);
  if (!stub) return;
  {
    absl::MutexLock lock(&mu_);
    if (!pending_.insert({"evict:" + model, node_id}).second) return;
  }
  if (drain) cluster_.SetResidentState(node_id, model, "DRAINING");
  RunAsync([this, model, node_id, stub, drain] {
    v1::EvictModelRequest req;
    req.set_name(model);
    req.set_drain(drain);
    v1::EvictModelResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(
        absl::ToChronoTime(absl::Now() + (drain ? absl::Minutes(11) : absl::Seconds(30))));
    grpc::Status st = stub->EvictModel(&ctx, req, &resp);
    if (st.ok() || st.error_code() == grpc::StatusCode::NOT_FOUND) {
      cluster_.RemoveResident(node_id, model);
      spdlog::info("model {} evicted from node {}", model, node_id);
    } else {
      spdlog::warn("evicting {} from node {} failed: {}", model, node_id, st.error_message());
    }
    {
      absl::MutexLock lock(&mu_);
      pending_.erase({"evict:" + model, node_id});
    }
    Kick();  // a load may be waiting for this room
  });
}

std::shared_ptr<v1::Node::StubInterface> Scheduler::Stub(const std::string& node_id) {
  auto info = cluster_.Get(node_id);
  if (!info) return nullptr;
  absl::MutexLock lock(&mu_);
  auto& slot = stubs_[node_id];
  if (!slot.second || slot.first != info->address) {
    auto channel = grpc::CreateChannel(info->address, grpc::InsecureChannelCredentials());
    slot = {info->address, std::shared_ptr<v1::Node::StubInterface>(v1::Node::NewStub(channel))};
  }
  return slot.second;
}

v1::RegisterNodeResponse Scheduler::RegisterNode(const v1::RegisterNodeRequest& req) {
  cluster_.Register(req);
  for (const auto& m : req.models()) {
    registry_.RecordLoaded(m.name(), m.architecture(), m.context_window(), m.weight_bytes(),
                           m.kv_bytes_per_token());
  }
  spdlog::info("node {} registered at {} with {} device(s), {} model(s)", req.node_id(),
               req.address(), req.devices_size(), req.models_size());
  v1::RegisterNodeResponse resp;
  resp.set_heartbeat_interval_ms(
      static_cast<uint32_t>(absl::ToInt64Milliseconds(options_.heartbeat_interval)));
  return resp;
}

v1::HeartbeatResponse Scheduler::Heartbeat(const v1::HeartbeatRequest& req) {
  v1::HeartbeatResponse resp;
  resp.set_reregister(!cluster_.Heartbeat(req));
  return resp;
}

absl::Status Scheduler::RegisterModel(const ModelSpec& spec) {
  bool limits_changed = false;
  if (auto st = registry_.Add(spec, &limits_changed); !st.ok()) return st;
  if (!limits_changed) {
    registry_.RecordRequest(spec.name, clock_());
    spdlog::info("model {} registered ({})", spec.name, spec.path);
    Kick();
    return absl::OkStatus();
  }
  // Move the KV floor/limit on every node holding the model, now.
  spdlog::info("model {}: KV floor {} / limit {} bytes", spec.name, spec.kv_floor_bytes,
               spec.kv_limit_bytes);
  for (const std::string& node_id : cluster_.NodesWithModel(spec.name)) {
    auto stub = Stub(node_id);
    if (!stub) continue;
    v1::SetKvLimitsRequest req;
    req.set_name(spec.name);
    req.set_kv_floor_bytes(spec.kv_floor_bytes);
    req.set_kv_limit_bytes(spec.kv_limit_bytes);
    v1::SetKvLimitsResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    grpc::Status st = stub->SetKvLimits(&ctx, req, &resp);
    if (!st.ok()) {
      return absl::UnavailableError(
          absl::StrCat("model ", spec.name, ": node ", node_id,
                       " did not take the new KV limits: ", st.error_message()));
    }
  }
  return absl::OkStatus();
}

absl::Status Scheduler::UnregisterModel(const std::string& name) {
  stats_.Forget(name);
  return registry_.Remove(name);  // the control loop evicts its replicas
}

absl::Status Scheduler::MigrateModel(const std::string& model, const std::string& from_node,
                                     const std::string& to_node) {
  auto m = registry_.Get(model);
  if (!m) return absl::NotFoundError(absl::StrCat("model \"", model, "\" is not registered"));
  if (!cluster_.IsAlive(to_node)) {
    return absl::NotFoundError(absl::StrCat("node \"", to_node, "\" is not a live node"));
  }
  const auto holders = cluster_.NodesWithModel(model);  // READY replicas
  if (std::find(holders.begin(), holders.end(), from_node) == holders.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("model ", model, " is not READY on node \"", from_node, "\""));
  }
  for (const auto& n : cluster_.Snapshot()) {
    if (n.node_id != to_node) continue;
    for (const auto& r : n.models) {
      if (r.name() == model) {
        return absl::FailedPreconditionError(
            absl::StrCat("model ", model, " is already on node ", to_node));
      }
    }
  }
  {
    absl::MutexLock lock(&mu_);
    if (migrations_.count(model)) {
      return absl::FailedPreconditionError(absl::StrCat("model ", model, " is already moving"));
    }
    migrations_[model] = Migration{from_node, to_node};
  }
  spdlog::info("migrating model {} from node {} to node {}", model, from_node, to_node);
  StartLoad(m->spec, to_node);  // the source keeps serving meanwhile
  return absl::OkStatus();
}

void Scheduler::AdvanceMigrations() {
  std::map<std::string, Migration> moves;
  {
    absl::MutexLock lock(&mu_);
    moves = migrations_;
  }
  for (const auto& [model, mv] : moves) {
    const auto ready = cluster_.NodesWithModel(model);
    bool done = false;
    if (std::find(ready.begin(), ready.end(), mv.to) != ready.end()) {
      // The target serves: drain the source; its in-flight requests finish
      // there, new ones go to the target.
      spdlog::info("model {} is READY on node {}: draining node {}", model, mv.to, mv.from);
      StartEvict(model, mv.from, /*drain=*/true);
      done = true;
    } else {
      // The load ended (StartLoad keeps it pending until then) without a
      // READY replica: it failed; give the move up, the source stays.
      absl::MutexLock lock(&mu_);
      done = !pending_.count({model, mv.to});
      if (done)
        spdlog::warn("migration of {} to node {} failed; it stays on {}", model, mv.to, mv.from);
    }
    if (done) {
      absl::MutexLock lock(&mu_);
      migrations_.erase(model);
    }
  }
}

void Scheduler::Rebalance() {
  // Whole-catalogue KVPR placement over the live nodes (Prism Algorithm 1,
  // kvpr.h); single-replica models that are READY somewhere take part.
  const auto nodes = cluster_.Snapshot();
  std::vector<DeviceCapacity> devices;
  std::map<std::string, int> index;
  for (const auto& n : nodes) {
    if (!n.alive) continue;
    DeviceCapacity d;
    d.name = n.node_id;
    for (const auto& dev : n.devices) d.memory_bytes += dev.memory_total_bytes();
    index[n.node_id] = static_cast<int>(devices.size());
    devices.push_back(d);
  }
  std::vector<ModelDemand> models;
  {
    absl::MutexLock lock(&mu_);
    if (!migrations_.empty()) return;  // one move at a time
  }
  for (const ModelStatus& m : registry_.List()) {
    if (m.spec.replicas != 1 || m.weight_bytes <= 0) continue;
    const auto ready = cluster_.NodesWithModel(m.spec.name);
    if (ready.size() != 1 || !index.count(ready[0])) continue;
    models.push_back({m.spec.name, Demand(m.spec.name), m.weight_bytes, index[ready[0]]});
  }
  if (models.size() < 2 || devices.size() < 2) return;
  const KvprPlacement plan = PlaceKvpr(models, devices, options_.migration_threshold);
  for (size_t i = 0; i < models.size(); ++i) {
    const int to = plan.device_of[i];
    if (to < 0 || to == models[i].current_device) continue;
    spdlog::info("KVPR rebalance: max KVPR {:.3g} -> {:.3g} by moving {}",
                 MaxKvpr(models, devices,
                         [&] {
                           std::vector<int> cur;
                           for (const auto& m : models) cur.push_back(m.current_device);
                           return cur;
                         }()),
                 plan.max_kvpr, models[i].name);
    auto st =
        MigrateModel(models[i].name, devices[models[i].current_device].name, devices[to].name);
    if (!st.ok()) {
      spdlog::warn("KVPR rebalance of {} not started: {}", models[i].name,
                   std::string(st.message()));
    }
    break;  // one move per rebalance
  }
}

double Scheduler::Demand(const std::string& model) const {
  const auto status = registry_.Get(model);
  if (!status) return 0;
  const ModelRates r = stats_.Rates(model, clock_());
  const uint32_t tpot_ms = status->spec.tpot_ms ? status->spec.tpot_ms : options_.default_tpot_ms;
  return KvDemand(r.prompt_tokens_per_s, r.decode_tokens_per_s,
                  static_cast<double>(status->kv_bytes_per_token), tpot_ms / 1000.0);
}

double Scheduler::Mme(const std::string& model) const {
  const auto status = registry_.Get(model);
  if (!status || status->kv_bytes_per_token <= 0) return 0;
  return 1.0 / static_cast<double>(status->kv_bytes_per_token);
}

void Scheduler::RecordCompletion(const std::string& model, int64_t prompt_tokens,
                                 int64_t decode_tokens) {
  stats_.Record(model, clock_(), prompt_tokens, decode_tokens);
}

v1::ModelInfo Scheduler::ToModelInfo(const ModelStatus& m) const {
  v1::ModelInfo info;
  info.set_name(m.spec.name);
  info.set_path(m.spec.path);
  info.set_architecture(m.architecture);
  info.set_context_window(m.context_window);
  info.set_kv_dtype(m.spec.kv_dtype);
  info.set_weight_bytes(m.weight_bytes);
  const ModelRates r = stats_.Rates(m.spec.name, clock_());
  v1::ModelLoad* load = info.mutable_load();
  load->set_window_s(absl::ToDoubleSeconds(stats_.window()));
  load->set_requests_per_s(r.requests_per_s);
  load->set_prompt_tokens_per_s(r.prompt_tokens_per_s);
  load->set_decode_tokens_per_s(r.decode_tokens_per_s);
  info.mutable_slo()->set_ttft_ms(m.spec.ttft_ms ? m.spec.ttft_ms : options_.default_ttft_ms);
  info.mutable_slo()->set_tpot_ms(m.spec.tpot_ms ? m.spec.tpot_ms : options_.default_tpot_ms);
  for (const auto& n : cluster_.Snapshot()) {
    if (!n.alive) continue;
    for (const auto& r : n.models) {
      if (r.name() != m.spec.name) continue;
      auto* rep = info.add_replicas();
      rep->set_node_id(n.node_id);
      rep->set_device(r.device());
      rep->set_state(r.state());
      rep->set_activation_ms(r.activation_ms());
      rep->set_from_host_copy(r.from_host_copy());
    }
  }
  info.set_idle_s(absl::ToDoubleSeconds(clock_() - m.last_request));
  ModelState state = m.wanted() ? ModelState::kRegistered : ModelState::kEvicted;
  bool loading = false;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [model, node] : pending_) loading |= model == m.spec.name;
  }
  if (loading) state = ModelState::kLoading;
  for (const auto& rep : info.replicas()) {
    if (rep.state() == "DRAINING" && state != ModelState::kReady) state = ModelState::kDraining;
    if (rep.state() == "READY") state = ModelState::kReady;
  }
  info.set_state(ModelStateName(state));
  if (info.replicas_size() == 0 && !m.last_error.empty()) {
    auto* rep = info.add_replicas();
    rep->set_state("FAILED: " + m.last_error);
  }
  return info;
}

v1::ListModelsResponse Scheduler::ListModels() const {
  v1::ListModelsResponse resp;
  for (const auto& m : registry_.List()) *resp.add_models() = ToModelInfo(m);
  return resp;
}

v1::ClusterState Scheduler::GetClusterState() const {
  v1::ClusterState state;
  const absl::Time now = clock_();
  for (const auto& n : cluster_.Snapshot()) {
    auto* ns = state.add_nodes();
    ns->set_node_id(n.node_id);
    ns->set_address(n.address);
    ns->set_alive(n.alive);
    ns->set_last_heartbeat_age_s(absl::ToDoubleSeconds(now - n.last_heartbeat));
    ns->set_inflight_requests(n.inflight);
    for (const auto& d : n.devices) *ns->add_devices() = d;
  }
  for (const auto& m : registry_.List()) *state.add_models() = ToModelInfo(m);
  state.set_sessions(sessions_.size());
  return state;
}

absl::StatusOr<Route> Scheduler::RouteRequest(const v1::GenerateRequest& req,
                                              const std::function<bool()>& cancelled) {
  auto model = registry_.Get(req.model());
  if (!model) {
    return absl::NotFoundError(absl::StrCat(
        "model \"", req.model(), "\" is not registered (ListModels shows the catalogue)"));
  }
  if (req.prompt().empty()) return absl::InvalidArgumentError("prompt is empty");
  const auto& s = req.sampling();
  if (s.max_tokens() <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling.max_tokens must be > 0 (got ", s.max_tokens(), ")"));
  }
  if (model->context_window > 0 && s.max_tokens() >= model->context_window) {
    return absl::InvalidArgumentError(absl::StrCat("sampling.max_tokens ", s.max_tokens(),
                                                   " does not fit the context window of ",
                                                   model->context_window));
  }
  if (s.temperature() < 0 || s.top_p() < 0 || s.top_p() > 1 || s.top_k() < 0) {
    return absl::InvalidArgumentError(
        "sampling: temperature must be >= 0, top_p in [0, 1], top_k >= 0");
  }
  Route route;
  route.session_id = req.session_id();
  route.ttft_ms = req.slo().ttft_ms()   ? req.slo().ttft_ms()
                  : model->spec.ttft_ms ? model->spec.ttft_ms
                                        : options_.default_ttft_ms;
  route.tpot_ms = req.slo().tpot_ms()   ? req.slo().tpot_ms()
                  : model->spec.tpot_ms ? model->spec.tpot_ms
                                        : options_.default_tpot_ms;
  std::string affinity;
  if (!route.session_id.empty()) {
    auto turn = sessions_.Begin(route.session_id, req.model());
    if (!turn.ok()) return turn.status();
    route.history = std::move(turn->history);
    affinity = turn->node_id;
  }
  registry_.RecordRequest(req.model(), clock_());
  const absl::Time deadline = clock_() + options_.route_wait;
  bool kicked = false;
  while (true) {
    auto nodes = cluster_.NodesWithModel(req.model());
    std::optional<std::string> pick;
    if (!affinity.empty() && std::find(nodes.begin(), nodes.end(), affinity) != nodes.end()) {
      pick = affinity;
    } else {
      pick = cluster_.LeastLoaded(nodes);
    }
    if (pick) {
      route.stub = Stub(*pick);
      if (route.stub) {
        route.node_id = *pick;
        break;
      }
    }
    if (!kicked) {
      Kick();  // not resident: activate it now, not at the next tick
      kicked = true;
    }
    if (clock_() >= deadline || cancelled()) {
      if (!route.session_id.empty()) sessions_.Abort(route.session_id);
      auto m = registry_.Get(req.model());
      return absl::UnavailableError(
          absl::StrCat("model ", req.model(), " has no live replica",
                       m && !m->last_error.empty() ? absl::StrCat(" (", m->last_error, ")")
                                                   : std::string(" (no node has loaded it yet)")));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  cluster_.AddInflight(route.node_id, 1);
  return route;
}

void Scheduler::Complete(const Route& route, bool ok, const std::vector<int>& prompt_tokens,
                         const std::vector<int>& output_tokens) {
  cluster_.AddInflight(route.node_id, -1);
  if (route.session_id.empty()) return;
  if (ok) {
    sessions_.Commit(route.session_id, route.node_id, prompt_tokens, output_tokens);
  } else {
    sessions_.Abort(route.session_id);
  }
}

bool Scheduler::EndSession(const std::string& session_id) {
  bool existed = false;
  auto node = sessions_.End(session_id, &existed);
  if (node && cluster_.IsAlive(*node)) {
    if (auto stub = Stub(*node)) {
      RunAsync([stub, session_id] {
        v1::DropSessionRequest req;
        req.set_session_id(session_id);
        v1::DropSessionResponse resp;
        grpc::ClientContext ctx;
        ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
        stub->DropSession(&ctx, req, &resp);
      });
    }
  }
  return existed;
}

}  // namespace ballast::global_scheduler
