#include "global_scheduler/placement.h"

#include <limits>
#include <tuple>

#include "global_scheduler/kvpr.h"

namespace ballast::global_scheduler {

std::vector<DeviceView> DeviceViews(const std::vector<NodeInfo>& nodes,
                                    const std::set<std::string>& exclude) {
  std::vector<DeviceView> out;
  for (const auto& n : nodes) {
    if (!n.alive || exclude.count(n.node_id) || n.devices.empty()) continue;
    const size_t first = out.size();
    for (const auto& d : n.devices) {
      DeviceView v;
      v.node_id = n.node_id;
      v.device = d.name();
      v.memory_bytes = d.memory_total_bytes();
      v.used_bytes = d.memory_used_bytes();
      out.push_back(std::move(v));
    }
    for (const auto& m : n.models) {
      DeviceView* on = &out[first];
      for (size_t i = first; i < out.size(); ++i) {
        if (out[i].device == m.device()) on = &out[i];
      }
      on->weight_bytes += m.weight_bytes();
      on->models.push_back(m.name());
    }
  }
  return out;
}

namespace {

// The baseline order: more free memory, fewer models, lower node id, lower
// device name. True if `a` goes before `b`.
bool BaselineBefore(const DeviceView& a, const DeviceView& b) {
  if (a.free_bytes() != b.free_bytes()) return a.free_bytes() > b.free_bytes();
  if (a.models.size() != b.models.size()) return a.models.size() < b.models.size();
  return std::tie(a.node_id, a.device) < std::tie(b.node_id, b.device);
}

// The device with the highest `score` (nullopt scores are skipped); ties
// in the baseline order.
std::optional<Target> Best(const std::vector<DeviceView>& devices,
                           const std::function<std::optional<double>(const DeviceView&)>& score) {
  const DeviceView* best = nullptr;
  double best_score = -std::numeric_limits<double>::infinity();
  for (const auto& d : devices) {
    const std::optional<double> s = score(d);
    if (!s) continue;
    if (best == nullptr || *s > best_score || (*s == best_score && BaselineBefore(d, *best))) {
      best = &d;
      best_score = *s;
    }
  }
  if (best == nullptr) return std::nullopt;
  return Target{best->node_id, best->device};
}

}  // namespace

std::optional<Target> ChooseNodeForLoad(const std::vector<NodeInfo>& nodes,
                                        const std::set<std::string>& exclude) {
  return Best(DeviceViews(nodes, exclude),
              [](const DeviceView&) -> std::optional<double> { return 0.0; });
}

std::optional<Target> ChooseNodeKvpr(const std::vector<NodeInfo>& nodes,
                                     const std::set<std::string>& exclude,
                                     const std::function<double(const std::string&)>& demand,
                                     double new_demand, int64_t new_weight_bytes,
                                     const StepBudget* budget) {
  const std::vector<DeviceView> views = DeviceViews(nodes, exclude);
  auto within = [&](const DeviceView& d) {
    double steps = budget->new_step_s, tightest = budget->new_tpot_s;
    for (const auto& m : d.models) {
      steps += budget->step_s(m);
      tightest = TighterTpot(tightest, budget->tpot_s(m));
    }
    return StepBudgetHolds(steps, tightest, budget->headroom);
  };
  auto kvpr = [&](const DeviceView& d, bool only_within) -> std::optional<double> {
    const int64_t room = d.memory_bytes - d.weight_bytes - new_weight_bytes;
    if (room <= 0 || (only_within && !within(d))) return std::nullopt;
    double d_sum = new_demand;
    for (const auto& m : d.models) d_sum += demand(m);
    return -d_sum / static_cast<double>(room);  // lowest KVPR scores highest
  };
  if (budget != nullptr && budget->headroom > 0) {
    auto t = Best(views, [&](const DeviceView& d) { return kvpr(d, true); });
    if (t) return t;
  }
  return Best(views, [&](const DeviceView& d) { return kvpr(d, false); });
}

std::optional<Target> ChooseNodeMme(const std::vector<NodeInfo>& nodes,
                                    const std::set<std::string>& exclude,
                                    const std::function<double(const std::string&)>& mu,
                                    double new_mu, int64_t new_weight_bytes) {
  return Best(DeviceViews(nodes, exclude), [&](const DeviceView& d) -> std::optional<double> {
    const int64_t k_rem = d.memory_bytes - d.weight_bytes - new_weight_bytes;
    if (k_rem <= 0) return std::nullopt;
    double mu_sum = new_mu;
    for (const auto& m : d.models) mu_sum += mu(m);
    return mu_sum / static_cast<double>(d.models.size() + 1) * static_cast<double>(k_rem);
  });
}

}  // namespace ballast::global_scheduler
