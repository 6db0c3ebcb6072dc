// Parameter remapping's options and counters per device (plain data, so
// configs and metrics need not include the engines): see
// node_manager/remap_controller.h for the policy they configure.
//
// Thread-safety: plain structs.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "absl/time/time.h"

namespace ballast::node_manager {

struct RemapOptions {
  // node.memory.remap.enabled. Default off: the ladder goes from idle
  // session KV straight to preemption (the baseline).
  bool enabled = false;
  // Most of a model's layers it may lend (the rest stay resident).
  // Default 0.5.
  double max_fraction = 0.5;
  // Cap α by the measured T_T/T_c constraint (Mirage eq. 4/5). Off: by
  // max_fraction alone, streaming whatever it costs (benchmarks measure
  // that cost where the constraint fails, e.g. PCIe hosts). Default on.
  bool respect_timing = true;
  // Quiet time (no KV shortfall) before layers are taken back. Default 1 s.
  absl::Duration revert_after = absl::Seconds(1);
  // T_T profiled offline (Mirage §5.3: the transfer time per layer is
  // known ahead of runtime): one layer's host-to-device copy, for every
  // model on the device. Zero (default): each model measures its own at
  // the first lend (engine/weight_remapper.h).
  absl::Duration layer_transfer = absl::ZeroDuration();
};

struct RemapStats {
  std::map<std::string, int> layers;  // lent now, per resident model
  int64_t streamed_bytes = 0;         // cumulative, every model
  double stall_seconds = 0;           // cumulative compute waiting on copies
  int64_t remap_events = 0, revert_events = 0;
  int64_t capped_events = 0;  // shortfalls left to preemption at every cap
  // Reverts of a model over its cap (it got requests) for which running
  // sequences gave their KV back (preempted), and the bytes they gave.
  int64_t forced_reverts = 0;
  int64_t forced_shed_bytes = 0;
  // Now, at the last tick: weight bytes the models could still lend to KV
  // (memory::LendableBytes over every model's cap).
  int64_t lendable_bytes = 0;
};

}  // namespace ballast::node_manager
