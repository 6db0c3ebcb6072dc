// The simulator's control plane (simulator.h): placement, activation and
// eviction through the scheduler's own policy functions.
#include <algorithm>
#include <functional>

#include "global_scheduler/idle_eviction.h"
#include "global_scheduler/kvpr.h"
#include "global_scheduler/placement.h"
#include "sim/simulator_impl.h"

namespace ballast::sim {

namespace gs = global_scheduler;

const std::vector<gs::NodeInfo>& Simulator::Nodes() {
  if (nodes_at_.t == events_.now() && nodes_at_.changes == changes_) return nodes_;
  nodes_at_ = {events_.now(), changes_};
  std::vector<gs::NodeInfo>& nodes = nodes_;
  nodes.clear();
  for (const auto& d : devices_) {
    if (nodes.empty() || nodes.back().node_id != d->node_id()) {
      gs::NodeInfo n;
      n.node_id = d->node_id();
      n.alive = true;
      nodes.push_back(std::move(n));
    }
    v1::DeviceState state;
    d->Report(&state, &nodes.back().models);
    nodes.back().devices.push_back(std::move(state));
  }
  return nodes;
}

int Simulator::DeviceIndex(const std::string& node_id, const std::string& device) const {
  for (size_t i = 0; i < devices_.size(); ++i) {
    if (devices_[i]->node_id() == node_id && devices_[i]->name() == device) {
      return static_cast<int>(i);
    }
  }
  return -1;
}

double Simulator::Demand(int m) {
  ModelState& ms = models_[static_cast<size_t>(m)];
  const double window = config_.policy.demand_window_s, now = events_.now();
  while (!ms.window.empty() && ms.window.front().t < now - window) {
    ms.window_prompt -= ms.window.front().prompt;
    ms.window_output -= ms.window.front().output;
    ms.window.pop_front();
  }
  const SimModel& spec = config_.models[static_cast<size_t>(m)];
  return gs::KvDemand(static_cast<double>(ms.window_prompt) / window,
                      static_cast<double>(ms.window_output) / window,
                      static_cast<double>(spec.Part().kv_bytes_per_token()), spec.tpot_ms / 1e3);
}

double Simulator::IdleSeconds(const std::string& model) const {
  auto it = model_index_.find(model);
  if (it == model_index_.end()) return 0;
  return events_.now() - models_[static_cast<size_t>(it->second)].last_request;
}

size_t Simulator::Wanted(int m) const {
  const int replicas = config_.models[static_cast<size_t>(m)].replicas;
  return static_cast<size_t>(std::min(replicas, node_count_));
}

bool Simulator::WantsReplica(int m) const {
  const ModelState& ms = models_[static_cast<size_t>(m)];
  if (ms.devices.size() >= Wanted(m)) return false;
  if (!ms.waiting.empty()) return true;
  return !ms.devices.empty() && events_.now() - ms.last_request < config_.policy.control_interval_s;
}

int Simulator::ReplicaOn(int m, const std::string& node_id) const {
  for (int d : models_[static_cast<size_t>(m)].devices) {
    if (devices_[static_cast<size_t>(d)]->node_id() == node_id) return d;
  }
  return -1;
}

int Simulator::ChooseOne(int m, const std::vector<gs::NodeInfo>& nodes,
                         const std::set<std::string>& exclude) {
  const SimModel& spec = config_.models[static_cast<size_t>(m)];
  const int64_t w = spec.Part().weight_bytes();
  std::optional<gs::Target> t;
  if (config_.policy.placement == Placement::kKvpr) {
    gs::StepBudget budget;
    budget.step_s = [&](const std::string& name) { return NominalStep(model_index_.at(name)); };
    budget.tpot_s = [&](const std::string& name) {
      return config_.models[static_cast<size_t>(model_index_.at(name))].tpot_ms / 1e3;
    };
    budget.new_step_s = NominalStep(m);
    budget.new_tpot_s = spec.tpot_ms / 1e3;
    budget.headroom = config_.policy.step_budget_headroom;
    t = gs::ChooseNodeKvpr(
        nodes, exclude, [&](const std::string& name) { return Demand(model_index_.at(name)); },
        Demand(m), w, &budget);
  } else if (config_.policy.placement == Placement::kMme) {
    auto mu = [&](int i) {
      const SimModel& s = config_.models[static_cast<size_t>(i)];
      return 1.0 / static_cast<double>(s.Part().kv_bytes_per_token());
    };
    t = gs::ChooseNodeMme(
        nodes, exclude, [&](const std::string& name) { return mu(model_index_.at(name)); }, mu(m),
        w);
  } else {
    t = gs::ChooseNodeForLoad(nodes, exclude);
  }
  return t ? DeviceIndex(t->node_id, t->device) : -1;
}

namespace {

// `node` with only the devices `keep` accepts (and the models on them).
gs::NodeInfo OnlyDevices(const gs::NodeInfo& node,
                         const std::function<bool(const std::string& device)>& keep) {
  gs::NodeInfo out = node;
  std::erase_if(out.devices, [&](const v1::DeviceState& d) { return !keep(d.name()); });
  std::erase_if(out.models, [&](const v1::ResidentModel& r) { return !keep(r.device()); });
  return out;
}

}  // namespace

// Tensor parallelism (Prism A.2.2): a replica of tp parts, each with the
// part's weights and demand, placed one after another by the policy, never
// two on one GPU, and all on one node (the all-reduces need NVLink). Only
// GPUs that can take a part's weights are candidates, and only nodes with
// tp of them: the first part goes where the policy puts it among those;
// each further part where the policy puts it among that node's GPUs not
// yet holding one.
std::vector<int> Simulator::Choose(int m) {
  const SimModel& spec = config_.models[static_cast<size_t>(m)];
  const std::vector<gs::NodeInfo>& nodes = Nodes();
  std::set<std::string> exclude;  // anti-affinity: one replica per node
  for (int d : models_[static_cast<size_t>(m)].devices) {
    exclude.insert(devices_[static_cast<size_t>(d)]->node_id());
  }
  if (spec.tp == 1) {
    const int d = ChooseOne(m, nodes, exclude);
    return d < 0 ? std::vector<int>{} : std::vector<int>{d};
  }
  const int64_t w = spec.Part().weight_bytes();
  std::vector<gs::NodeInfo> eligible;
  for (const gs::NodeInfo& n : nodes) {
    if (exclude.count(n.node_id)) continue;
    gs::NodeInfo view = OnlyDevices(n, [&](const std::string& device) {
      return devices_[static_cast<size_t>(DeviceIndex(n.node_id, device))]->CanLoad(w);
    });
    if (static_cast<int>(view.devices.size()) >= spec.tp) eligible.push_back(std::move(view));
  }
  std::vector<int> group;
  const int first = ChooseOne(m, eligible, {});
  if (first < 0) return group;
  group.push_back(first);
  const std::string& node_id = devices_[static_cast<size_t>(first)]->node_id();
  const gs::NodeInfo& node =
      *std::find_if(eligible.begin(), eligible.end(),
                    [&](const gs::NodeInfo& n) { return n.node_id == node_id; });
  while (static_cast<int>(group.size()) < spec.tp) {
    const std::vector<gs::NodeInfo> rest = {OnlyDevices(node, [&](const std::string& device) {
      const int d = DeviceIndex(node_id, device);
      return std::find(group.begin(), group.end(), d) == group.end();
    })};
    const int d = ChooseOne(m, rest, {});
    if (d < 0) return {};
    group.push_back(d);
  }
  return group;
}

bool Simulator::LoadGroup(int m, const std::vector<int>& group) {
  ModelState& ms = models_[static_cast<size_t>(m)];
  const bool revived = devices_[static_cast<size_t>(group[0])]->Load(m);
  for (size_t i = 1; i < group.size(); ++i) {
    devices_[static_cast<size_t>(group[i])]->LoadShadow(m);
    ms.leader_of[group[i]] = group[0];
  }
  if (group.size() > 1) ms.members[group[0]] = {group.begin() + 1, group.end()};
  ms.devices.push_back(group[0]);
  ++changes_;
  return revived;
}

void Simulator::PlaceInitial() {
  // Largest weights first (ties in catalogue order): the big models get
  // the empty GPUs they need before the small ones spread out. Every
  // model's first replica is placed before any model's second.
  std::vector<int> order(models_.size());
  for (size_t m = 0; m < order.size(); ++m) order[m] = static_cast<int>(m);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return config_.models[static_cast<size_t>(a)].shape.weight_bytes() >
           config_.models[static_cast<size_t>(b)].shape.weight_bytes();
  });
  size_t most = 0;
  for (size_t m = 0; m < models_.size(); ++m) most = std::max(most, Wanted(static_cast<int>(m)));
  for (size_t k = 0; k < most; ++k) {
    for (int m : order) {
      // A model whose previous replica found no GPU gets no more.
      if (Wanted(m) <= k || models_[static_cast<size_t>(m)].devices.size() != k) continue;
      const std::vector<int> group = Choose(m);
      const int64_t w = config_.models[static_cast<size_t>(m)].Part().weight_bytes();
      if (group.empty() || !devices_[static_cast<size_t>(group[0])]->CanLoad(w)) continue;
      LoadGroup(m, group);
      for (int d : group) devices_[static_cast<size_t>(d)]->Ready(m);
      ++stats_.initial_placed;
    }
  }
}

void Simulator::Activate(int m) {
  ModelState& ms = models_[static_cast<size_t>(m)];
  if (ms.devices.size() >= Wanted(m) || ms.needs_room) return;
  const std::vector<int> group = Choose(m);
  const ModelShape part = config_.models[static_cast<size_t>(m)].Part();
  if (group.empty() || !devices_[static_cast<size_t>(group[0])]->CanLoad(part.weight_bytes())) {
    ++stats_.load_refusals;  // the node answers RESOURCE_EXHAUSTED: evict from the next tick
    ms.needs_room = true;
    return;
  }
  if (!LoadGroup(m, group)) {
    ++stats_.activations;
    // Each GPU copies its part over its own link, all at once.
    events_.At(events_.now() + engine_.ActivationSeconds(part), [this, group, m] {
      ++changes_;
      for (int d : group) devices_[static_cast<size_t>(d)]->Ready(m);
    });
  }
  std::vector<SimRequest*> waiting;
  waiting.swap(ms.waiting);
  for (SimRequest* r : waiting) Route(r);
}

const std::set<std::string>& Simulator::BusyOrLeaving() {
  if (busy_at_.t == events_.now() && busy_at_.changes == changes_) return busy_;
  busy_at_ = {events_.now(), changes_};
  std::set<std::string>& out = busy_;
  out.clear();
  for (size_t m = 0; m < models_.size(); ++m) {
    // Name-level, as the policies take it: one replica busy or leaving
    // keeps all of the model's replicas.
    bool busy = migration_.model == static_cast<int>(m);
    for (int d : models_[m].devices) {
      const SimDevice& dev = *devices_[static_cast<size_t>(d)];
      busy = busy || dev.Busy(static_cast<int>(m)) ||
             dev.phase(static_cast<int>(m)) == ModelPhase::kDraining;
    }
    if (busy) out.insert(config_.models[m].name);
  }
  return out;
}

void Simulator::MakeRoom(int m) {
  ModelState& ms = models_[static_cast<size_t>(m)];
  std::optional<gs::IdleVictim> victim;
  if (config_.policy.idle_evict_after_s > 0) {
    std::set<std::string> skip = BusyOrLeaving();
    skip.insert(config_.models[static_cast<size_t>(m)].name);
    // Only a node without a replica of m can take the new one: evicting
    // elsewhere would free room m cannot use.
    const std::vector<gs::NodeInfo>* nodes = &Nodes();
    std::vector<gs::NodeInfo> allowed;
    if (!ms.devices.empty()) {
      for (const gs::NodeInfo& n : *nodes) {
        if (ReplicaOn(m, n.node_id) < 0) allowed.push_back(n);
      }
      nodes = &allowed;
    }
    victim = gs::ChooseIdleVictim(
        *nodes, [&](const std::string& name) { return absl::Seconds(IdleSeconds(name)); },
        absl::Seconds(config_.policy.idle_evict_after_s), skip);
  }
  if (!victim) {
    // No model to evict (or eviction off): the refusal may have been KV
    // in use that has drained since; try the load again.
    ms.needs_room = false;
    Activate(m);
    return;
  }
  const int v = model_index_.at(victim->model);
  const int d = ReplicaOn(v, victim->node_id);  // the victim's replica there only
  if (d < 0) return;
  ++changes_;
  ++stats_.idle_evictions;
  models_[static_cast<size_t>(m)].needs_room = false;  // load once the room is there
  devices_[static_cast<size_t>(d)]->Drain(v);
}

void Simulator::RelieveKvPressure() {
  if (config_.policy.idle_evict_after_s <= 0 || config_.policy.kv_pressure_free_fraction <= 0) {
    return;
  }
  auto victim = gs::ChooseKvPressureVictim(
      Nodes(), [&](const std::string& name) { return absl::Seconds(IdleSeconds(name)); },
      absl::Seconds(config_.policy.idle_evict_after_s), BusyOrLeaving(),
      config_.policy.kv_pressure_free_fraction, {});
  if (!victim) return;
  const int v = model_index_.at(victim->model);
  const int d = ReplicaOn(v, victim->node_id);
  if (d < 0) return;
  ++changes_;
  ++stats_.kv_pressure_evictions;
  devices_[static_cast<size_t>(d)]->Drain(v);
}

void Simulator::Tick() {
  if (config_.policy.fixed()) return;
  for (size_t m = 0; m < models_.size(); ++m) {
    ModelState& ms = models_[m];
    if (!WantsReplica(static_cast<int>(m))) continue;
    if (ms.needs_room) {
      MakeRoom(static_cast<int>(m));
    } else {
      Activate(static_cast<int>(m));
    }
  }
  RelieveKvPressure();
  if (config_.policy.placement == Placement::kKvpr && config_.policy.rebalance_interval_s > 0 &&
      events_.now() - last_rebalance_ >= config_.policy.rebalance_interval_s) {
    last_rebalance_ = events_.now();
    Rebalance();
  }
}

void Simulator::Rebalance() {
  if (migration_.model >= 0) return;
  const std::vector<gs::DeviceView> views = gs::DeviceViews(Nodes(), {});
  std::vector<gs::DeviceCapacity> devices;
  for (const auto& v : views) devices.push_back({v.node_id + "/" + v.device, v.memory_bytes});
  std::vector<gs::ModelDemand> models;
  std::vector<int> index;  // catalogue index of models[i]
  for (size_t m = 0; m < models_.size(); ++m) {
    // Only single-replica, single-GPU models move (as the daemon).
    if (config_.models[m].replicas > 1 || config_.models[m].tp > 1 ||
        models_[m].devices.size() != 1) {
      continue;
    }
    const int d = models_[m].devices[0];
    if (devices_[static_cast<size_t>(d)]->phase(static_cast<int>(m)) != ModelPhase::kReady) {
      continue;
    }
    models.push_back({config_.models[m].name, Demand(static_cast<int>(m)),
                      config_.models[m].shape.weight_bytes(), d, NominalStep(static_cast<int>(m)),
                      config_.models[m].tpot_ms / 1e3});
    index.push_back(static_cast<int>(m));
  }
  if (models.size() < 2 || devices.size() < 2) return;
  // The models that do not move (replicated, tensor-parallel, loading or
  // draining) stay where they are: their load is the devices' fixed part.
  std::set<std::string> moving;
  for (const auto& m : models) moving.insert(m.name);
  for (size_t g = 0; g < views.size(); ++g) {
    for (const std::string& name : views[g].models) {
      if (moving.count(name)) continue;
      const int i = model_index_.at(name);
      const SimModel& spec = config_.models[static_cast<size_t>(i)];
      gs::DeviceCapacity& c = devices[g];
      c.fixed_weight_bytes += spec.Part().weight_bytes();
      c.fixed_demand += Demand(i);
      c.fixed_step_s += NominalStep(i);
      c.fixed_tpot_s = gs::TighterTpot(c.fixed_tpot_s, spec.tpot_ms / 1e3);
    }
  }
  const gs::KvprPlacement plan = gs::PlaceKvpr(models, devices, config_.policy.migration_threshold,
                                               config_.policy.step_budget_headroom);
  for (size_t i = 0; i < models.size(); ++i) {
    const int from = models[i].current_device, to = plan.device_of[i];
    if (to < 0 || to == from) continue;
    SimDevice& dest = *devices_[static_cast<size_t>(to)];
    const bool same_node = devices_[static_cast<size_t>(from)]->node_id() == dest.node_id();
    const int m = index[i];
    const ModelShape& shape = config_.models[static_cast<size_t>(m)].shape;
    // One move per rebalance, as the daemon: the first the cluster takes
    // (a move within a node, or to a GPU without room now, is skipped).
    if ((same_node && !config_.policy.migrate_within_node) || !dest.CanLoad(shape.weight_bytes())) {
      continue;
    }
    dest.Load(m);
    ++changes_;
    ++stats_.migrations;
    migration_ = {m, from, to};
    events_.At(events_.now() + engine_.ActivationSeconds(shape), [this] { FinishMigration(); });
    return;
  }
}

void Simulator::FinishMigration() {
  const Migration mv = migration_;
  migration_ = {};
  ++changes_;
  ModelState& ms = models_[static_cast<size_t>(mv.model)];
  SimDevice& source = *devices_[static_cast<size_t>(mv.from)];
  if (ms.devices != std::vector<int>{mv.from} || source.phase(mv.model) != ModelPhase::kReady) {
    // The source changed under the move (evicted, or the model is now
    // elsewhere): give the move up and drop the target's copy.
    devices_[static_cast<size_t>(mv.to)]->Drain(mv.model);
    return;
  }
  devices_[static_cast<size_t>(mv.to)]->Ready(mv.model);
  ms.devices = {mv.to};  // new requests go to the target
  ms.needs_room = false;
  std::vector<SimRequest*> waiting;
  waiting.swap(ms.waiting);
  for (SimRequest* r : waiting) Route(r);
  source.Drain(mv.model);
}

void Simulator::Drained(int d, int m) {
  ++changes_;
  // The replica leaves the model's replicas (a migration's source has
  // left them already; an abandoned target may be one again). A
  // tensor-parallel leader's shadows leave with it (they hold nothing the
  // leader still runs).
  ModelState& left = models_[static_cast<size_t>(m)];
  std::erase(left.devices, d);
  left.leader_of.erase(d);
  if (auto it = left.members.find(d); it != left.members.end()) {
    const std::vector<int> others = it->second;
    left.members.erase(it);
    for (int x : others) {
      left.leader_of.erase(x);
      devices_[static_cast<size_t>(x)]->Drain(m);
    }
  }
  // Memory was freed: every model that wants a replica tries again.
  for (size_t i = 0; i < models_.size(); ++i) {
    ModelState& ms = models_[i];
    if (!WantsReplica(static_cast<int>(i))) continue;
    ms.needs_room = false;
    Activate(static_cast<int>(i));
  }
}

}  // namespace ballast::sim
