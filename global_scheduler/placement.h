// Placement of model replicas onto nodes (the baseline policy until KVPR and
// MME land): a model that lacks replicas goes to the live node that does not
// hold it yet with the most free device memory; ties go to the node with
// fewer resident models, then to the lower node id. Pure function;
// thread-safe.
#pragma once

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

}  // namespace ballast::global_scheduler
