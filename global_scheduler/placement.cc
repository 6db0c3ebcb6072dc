#include "global_scheduler/placement.h"

#include <limits>

namespace ballast::global_scheduler {

int64_t FreeMemory(const NodeInfo& node) {
  int64_t free = 0;
  for (const auto& d : node.devices) free += d.memory_total_bytes() - d.memory_used_bytes();
  return free;
}

std::optional<std::string> ChooseNodeForLoad(const std::vector<NodeInfo>& nodes,
                                             const std::set<std::string>& exclude) {
  const NodeInfo* best = nullptr;
  for (const auto& n : nodes) {
    if (!n.alive || exclude.count(n.node_id)) continue;
    if (best == nullptr) {
      best = &n;
      continue;
    }
    const int64_t fa = FreeMemory(n), fb = FreeMemory(*best);
    if (fa != fb) {
      if (fa > fb) best = &n;
    } else if (n.models.size() != best->models.size()) {
      if (n.models.size() < best->models.size()) best = &n;
    } else if (n.node_id < best->node_id) {
      best = &n;
    }
  }
  if (best == nullptr) return std::nullopt;
  return best->node_id;
}

std::optional<std::string> ChooseNodeKvpr(const std::vector<NodeInfo>& nodes,
                                          const std::set<std::string>& exclude,
                                          const std::function<double(const std::string&)>& demand,
                                          double new_demand, int64_t new_weight_bytes) {
  std::vector<NodeInfo> best_nodes;
  double best = std::numeric_limits<double>::infinity();
  for (const auto& n : nodes) {
    if (!n.alive || exclude.count(n.node_id)) continue;
    int64_t memory = 0, weights = new_weight_bytes;
    for (const auto& d : n.devices) memory += d.memory_total_bytes();
    double d_sum = new_demand;
    for (const auto& m : n.models) {
      weights += m.weight_bytes();
      d_sum += demand(m.name());
    }
    const int64_t room = memory - weights;
    if (room <= 0) continue;
    const double kvpr = d_sum / static_cast<double>(room);
    if (kvpr < best) {
      best = kvpr;
      best_nodes.clear();
    }
    if (kvpr == best) best_nodes.push_back(n);
  }
  if (best_nodes.empty()) return std::nullopt;
  return ChooseNodeForLoad(best_nodes, {});
}

std::optional<std::string> ChooseNodeMme(const std::vector<NodeInfo>& nodes,
                                         const std::set<std::string>& exclude,
                                         const std::function<double(const std::string&)>& mu,
                                         double new_mu, int64_t new_weight_bytes) {
  std::vector<NodeInfo> best_nodes;
  double best = -std::numeric_limits<double>::infinity();
  for (const auto& n : nodes) {
    if (!n.alive || exclude.count(n.node_id)) continue;
    int64_t memory = 0, footprint = new_weight_bytes;
    for (const auto& d : n.devices) memory += d.memory_total_bytes();
    double mu_sum = new_mu;
    for (const auto& m : n.models) {
      footprint += m.weight_bytes();
      mu_sum += mu(m.name());
    }
    const int64_t k_rem = memory - footprint;
    if (k_rem <= 0) continue;
    const double score =
        mu_sum / static_cast<double>(n.models.size() + 1) * static_cast<double>(k_rem);
    if (score > best) {
      best = score;
      best_nodes.clear();
    }
    if (score == best) best_nodes.push_back(n);
  }
  if (best_nodes.empty()) return std::nullopt;
  return ChooseNodeForLoad(best_nodes, {});
}

}  // namespace ballast::global_scheduler
