// Placement of model replicas onto devices. Every policy works per device
// (one GPU of one node), as Prism and FineServe define their scores: a node
// with 8 GPUs is 8 candidates, never one big GPU, and a model whose weights
// fit no single device of a node does not fit that node.
//
// Policies (scheduler.placement_policy):
//   most_free  the device with the most free memory (the baseline);
//   kvpr       the lowest resulting KV pressure (Prism §6.1, one step of
//              Algorithm 1, kvpr.h);
//   mme        FineServe's marginal-memory-efficiency score (§6.2, eq. 3).
// Ties go to the device with fewer resident models, then the lower node
// id, then the lower device name. Pure functions; thread-safe.
#pragma once

#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "global_scheduler/cluster_state.h"

namespace ballast::global_scheduler {

// Where a replica goes.
struct Target {
  std::string node_id;
  std::string device;
  bool operator==(const Target&) const = default;
};

// One device of a live node as placement sees it.
struct DeviceView {
  std::string node_id;
  std::string device;
  int64_t memory_bytes = 0;  // the device's budget (weights + KV)
  int64_t used_bytes = 0;    // what the node reported in use
  int64_t weight_bytes = 0;  // weights of the models resident on it
  std::vector<std::string> models;
  int64_t free_bytes() const { return memory_bytes - used_bytes; }
};

// The devices of the live nodes not in `exclude`, with each resident model
// counted on its reported device. A model whose device the node did not
// report (a placeholder without one, or an unknown name) counts on the
// node's first device.
std::vector<DeviceView> DeviceViews(const std::vector<NodeInfo>& nodes,
                                    const std::set<std::string>& exclude);

// `exclude`: nodes that hold the model or are already loading it.
std::optional<Target> ChooseNodeForLoad(const std::vector<NodeInfo>& nodes,
                                        const std::set<std::string>& exclude);

// KVPR of one replica: the candidate device with the lowest KV pressure
// after adding the model,
//   KVPR(g) = (sum of d_m over g's models + new_demand)
//             / (memory of g - their weight bytes - new_weight_bytes)
// (devices where that room is <= 0 are skipped). d_m comes from `demand`
// (bytes/s^2, kvpr.h's KvDemand), weights from what the nodes reported.
//
// With a step budget (kvpr.h's StepBudgetHolds), devices where it holds
// after adding the model come first.
struct StepBudget {
  std::function<double(const std::string&)> step_s;  // a resident model's step time
  std::function<double(const std::string&)> tpot_s;  // its TPOT SLO (0: none)
  double new_step_s = 0, new_tpot_s = 0;             // the model placed
  double headroom = 1.0;
};
std::optional<Target> ChooseNodeKvpr(const std::vector<NodeInfo>& nodes,
                                     const std::set<std::string>& exclude,
                                     const std::function<double(const std::string&)>& demand,
                                     double new_demand, int64_t new_weight_bytes,
                                     const StepBudget* budget = nullptr);

// FineServe's score for one replica: the candidate device with the highest
//   score(g | M) = (1 / |g'|) * sum over g' of mu_m * K_rem(g'),
//   K_rem(g') = memory of g - sum over g' of F_m,
// where g' is g's models plus the new one, mu_m is the model's marginal
// memory efficiency (tokens per KV byte: 1 / KV bytes per token, so FP8 KV
// counts twice BF16) and F_m its base footprint. Ballast charges F_m = the
// weight bytes (the paper adds profiled average activations and KV, which
// this scheduler does not profile yet). Devices whose K_rem <= 0 are
// skipped.
std::optional<Target> ChooseNodeMme(const std::vector<NodeInfo>& nodes,
                                    const std::set<std::string>& exclude,
                                    const std::function<double(const std::string&)>& mu,
                                    double new_mu, int64_t new_weight_bytes);

}  // namespace ballast::global_scheduler
