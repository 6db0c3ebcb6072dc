// The scheduler's moves of a model between nodes: live migration
// (MigrateModel, then AdvanceMigrations on each tick) and KVPR rebalancing
// (MaybeRebalance, Rebalance: Prism's Algorithm 1 over the catalogue, one
// move at a time). See scheduler.h for the order and its rules.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "global_scheduler/kvpr.h"
#include "global_scheduler/scheduler.h"
#include "spdlog/spdlog.h"

namespace ballast::global_scheduler {

void Scheduler::MaybeRebalance() {
  if (options_.placement_policy != "kvpr" || options_.rebalance_interval <= absl::ZeroDuration() ||
      clock_() - last_rebalance_ < options_.rebalance_interval) {
    return;
  }
  last_rebalance_ = clock_();
  Rebalance();
}

absl::Status Scheduler::MigrateModel(const std::string& model, const std::string& from_node,
                                     const std::string& to_node, const std::string& to_device) {
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
  if (auto n = cluster_.Get(to_node)) {
    for (const auto& r : n->models) {
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
    migrations_[model] = Migration{from_node, to_node, to_device, false};
  }
  spdlog::info("migrating model {} from node {} to node {} {}", model, from_node, to_node,
               to_device);
  StartLoad(m->spec, Target{to_node, to_device});  // the source keeps serving meanwhile
  {
    absl::MutexLock lock(&mu_);
    if (auto it = migrations_.find(model); it != migrations_.end()) it->second.load_started = true;
  }
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
      done = mv.load_started && !pending_.count(PendingKey{PendingKind::kLoad, model, mv.to});
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
  // Whole-catalogue KVPR placement over the live devices (Prism Algorithm
  // 1, kvpr.h, per GPU); single-replica models READY somewhere take part.
  {
    absl::MutexLock lock(&mu_);
    if (!migrations_.empty()) return;  // one move at a time
  }
  std::set<std::string> cordoned;
  {
    absl::MutexLock lock(&mu_);
    cordoned = cordoned_;
  }
  const std::vector<DeviceView> views = DeviceViews(cluster_.Snapshot(), cordoned);
  std::vector<DeviceCapacity> devices;
  std::map<std::pair<std::string, std::string>, int> index;  // (node, device) -> index
  std::map<std::string, int> where;                          // model -> device index
  for (const DeviceView& v : views) {
    const int i = static_cast<int>(devices.size());
    index[{v.node_id, v.device}] = i;
    devices.push_back({absl::StrCat(v.node_id, "/", v.device), v.memory_bytes});
    for (const auto& m : v.models) where[m] = where.count(m) ? -1 : i;  // -1: several replicas
  }
  std::vector<ModelDemand> models;
  for (const ModelStatus& m : registry_.List()) {
    if (m.spec.replicas != 1 || m.weight_bytes <= 0) continue;
    const auto ready = cluster_.NodesWithModel(m.spec.name);
    auto it = where.find(m.spec.name);
    if (ready.size() != 1 || it == where.end() || it->second < 0) continue;
    models.push_back({m.spec.name, Demand(m.spec.name), m.weight_bytes, it->second,
                      m.decode_step_ms / 1000.0, TpotSeconds(m.spec.name)});
  }
  if (models.size() < 2 || devices.size() < 2) return;
  // Models that do not move (replicated ones, or not ready) keep their
  // device's memory and demand: the fixed part of its load.
  std::map<std::string, int64_t> moving;  // name -> weight bytes
  for (const auto& m : models) moving[m.name] = m.weight_bytes;
  for (size_t g = 0; g < views.size(); ++g) {
    int64_t listed = 0;
    for (const auto& name : views[g].models) {
      auto it = moving.find(name);
      if (it != moving.end()) {
        listed += it->second;
        continue;
      }
      DeviceCapacity& c = devices[g];
      c.fixed_demand += Demand(name);
      c.fixed_step_s += StepSeconds(name);
      c.fixed_tpot_s = TighterTpot(c.fixed_tpot_s, TpotSeconds(name));
    }
    devices[g].fixed_weight_bytes = std::max<int64_t>(0, views[g].weight_bytes - listed);
  }
  const KvprPlacement plan =
      PlaceKvpr(models, devices, options_.migration_threshold, options_.step_budget_headroom);
  std::vector<int> current;
  for (const auto& m : models) current.push_back(m.current_device);
  for (size_t i = 0; i < models.size(); ++i) {
    const int to = plan.device_of[i];
    if (to < 0 || to == models[i].current_device) continue;
    spdlog::info("KVPR rebalance: max KVPR {:.3g} -> {:.3g} by moving {} to {}",
                 MaxKvpr(models, devices, current), plan.max_kvpr, models[i].name,
                 devices[to].name);
    const DeviceView& from = views[static_cast<size_t>(models[i].current_device)];
    const DeviceView& dest = views[static_cast<size_t>(to)];
    absl::Status st = absl::OkStatus();
    if (from.node_id == dest.node_id) {
      // Between two GPUs of one node: MigrateModel moves across nodes only
      // (a replica per node); leave it where it is.
      st = absl::UnimplementedError("moving a model between GPUs of one node");
    } else {
      st = MigrateModel(models[i].name, from.node_id, dest.node_id, dest.device);
    }
    if (!st.ok()) {  // refused: the plan's next move may still be taken
      spdlog::warn("KVPR rebalance of {} not started: {}", models[i].name,
                   std::string(st.message()));
      continue;
    }
    break;  // one move per rebalance
  }
}

}  // namespace ballast::global_scheduler
