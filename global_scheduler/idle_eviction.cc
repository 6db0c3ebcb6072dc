#include "global_scheduler/idle_eviction.h"

#include <algorithm>
#include <tuple>

#include "global_scheduler/placement.h"

namespace ballast::global_scheduler {

std::optional<IdleVictim> ChooseIdleVictim(
    const std::vector<NodeInfo>& nodes,
    const std::function<absl::Duration(const std::string&)>& idle, absl::Duration threshold,
    const std::set<std::string>& skip) {
  std::optional<IdleVictim> best;
  // Sort key: longer idle, larger weights, lower node id, lower name.
  std::tuple<absl::Duration, int64_t> best_key;
  for (const auto& n : nodes) {
    if (!n.alive) continue;
    for (const auto& m : n.models) {
      if (m.state() != v1::MODEL_STATE_READY || skip.count(m.name())) continue;
      const absl::Duration d = idle(m.name());
      if (d < threshold) continue;
      const auto key = std::make_tuple(d, m.weight_bytes());
      const bool better =
          !best || key > best_key ||
          (key == best_key && std::tie(n.node_id, m.name()) < std::tie(best->node_id, best->model));
      if (better) {
        best = IdleVictim{m.name(), n.node_id};
        best_key = key;
      }
    }
  }
  return best;
}

std::string DeviceKey(const std::string& node_id, const std::string& device) {
  return node_id + "/" + device;
}

std::optional<IdleVictim> ChooseKvPressureVictim(
    const std::vector<NodeInfo>& nodes,
    const std::function<absl::Duration(const std::string&)>& idle, absl::Duration threshold,
    const std::set<std::string>& skip, double free_fraction, const std::set<std::string>& held) {
  std::optional<IdleVictim> best;
  int64_t best_free = 0;
  for (const auto& n : nodes) {
    if (!n.alive) continue;
    for (const v1::DeviceState& d : n.devices) {
      const int64_t free = d.kv_bytes_free() + d.kv_bytes_lendable();
      if (!d.elastic() || d.queue_length() <= 0 ||
          static_cast<double>(free) >=
              free_fraction * static_cast<double>(d.memory_total_bytes()) ||
          held.count(DeviceKey(n.node_id, d.name()))) {
        continue;
      }
      if (best && free >= best_free) continue;
      NodeInfo on_device = n;  // only the replicas on this device
      std::erase_if(on_device.models,
                    [&](const v1::ResidentModel& m) { return m.device() != d.name(); });
      if (std::any_of(on_device.models.begin(), on_device.models.end(),
                      [](const auto& m) { return m.state() == v1::MODEL_STATE_LOADING; })) {
        continue;
      }
      if (auto v = ChooseIdleVictim({on_device}, idle, threshold, skip)) {
        best = v;
        best_free = free;
      }
    }
  }
  return best;
}

bool HasWeightRoom(const NodeInfo& node, int64_t weight_bytes) {
  NodeInfo live = node;
  live.alive = true;
  for (const DeviceView& d : DeviceViews({live}, {})) {
    if (d.memory_bytes - d.weight_bytes - weight_bytes > 0) return true;
  }
  return false;
}

}  // namespace ballast::global_scheduler
