// The simulator's control plane (simulator.h): placement, activation and
// eviction through the scheduler's own policy functions.
#include <algorithm>

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
                      static_cast<double>(spec.shape.kv_bytes_per_token()), spec.tpot_ms / 1e3);
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

int Simulator::Choose(int m) {
  const SimModel& spec = config_.models[static_cast<size_t>(m)];
  const std::vector<gs::NodeInfo>& nodes = Nodes();
  std::set<std::string> exclude;  // anti-affinity: one replica per node
  for (int d : models_[static_cast<size_t>(m)].devices) {
    exclude.insert(devices_[static_cast<size_t>(d)]->node_id());
  }
  const int64_t w = spec.shape.weight_bytes();
  std::optional<gs::Target> t;
  if (config_.policy.placement == "kvpr") {
    t = gs::ChooseNodeKvpr(
        nodes, exclude, [&](const std::string& name) { return Demand(model_index_.at(name)); },
        Demand(m), w);
  } else if (config_.policy.placement == "mme") {
    auto mu = [&](int i) {
      return 1.0 /
             static_cast<double>(config_.models[static_cast<size_t>(i)].shape.kv_bytes_per_token());
    };
    t = gs::ChooseNodeMme(
        nodes, exclude, [&](const std::string& name) { return mu(model_index_.at(name)); }, mu(m),
        w);
  } else {
    t = gs::ChooseNodeForLoad(nodes, exclude);
  }
  return t ? DeviceIndex(t->node_id, t->device) : -1;
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
      const int d = Choose(m);
      if (d < 0) continue;
      SimDevice& dev = *devices_[static_cast<size_t>(d)];
      if (!dev.CanLoad(config_.models[static_cast<size_t>(m)].shape.weight_bytes())) continue;
      dev.Load(m);
      dev.Ready(m);
      ++changes_;
      models_[static_cast<size_t>(m)].devices.push_back(d);
      ++stats_.initial_placed;
    }
  }
}

void Simulator::Activate(int m) {
  ModelState& ms = models_[static_cast<size_t>(m)];
  if (ms.devices.size() >= Wanted(m) || ms.needs_room) return;
  const int d = Choose(m);
  const ModelShape& shape = config_.models[static_cast<size_t>(m)].shape;
  if (d < 0 || !devices_[static_cast<size_t>(d)]->CanLoad(shape.weight_bytes())) {
    ++stats_.load_refusals;  // the node answers RESOURCE_EXHAUSTED: evict from the next tick
    ms.needs_room = true;
    return;
  }
  const bool revived = devices_[static_cast<size_t>(d)]->Load(m);
  ++changes_;
  ms.devices.push_back(d);
  if (!revived) {
    ++stats_.activations;
    events_.At(events_.now() + engine_.ActivationSeconds(shape), [this, d, m] {
      ++changes_;
      devices_[static_cast<size_t>(d)]->Ready(m);
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
  if (config_.policy.placement == "kvpr" && config_.policy.rebalance_interval_s > 0 &&
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
    // Only single-replica models move (as the daemon).
    if (config_.models[m].replicas > 1 || models_[m].devices.size() != 1) continue;
    const int d = models_[m].devices[0];
    if (devices_[static_cast<size_t>(d)]->phase(static_cast<int>(m)) != ModelPhase::kReady) {
      continue;
    }
    models.push_back({config_.models[m].name, Demand(static_cast<int>(m)),
                      config_.models[m].shape.weight_bytes(), d});
    index.push_back(static_cast<int>(m));
  }
  if (models.size() < 2 || devices.size() < 2) return;
  const gs::KvprPlacement plan = gs::PlaceKvpr(models, devices, config_.policy.migration_threshold);
  for (size_t i = 0; i < models.size(); ++i) {
    const int from = models[i].current_device, to = plan.device_of[i];
    if (to < 0 || to == from) continue;
    SimDevice& dest = *devices_[static_cast<size_t>(to)];
    const bool same_node = devices_[static_cast<size_t>(from)]->node_id() == dest.node_id();
    const int m = index[i];
    const ModelShape& shape = config_.models[static_cast<size_t>(m)].shape;
    // One move per rebalance, as the daemon; a refused one waits for the next.
    if ((same_node && !config_.policy.migrate_within_node) || !dest.CanLoad(shape.weight_bytes())) {
      return;
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
  // left them already; an abandoned target may be one again).
  std::erase(models_[static_cast<size_t>(m)].devices, d);
  // Memory was freed: every model that wants a replica tries again.
  for (size_t i = 0; i < models_.size(); ++i) {
    ModelState& ms = models_[i];
    if (!WantsReplica(static_cast<int>(i))) continue;
    ms.needs_room = false;
    Activate(static_cast<int>(i));
  }
}

}  // namespace ballast::sim
