// node.engine of a config file (server/config.h): the engine defaults and
// the device loop's options, checked, every error naming its key.
// Thread-compatible.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "node_manager/node_manager.h"
#include "yaml-cpp/yaml.h"

namespace ballast::server {

// Reads `engine` (the node.engine mapping of `file`) into `o`: its
// EngineDefaults and the overlap, rolling, ahead and priority options.
absl::Status ParseNodeEngine(const YAML::Node& engine, const std::string* file,
                             node_manager::NodeOptions* o);

}  // namespace ballast::server
