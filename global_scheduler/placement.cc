#include "global_scheduler/placement.h"

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

}  // namespace ballast::global_scheduler
