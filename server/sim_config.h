// `ballast simulate`'s config file (configs/sim/*.yaml): the cluster, the
// model catalogue, the policy and named policy variants for sweeps, parsed
// into sim::SimConfig. Errors name the file and the key.
//
//   calibration: calibration-h100.json   # relative to this file
//   cluster: {nodes: 2, gpus_per_node: 8, gpus: 12, gpu_memory_gib: 80,
//             dram_gib: 4, ssd_gib: 64}    # session KV tiers per node
//   drain_s: 600
//   policy: {memory_mode: elastic, placement: kvpr, activation: on_demand,
//            arbitration: moore_hodgson,
//            idle_evict_after_s: 45, kv_pressure_free_fraction: 0.05,
//            min_kv_fraction: 0.1, max_batch_tokens: 8192, overlap_steps: true,
//            rolling_steps: true, rolling_share_exponent: 0.5,
//            rolling_overlap_share: 0.3, lockstep_overlap_share: 0,
//            rolling_skinny_rows: 2, rolling_skinny_weight: 1,
//            rolling_cross_weight: 1,
//            ahead_steps: true, step_host_s: 0, request_path_s: 0,
//            control_interval_s: 1, demand_window_s: 60,
//            rebalance_interval_s: 30, migration_threshold: 0.2,
//            migrate_within_node: false,
//            session_kv: tiers,           # tiers | device | recompute
//            remap: {enabled: false, max_fraction: 0.5, respect_timing: true,
//                    revert_after_s: 1}}  # node.memory.remap's defaults
//   policies:                       # sweep variants: overrides of `policy`
//     static-fcfs: {memory_mode: static, placement: most_free, arbitration: fcfs}
//   models:
//     - {name: chat, shape: llama-8b, weight_dtype: bf16, kv_dtype: fp8,
//        ttft_ms: 1000, tpot_ms: 100, max_seqs: 256, copies: 4}
//   # shape: a name (sim::NamedShape) or {layers, hidden, heads, kv_heads,
//   # head_dim, intermediate, vocab, tied_embeddings}; copies: n makes
//   # name-0 .. name-(n-1).
//
// Thread-compatible.
#pragma once

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "sim/engine_model.h"
#include "sim/sim_config.h"

namespace ballast::server {

struct SimFile {
  sim::SimConfig config;
  std::string calibration_path;                    // resolved against the file
  std::map<std::string, sim::SimPolicy> variants;  // `policies`
};

// Reads the file; the cluster's GPU memory defaults to the calibration's
// card (the caller fills it in when gpu_memory_gib is absent: 0 here).
absl::StatusOr<SimFile> ReadSimConfig(const std::string& path);
absl::StatusOr<SimFile> ParseSimConfig(const std::string& yaml, const std::string& path);

}  // namespace ballast::server
