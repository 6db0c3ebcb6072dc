#include "global_scheduler/cluster_state.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace ballast::global_scheduler {

ClusterState::ClusterState(absl::Duration heartbeat_timeout, Clock clock)
    : timeout_(heartbeat_timeout), clock_(std::move(clock)) {}

absl::Status ClusterState::Register(const v1::RegisterNodeRequest& req, bool replace_live) {
  absl::MutexLock lock(&mu_);
  NodeInfo& n = nodes_[req.node_id()];
  if (n.alive && !replace_live && n.incarnation != req.incarnation() &&
      n.address != req.address()) {
    return absl::AlreadyExistsError(
        absl::StrCat("node id \"", req.node_id(), "\" is already registered by a live node at ",
                     n.address, " (incarnation ", n.incarnation.empty() ? "unknown" : n.incarnation,
                     "); give this node another --node-id, or stop that node first"));
  }
  const int inflight = n.inflight;
  n = NodeInfo();
  n.node_id = req.node_id();
  n.address = req.address();
  n.incarnation = req.incarnation();
  n.alive = true;
  n.last_heartbeat = clock_();
  n.devices.assign(req.devices().begin(), req.devices().end());
  n.models.assign(req.models().begin(), req.models().end());
  n.inflight = inflight;
  n.generation = ++generation_;
  ++routing_version_;
  return absl::OkStatus();
}

namespace {
// Whether two model lists route differently (names, states or devices).
bool RoutingDiffers(const std::vector<v1::ResidentModel>& a,
                    const google::protobuf::RepeatedPtrField<v1::ResidentModel>& b) {
  if (a.size() != static_cast<size_t>(b.size())) return true;
  for (size_t i = 0; i < a.size(); ++i) {
    const auto& y = b[static_cast<int>(i)];
    if (a[i].name() != y.name() || a[i].state() != y.state() || a[i].device() != y.device()) {
      return true;
    }
  }
  return false;
}
}  // namespace

HeartbeatResult ClusterState::Heartbeat(const v1::HeartbeatRequest& req) {
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(req.node_id());
  if (it != nodes_.end() && !it->second.incarnation.empty() && !req.incarnation().empty() &&
      it->second.incarnation != req.incarnation()) {
    return HeartbeatResult::kReplaced;
  }
  if (it == nodes_.end() || !it->second.alive) return HeartbeatResult::kReregister;
  NodeInfo& n = it->second;
  n.last_heartbeat = clock_();
  if (n.suspect) {
    n.suspect = false;
    ++routing_version_;
  }
  n.devices.assign(req.devices().begin(), req.devices().end());
  if (RoutingDiffers(n.models, req.models())) ++routing_version_;
  n.models.assign(req.models().begin(), req.models().end());
  n.reported_inflight = req.inflight_requests();
  return HeartbeatResult::kOk;
}

void ClusterState::MarkSuspect(const std::string& node_id) {
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(node_id);
  if (it == nodes_.end() || !it->second.alive || it->second.suspect) return;
  it->second.suspect = true;
  ++routing_version_;
}

void ClusterState::NotifyRoutingChange() {
  absl::MutexLock lock(&mu_);
  ++routing_version_;
}

std::vector<std::string> ClusterState::SweepDead() {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> dead;
  const absl::Time now = clock_();
  for (auto& [id, n] : nodes_) {
    if (n.alive && now - n.last_heartbeat > timeout_) {
      n.alive = false;
      n.models.clear();
      dead.push_back(id);
      ++routing_version_;
    }
  }
  return dead;
}

void ClusterState::AddResident(const std::string& node_id, const v1::ResidentModel& m) {
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(node_id);
  if (it == nodes_.end()) return;
  auto& models = it->second.models;
  ++routing_version_;
  for (auto& existing : models) {
    if (existing.name() == m.name()) {
      existing = m;
      return;
    }
  }
  models.push_back(m);
}

void ClusterState::RemoveResident(const std::string& node_id, const std::string& model) {
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(node_id);
  if (it == nodes_.end()) return;
  auto& models = it->second.models;
  ++routing_version_;
  models.erase(std::remove_if(models.begin(), models.end(),
                              [&](const v1::ResidentModel& m) { return m.name() == model; }),
               models.end());
}

void ClusterState::SetResidentState(const std::string& node_id, const std::string& model,
                                    v1::ModelState state) {
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(node_id);
  if (it == nodes_.end()) return;
  for (auto& m : it->second.models) {
    if (m.name() == model) m.set_state(state);
  }
  ++routing_version_;
}

std::vector<std::string> ClusterState::NodesWithModel(const std::string& model) const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> out;
  for (const auto& [id, n] : nodes_) {
    if (!n.alive || n.suspect) continue;
    for (const auto& m : n.models) {
      if (m.name() == model && m.state() == v1::MODEL_STATE_READY) {
        out.push_back(id);
        break;
      }
    }
  }
  return out;
}

std::optional<std::string> ClusterState::LeastLoaded(
    const std::vector<std::string>& candidates) const {
  absl::MutexLock lock(&mu_);
  std::optional<std::string> best;
  int best_load = 0;
  for (const auto& id : candidates) {
    auto it = nodes_.find(id);
    if (it == nodes_.end() || !it->second.alive) continue;
    int queued = 0;
    for (const auto& d : it->second.devices) queued += d.queue_length();
    const int load = it->second.inflight + queued;
    if (!best || load < best_load || (load == best_load && id < *best)) {
      best = id;
      best_load = load;
    }
  }
  return best;
}

std::vector<std::string> ClusterState::LiveNodes() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> out;
  for (const auto& [id, n] : nodes_)
    if (n.alive) out.push_back(id);
  return out;
}

bool ClusterState::IsAlive(const std::string& node_id) const {
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(node_id);
  return it != nodes_.end() && it->second.alive;
}

std::optional<NodeInfo> ClusterState::Get(const std::string& node_id) const {
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(node_id);
  if (it == nodes_.end()) return std::nullopt;
  return it->second;
}

std::vector<NodeInfo> ClusterState::Snapshot() const {
  absl::MutexLock lock(&mu_);
  std::vector<NodeInfo> out;
  for (const auto& [id, n] : nodes_) out.push_back(n);
  return out;
}

void ClusterState::AddInflight(const std::string& node_id, int delta) {
  absl::MutexLock lock(&mu_);
  auto it = nodes_.find(node_id);
  if (it != nodes_.end()) it->second.inflight += delta;
}

uint64_t ClusterState::RoutingVersion() const {
  absl::MutexLock lock(&mu_);
  return routing_version_;
}

uint64_t ClusterState::WaitForRoutingChange(uint64_t seen, absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto changed = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return routing_version_ != seen; };
  mu_.AwaitWithTimeout(absl::Condition(&changed), timeout);
  return routing_version_;
}

}  // namespace ballast::global_scheduler
