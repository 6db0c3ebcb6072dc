// node.memory of a config file (server/config.h): the memory mode, slab
// size, host weight cache and weight remapping (node.memory.remap), checked,
// every error naming its key. Thread-compatible.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "node_manager/node_manager.h"
#include "yaml-cpp/yaml.h"

namespace ballast::server {

// Reads `memory` (the node.memory mapping of `file`) into `o`: memory_mode,
// slab_bytes, host_weight_cache_bytes and remap.
absl::Status ParseNodeMemory(const YAML::Node& memory, const std::string* file,
                             node_manager::NodeOptions* o);

}  // namespace ballast::server
