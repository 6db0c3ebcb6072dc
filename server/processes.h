// The long-running subcommands: `ballast scheduler`, `ballast node` and the
// embedded `ballast serve` (a scheduler and one node in one process, with
// synthetic models generated into a cache directory on first start).
//
// Shutdown order (on SIGINT/SIGTERM): mark health NOT_SERVING; stop the
// node's heartbeats; shut the gRPC servers down (in-flight streams get 5 s
// to finish); stop the scheduler's control loop; stop the device workers
// (remaining requests fail UNAVAILABLE); stop the metrics endpoint.
#pragma once

#include <memory>
#include <string>

#include "server/config.h"

namespace ballast::server {

int RunScheduler(const Config& config);
int RunNode(const Config& config);
int RunServe(const Config& config);

// Generates (or finds in the cache) the synthetic models of `serve` and
// returns them as catalogue entries. Errors name the directory.
absl::StatusOr<std::vector<global_scheduler::ModelSpec>> PrepareSyntheticModels(
    const ServeSection& serve);

}  // namespace ballast::server
