// Admin.DrainNode: cordon a node and move its models away (scheduler.h).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "global_scheduler/placement.h"
#include "global_scheduler/scheduler.h"
#include "spdlog/spdlog.h"

namespace ballast::global_scheduler {

bool Scheduler::IsCordoned(const std::string& node_id) const {
  absl::MutexLock lock(&mu_);
  return cordoned_.count(node_id) > 0;
}

absl::StatusOr<v1::DrainNodeResponse> Scheduler::DrainNode(const std::string& node_id, bool undo) {
  if (!cluster_.Get(node_id)) {
    return absl::NotFoundError(absl::StrCat("node \"", node_id, "\" is not registered"));
  }
  {
    absl::MutexLock lock(&mu_);
    if (undo) {
      if (cordoned_.erase(node_id)) spdlog::info("node {}: drain lifted", node_id);
      return v1::DrainNodeResponse();
    }
    if (cordoned_.insert(node_id).second) spdlog::info("node {}: draining", node_id);
  }
  cluster_.NotifyRoutingChange();  // requests prefer the other replicas now
  auto drains = AdvanceDrains();
  return drains[node_id];
}

std::map<std::string, v1::DrainNodeResponse> Scheduler::AdvanceDrains() {
  std::set<std::string> cordoned;
  std::map<std::string, Migration> moving;
  {
    absl::MutexLock lock(&mu_);
    cordoned = cordoned_;
    moving = migrations_;
  }
  std::map<std::string, v1::DrainNodeResponse> out;
  if (cordoned.empty()) return out;
  const std::vector<NodeInfo> nodes = cluster_.Snapshot();
  for (const NodeInfo& n : nodes) {
    if (!cordoned.count(n.node_id) || !n.alive) continue;
    v1::DrainNodeResponse& r = out[n.node_id];
    for (const auto& m : n.models) {
      if (m.state() != v1::MODEL_STATE_READY) continue;  // loading or leaving already
      auto it = moving.find(m.name());
      if (it != moving.end()) {
        if (it->second.from == n.node_id) r.add_moving(m.name());
        continue;
      }
      // Anywhere but cordoned nodes and those that hold the model already.
      std::set<std::string> exclude = cordoned;
      for (const NodeInfo& other : nodes) {
        for (const auto& om : other.models)
          if (om.name() == m.name()) exclude.insert(other.node_id);
      }
      const std::optional<Target> to = ChooseNodeForLoad(nodes, exclude);
      if (!to || !MigrateModel(m.name(), n.node_id, to->node_id, to->device).ok()) {
        r.add_stuck(m.name());
        continue;
      }
      r.add_moving(m.name());
    }
  }
  return out;
}

}  // namespace ballast::global_scheduler
