// ModelMemory: one resident model's share of a device's memory, and
// ModelPreemptions: why its running sequences were preempted, as
// DeviceWorker::Usage reports them (and the metrics export them). Plain
// data.
#pragma once

#include <cstdint>
#include <string>

namespace ballast::node_manager {

struct ModelMemory {
  std::string model;
  int64_t weight_bytes = 0;   // its weights (elastic: the pages still mapped)
  int64_t kv_bytes_used = 0;  // KV blocks it holds (running and cached sequences)
  // Its engine's buffers (activations, logits, GEMM and attention
  // workspace, KV staging), charged outside the KV pool.
  int64_t workspace_bytes = 0;
};

// A resident model's preempted running sequences by cause, over its
// engine's life (a reloaded model starts again at 0). Each is recomputed
// later (its prompt and the output so far), the same tokens.
struct ModelPreemptions {
  std::string model;
  int64_t growth = 0;       // by its own planner: its sequences' next blocks found no room
  int64_t for_kv = 0;       // shed by the device for another model's KV
  int64_t for_weights = 0;  // shed by the device for weights (activation, remapping's take-back)
};

}  // namespace ballast::node_manager
