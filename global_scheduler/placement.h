// Placement of model replicas onto nodes (the baseline policy until KVPR and
// MME land): a model that lacks replicas goes to the live node that does not
// hold it yet with the most free device memory; ties go to the node with
// fewer resident models, then to the lower node id. Pure function;
// thread-safe.
#pragma once

#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "global_scheduler/cluster_state.h"

namespace ballast::global_scheduler {

// `exclude`: nodes that hold the model or are already loading it.
std::optional<std::string> ChooseNodeForLoad(const std::vector<NodeInfo>& nodes,
                                             const std::set<std::string>& exclude);

// Free device memory a node reported (sum over its devices).
int64_t FreeMemory(const NodeInfo& node);

// KVPR placement of one replica (Prism §6.1, one step of Algorithm 1): the
// candidate node with the lowest KV pressure after adding the model,
//   KVPR(n) = (sum of d_m over n's models + new_demand)
//             / (memory of n - their weight bytes - new_weight_bytes)
// (+infinity when that room is <= 0; such nodes are skipped). d_m comes
// from `demand` (bytes/s^2, kvpr.h's KvDemand), weights from what the node
// reported. Ties go as ChooseNodeForLoad orders them.
std::optional<std::string> ChooseNodeKvpr(const std::vector<NodeInfo>& nodes,
                                          const std::set<std::string>& exclude,
                                          const std::function<double(const std::string&)>& demand,
                                          double new_demand, int64_t new_weight_bytes);

// FineServe's placement score (§6.2, eq. 3) for one replica: the candidate
// node with the highest
//   score(n | M) = (1 / |n'|) * sum over n' of mu_m * K_rem(n'),
//   K_rem(n') = memory of n - sum over n' of F_m,
// where n' is n's models plus the new one, mu_m is the model's marginal
// memory efficiency (tokens per KV byte: 1 / KV bytes per token, so FP8 KV
// counts twice BF16) and F_m its base footprint. Ballast charges F_m = the
// weight bytes (the paper adds profiled average activations and KV, which
// this scheduler does not profile yet). Nodes whose K_rem <= 0 are skipped;
// ties go as ChooseNodeForLoad orders them.
std::optional<std::string> ChooseNodeMme(const std::vector<NodeInfo>& nodes,
                                         const std::set<std::string>& exclude,
                                         const std::function<double(const std::string&)>& mu,
                                         double new_mu, int64_t new_weight_bytes);

}  // namespace ballast::global_scheduler
