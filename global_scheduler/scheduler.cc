#include "global_scheduler/scheduler.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <limits>
#include <optional>

#include "absl/strings/str_cat.h"
#include "global_scheduler/idle_eviction.h"
#include "global_scheduler/kvpr.h"
#include "global_scheduler/placement.h"
#include "global_scheduler/request_validation.h"
#include "proto/model_name.h"
#include "spdlog/spdlog.h"
#include "transfer/thread_name.h"

namespace ballast::global_scheduler {

absl::StatusOr<std::unique_ptr<Scheduler>> Scheduler::Create(const SchedulerOptions& options,
                                                             Clock clock) {
  if (options.heartbeat_timeout <= options.heartbeat_interval) {
    return absl::InvalidArgumentError("heartbeat_timeout must exceed heartbeat_interval");
  }
  if (options.max_sessions < 1) return absl::InvalidArgumentError("max_sessions must be >= 1");
  if (options.control_threads < 1) {
    return absl::InvalidArgumentError("control_threads must be >= 1");
  }
  if (options.drain_timeout <= absl::ZeroDuration() ||
      options.drain_timeout > absl::Milliseconds(std::numeric_limits<uint32_t>::max())) {
    return absl::InvalidArgumentError("drain_timeout must be > 0 and below 49 days");
  }
  std::unique_ptr<Scheduler> s(new Scheduler(options, std::move(clock)));
  std::vector<ModelSpec> models = options.models;
  s->state_ = options.state_store;
  if (!s->state_ && !options.state_path.empty()) {
    auto store = OpenSqliteStateStore(options.state_path, options.state);
    if (!store.ok()) return store.status();
    s->state_ = std::move(*store);
  }
  if (s->state_) {
    auto catalogue = CatalogueStore::Create(s->state_.get());
    if (!catalogue.ok()) return catalogue.status();
    s->catalogue_ = std::move(*catalogue);
    models = s->catalogue_->Apply(options.models);
    if (auto st = s->sessions_.Restore(s->state_.get()); !st.ok()) return st;
    spdlog::info("state from {}: a catalogue of {} models, {} sessions", s->state_->Describe(),
                 models.size(), s->sessions_.size());
  }
  for (const auto& m : models) {
    if (auto st = s->registry_.Add(m); !st.ok()) return st;
    s->registry_.RecordRequest(m.name, s->started_);  // not a request: the grace holds
  }
  return s;
}

Scheduler::Scheduler(const SchedulerOptions& options, Clock clock)
    : options_(options),
      clock_(clock),
      started_(clock()),
      cluster_(options.heartbeat_timeout, clock),
      sessions_(clock, options.max_sessions),
      quotas_(options.quotas, clock),
      stats_(options.stats_window),
      pool_(std::make_unique<transfer::WorkerPool>(options.control_threads, 0, "sched-control")) {}

Scheduler::~Scheduler() { Stop(); }

void Scheduler::Start() {
  if (control_.joinable()) return;
  control_ = std::thread([this] {
    transfer::NameThisThread("sched-loop");
    ControlLoop();
  });
}

void Scheduler::Stop() {
  if (!stop_.HasBeenNotified()) stop_.Notify();
  Kick();
  if (control_.joinable()) control_.join();
  waiters_.Stop();  // parked requests route once more and end UNAVAILABLE
  pool_->Stop();
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

std::shared_ptr<v1::Node::StubInterface> Scheduler::Stub(const std::string& node_id) {
  auto info = cluster_.Get(node_id);
  if (!info) return nullptr;
  absl::MutexLock lock(&mu_);
  std::shared_ptr<NodeChannels>& slot = channels_[node_id];
  if (!slot || slot->address() != info->address) {
    slot = std::make_shared<NodeChannels>(info->address, options_.node_channels,
                                          options_.node_credentials);
  }
  return slot->Next();
}

std::shared_ptr<NodeChannels> Scheduler::ChannelsOf(const std::string& node_id) const {
  absl::MutexLock lock(&mu_);
  auto it = channels_.find(node_id);
  return it == channels_.end() ? nullptr : it->second;
}

void Scheduler::ReportUnavailable(const std::string& node_id) {
  std::shared_ptr<NodeChannels> channels = ChannelsOf(node_id);
  // UNAVAILABLE from the node itself (a draining model) leaves the
  // connections READY; a dead or unreachable node's does not.
  if (channels && channels->AnyReady()) return;
  spdlog::warn("node {} is unreachable: routing avoids it until its next heartbeat", node_id);
  cluster_.MarkSuspect(node_id);
}

void Scheduler::ReportUnresponsive(const std::string& node_id) {
  spdlog::warn(
      "node {} did not accept a request within {}: routing avoids it until its next "
      "heartbeat",
      node_id, absl::FormatDuration(options_.node_accept_timeout));
  cluster_.MarkSuspect(node_id);
}

bool Scheduler::HasReplicaElsewhere(const std::string& model, const std::string& node_id) const {
  for (const auto& n : cluster_.NodesWithModel(model))
    if (n != node_id) return true;
  return false;
}

namespace {
// Whether something accepts gRPC connections at `address` within `limit`.
bool Reachable(const std::string& address, absl::Duration limit,
               const std::shared_ptr<grpc::ChannelCredentials>& credentials) {
  auto channel =
      grpc::CreateChannel(address, credentials ? credentials : grpc::InsecureChannelCredentials());
  return channel->WaitForConnected(absl::ToChronoTime(absl::Now() + limit));
}
}  // namespace

absl::StatusOr<v1::RegisterNodeResponse> Scheduler::RegisterNode(
    const v1::RegisterNodeRequest& req) {
  absl::Status st = cluster_.Register(req);
  if (absl::IsAlreadyExists(st)) {
    // The id is held by a live incarnation elsewhere: a crashed node that
    // restarted at a new address before its heartbeats timed out takes it
    // over; a node that still answers keeps it.
    const auto old = cluster_.Get(req.node_id());
    if (old && !Reachable(old->address, options_.identity_probe, options_.node_credentials)) {
      spdlog::warn("node {}: old incarnation at {} does not answer; replaced by {}", req.node_id(),
                   old->address, req.address());
      st = cluster_.Register(req, /*replace_live=*/true);
    }
  }
  if (!st.ok()) {
    spdlog::error("refused node registration from {}: {}", req.address(),
                  std::string(st.message()));
    return st;
  }
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
  for (const auto& m : req.models()) registry_.RecordStepMs(m.name(), m.decode_step_ms());
  switch (cluster_.Heartbeat(req)) {
    case HeartbeatResult::kOk:
      break;
    case HeartbeatResult::kReregister:
      resp.set_reregister(true);
      break;
    case HeartbeatResult::kReplaced:
      resp.set_replaced(true);
      break;
  }
  return resp;
}

absl::Status Scheduler::RegisterModel(const ModelSpec& spec) {
  absl::MutexLock serial(&catalogue_mu_);  // registry and store change together
  const std::optional<ModelStatus> before = registry_.Get(spec.name);
  bool limits_changed = false;
  if (auto st = registry_.Add(spec, &limits_changed); !st.ok()) return st;
  if (catalogue_) {
    if (auto st = catalogue_->RecordRegistered(spec); !st.ok()) {
      // Not acknowledged, so not kept: the catalogue is as it was.
      if (!before) {
        registry_.Remove(spec.name).IgnoreError();
      } else if (limits_changed) {
        registry_.Add(before->spec).IgnoreError();  // only the KV limits differed
      }
      return absl::UnavailableError(absl::StrCat("model ", spec.name,
                                                 " not registered: the catalogue could not "
                                                 "be stored: ",
                                                 st.message()));
    }
  }
  cluster_.NotifyRoutingChange();  // a request waiting on a failed model retries it
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
  absl::MutexLock serial(&catalogue_mu_);
  if (!registry_.Get(name)) {
    return registry_.Remove(name);  // its NOT_FOUND
  }
  // Written first: a failed write leaves the model exactly as it was.
  if (catalogue_) {
    if (auto st = catalogue_->RecordUnregistered(name); !st.ok()) {
      return absl::UnavailableError(absl::StrCat(
          "model ", name, " not unregistered: the catalogue could not be stored: ", st.message()));
    }
  }
  if (auto st = registry_.Remove(name); !st.ok()) return st;
  stats_.Forget(name);
  cluster_.NotifyRoutingChange();  // requests waiting for it end NOT_FOUND
  return absl::OkStatus();         // the control loop evicts its replicas
}

double Scheduler::Demand(const std::string& model) const {
  const auto status = registry_.Get(model);
  if (!status) return 0;
  const ModelRates r = stats_.Rates(model, clock_());
  const uint32_t tpot_ms = status->spec.tpot_ms ? status->spec.tpot_ms : options_.default_tpot_ms;
  return KvDemand(r.prompt_tokens_per_s, r.decode_tokens_per_s,
                  static_cast<double>(status->kv_bytes_per_token), tpot_ms / 1000.0);
}

double Scheduler::StepSeconds(const std::string& model) const {
  const auto status = registry_.Get(model);
  return status ? status->decode_step_ms / 1000.0 : 0;
}

double Scheduler::TpotSeconds(const std::string& model) const {
  const auto status = registry_.Get(model);
  if (!status) return 0;
  return (status->spec.tpot_ms ? status->spec.tpot_ms : options_.default_tpot_ms) / 1000.0;
}

double Scheduler::Mme(const std::string& model) const {
  const auto status = registry_.Get(model);
  if (!status || status->kv_bytes_per_token <= 0) return 0;
  return 1.0 / static_cast<double>(status->kv_bytes_per_token);
}

void Scheduler::RecordCompletion(const std::string& model, int64_t prompt_tokens,
                                 int64_t decode_tokens, const std::string& tenant) {
  stats_.Record(model, clock_(), prompt_tokens, decode_tokens);
  quotas_.ChargePromptTokens(tenant, prompt_tokens);
}

absl::Status Scheduler::AdmitRequest(const v1::GenerateRequest& req) {
  int64_t bytes = static_cast<int64_t>(req.prompt().size());
  for (const auto& m : req.messages()) bytes += static_cast<int64_t>(m.content().size());
  return quotas_.AdmitRequest(req.tenant(), bytes);
}

v1::ModelInfo Scheduler::ToModelInfo(const ModelStatus& m) const {
  v1::ModelInfo info;
  info.set_name(m.spec.name);
  info.set_path(m.spec.path);
  info.set_architecture(m.architecture);
  info.set_context_window(m.context_window);
  info.set_kv_dtype(m.spec.kv_dtype);
  info.set_quantization(m.spec.quantization);
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
  v1::ModelState state = m.wanted() ? v1::MODEL_STATE_REGISTERED : v1::MODEL_STATE_EVICTED;
  if (IsLoading(m.spec.name)) state = v1::MODEL_STATE_LOADING;
  for (const auto& rep : info.replicas()) {
    if (rep.state() == v1::MODEL_STATE_DRAINING && state != v1::MODEL_STATE_READY) {
      state = v1::MODEL_STATE_DRAINING;
    }
    if (rep.state() == v1::MODEL_STATE_READY) state = v1::MODEL_STATE_READY;
  }
  info.set_last_error(m.last_error);
  if (m.failed && state != v1::MODEL_STATE_READY) state = v1::MODEL_STATE_FAILED;
  if (info.replicas_size() == 0 && !m.last_error.empty()) {
    auto* rep = info.add_replicas();
    rep->set_state(v1::MODEL_STATE_FAILED);
    rep->set_error(m.last_error);
  }
  info.set_state(state);
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
    ns->set_draining(IsCordoned(n.node_id));
    for (const auto& d : n.devices) *ns->add_devices() = d;
  }
  for (const auto& m : registry_.List()) *state.add_models() = ToModelInfo(m);
  state.set_sessions(sessions_.size());
  return state;
}

absl::StatusOr<Route> Scheduler::RouteRequest(const v1::GenerateRequest& req,
                                              const std::function<bool()>& cancelled,
                                              const std::string& avoid_node) {
  PendingRoute pending;
  if (auto st = BeginRoute(req, avoid_node, &pending); !st.ok()) return st;
  while (true) {
    auto route = TryRoute(req, &pending, cancelled());
    if (!route.ok()) return route.status();
    if (*route) return std::move(**route);
    // Wake when a replica may have appeared; check cancellation at least
    // every 250 ms (no cancellation callback in the synchronous API).
    cluster_.WaitForRoutingChange(pending.version,
                                  std::min(absl::Milliseconds(250), pending.deadline - clock_()));
  }
}

absl::Status Scheduler::BeginRoute(const v1::GenerateRequest& req, const std::string& avoid_node,
                                   PendingRoute* p) {
  // Validated first: a NOT_FOUND message echoes the name, which must be bounded.
  if (auto st = ValidateModelName(req.model()); !st.ok()) return st;
  auto model = registry_.Get(req.model());
  if (!model) {
    return absl::NotFoundError(absl::StrCat(
        "model \"", req.model(), "\" is not registered (ListModels shows the catalogue)"));
  }
  if (auto st = ValidateGenerateRequest(req, model->context_window); !st.ok()) return st;
  // The tenant's quotas, once per request (a failover retry avoids a node).
  const bool first_attempt = avoid_node.empty();
  if (first_attempt) {
    if (auto st = AdmitRequest(req); !st.ok()) return st;
  }
  Route& route = p->route;
  route.model = req.model();
  route.session_id = req.session_id();
  route.ttft_ms = req.slo().ttft_ms()   ? req.slo().ttft_ms()
                  : model->spec.ttft_ms ? model->spec.ttft_ms
                                        : options_.default_ttft_ms;
  route.tpot_ms = req.slo().tpot_ms()   ? req.slo().tpot_ms()
                  : model->spec.tpot_ms ? model->spec.tpot_ms
                                        : options_.default_tpot_ms;
  route.turn_messages.assign(req.messages().begin(), req.messages().end());
  if (!route.session_id.empty()) {
    if (auto st = BeginSessionTurn(req, &route, &p->affinity); !st.ok()) {
      if (first_attempt) quotas_.RefundRequest(req.tenant());  // refused: not charged
      return st;
    }
  }
  registry_.RecordRequest(req.model(), clock_());
  p->avoid_node = avoid_node;
  // The wait is real time (a client is waiting), not policy time.
  p->deadline = absl::Now() + options_.route_wait;
  return absl::OkStatus();
}

absl::StatusOr<std::optional<Route>> Scheduler::TryRoute(const v1::GenerateRequest& req,
                                                         PendingRoute* p, bool cancelled) {
  Route& route = p->route;
  p->version = cluster_.RoutingVersion();  // before the look: no change is missed
  auto nodes = cluster_.NodesWithModel(req.model());
  std::erase(nodes, p->avoid_node);
  std::set<std::string> cordoned;  // draining nodes serve only while no other replica does
  {
    absl::MutexLock lock(&mu_);
    cordoned = cordoned_;
  }
  if (std::any_of(nodes.begin(), nodes.end(),
                  [&](const std::string& n) { return !cordoned.count(n); })) {
    std::erase_if(nodes, [&](const std::string& n) { return cordoned.count(n) > 0; });
  }
  std::optional<std::string> pick;
  if (!p->affinity.empty() && std::find(nodes.begin(), nodes.end(), p->affinity) != nodes.end()) {
    pick = p->affinity;
  } else {
    pick = cluster_.LeastLoaded(nodes);
  }
  if (pick) {
    route.stub = Stub(*pick);
    if (route.stub) {
      route.node_id = *pick;
      route.kv_peer = PeerAddress(p->affinity, *pick);
      cluster_.AddInflight(route.node_id, 1);
      {
        absl::MutexLock lock(&mu_);
        ++inflight_by_model_[route.model];
      }
      return std::optional<Route>(std::move(route));
    }
  }
  absl::Status end;
  const std::optional<ModelStatus> now = registry_.Get(req.model());
  if (!now) {
    end = absl::NotFoundError(
        absl::StrCat("model \"", req.model(), "\" was unregistered while the request waited"));
  } else if (now->failed) {
    end = absl::FailedPreconditionError(
        absl::StrCat("model ", req.model(), " failed to load: ", now->last_error,
                     " (fix the checkpoint or node, then register the model again)"));
  } else if (stop_.HasBeenNotified()) {
    end = absl::UnavailableError("the scheduler is shutting down");
  } else if (absl::Now() >= p->deadline || cancelled) {
    auto m = registry_.Get(req.model());
    end = absl::UnavailableError(absl::StrCat("model ", req.model(), " has no live replica",
                                              m && !m->last_error.empty()
                                                  ? absl::StrCat(" (", m->last_error, ")")
                                                  : std::string(" (no node has loaded it yet)")));
  }
  if (!end.ok()) {
    if (!route.session_id.empty()) sessions_.Abort(route.session_id);
    return end;
  }
  if (!p->kicked) {
    Kick();  // not resident: activate it now, not at the next tick
    p->kicked = true;
  }
  return std::optional<Route>();
}

void Scheduler::AbandonRoute(const PendingRoute& pending) {
  if (!pending.route.session_id.empty()) sessions_.Abort(pending.route.session_id);
}

void Scheduler::AwaitReplica(const PendingRoute& pending, std::function<bool()> cancelled,
                             std::function<void()> wake) {
  waiters_.Park(pending.version, pending.deadline, std::move(cancelled), std::move(wake));
}

absl::Status Scheduler::Complete(const Route& route, const v1::NodeFinal* final) {
  cluster_.AddInflight(route.node_id, -1);
  {
    absl::MutexLock lock(&mu_);
    auto it = inflight_by_model_.find(route.model);
    if (it != inflight_by_model_.end() && --it->second <= 0) inflight_by_model_.erase(it);
  }
  if (route.session_id.empty()) return absl::OkStatus();
  if (!final) {
    sessions_.Abort(route.session_id);
    return absl::OkStatus();
  }
  TurnRecord turn;
  turn.prompt_tokens.assign(final->prompt_tokens().begin(), final->prompt_tokens().end());
  turn.output_tokens.assign(final->output_tokens().begin(), final->output_tokens().end());
  turn.prompt_replaces_history = final->prompt_replaces_history();
  if (!route.turn_messages.empty()) {
    turn.messages = route.turn_messages;
    v1::ChatMessage reply;
    reply.set_role("assistant");
    reply.set_content(final->final().text());
    turn.messages.push_back(std::move(reply));
  }
  return sessions_.Commit(route.session_id, route.node_id, std::move(turn));
}

}  // namespace ballast::global_scheduler
