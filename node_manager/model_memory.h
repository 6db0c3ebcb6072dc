// ModelMemory: one resident model's share of a device's memory, as
// DeviceWorker::Usage reports it (and the metrics export it). Plain data.
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

}  // namespace ballast::node_manager
