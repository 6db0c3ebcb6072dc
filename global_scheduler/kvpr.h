// KVPR model placement (Prism §6.1, Algorithm 1; bound in Appendix A.2).
//
// Definitions (written here because the paper leaves them symbolic):
//   demand d_m   = SLO-weighted KV growth rate of model m
//                = (prompt + decode tokens/s over the window) x KV bytes per
//                  token / TPOT SLO in seconds          [bytes / s^2]
//   KVPR_g       = sum of d_m of the models on device g
//                  / (capacity_g - sum of their weight bytes)
//                  (+infinity when the weights do not fit)
// Algorithm 1: models in descending d_m (ties: name); each goes to the
// device whose KVPR after adding it is lowest (ties: lower index). A model
// already placed stays on its current device unless the best device's
// resulting KVPR is lower by more than `migration_threshold` (a fraction of
// the current device's resulting KVPR) — this stops flapping under
// oscillating load. Because the greedy re-runs in a new demand order each
// time, a per-model check alone still shuffles models; so when every model
// is placed, the current placement is kept unless its max KVPR exceeds the
// new placement's by more than the same threshold (Prism's Line 8 applied
// to the whole placement). Pure and thread-safe.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ballast::global_scheduler {

struct ModelDemand {
  std::string name;
  double demand = 0;  // d_m
  int64_t weight_bytes = 0;
  int current_device = -1;  // index into the devices, -1 if not placed
  // The step budget (StepBudgetHolds): the model's step time on one GPU
  // and its TPOT SLO, in seconds; 0: unknown (no constraint).
  double step_s = 0, tpot_s = 0;
};

// The step budget: a device's models step one after another, so with all
// of them busy an iteration takes the sum of their steps, and every
// model's TPOT is at least that. The budget holds on a device if
//   sum of step_s over its models <= headroom x the smallest tpot_s
// (models with tpot_s 0 do not bound it). Placement with a budget
// (headroom > 0) prefers devices where it holds after the move, and among
// them the lowest KVPR; where it holds on none, the lowest KVPR of all.
// KVPR alone places by memory only: a model with a tight TPOT SLO can land
// beside a large model whose step alone exceeds that SLO.
bool StepBudgetHolds(double step_sum_s, double min_tpot_s, double headroom);
// The tighter of two TPOT SLOs, where 0 means none.
inline double TighterTpot(double a, double b) { return a <= 0 ? b : (b <= 0 ? a : std::min(a, b)); }

struct DeviceCapacity {
  std::string name;
  int64_t memory_bytes = 0;  // budget for weights + KV
  // What stays on the device whatever the placement (models not given to
  // PlaceKvpr: replicated or tensor-parallel ones): their weights and
  // demand, and for the step budget the sum of their steps and their
  // tightest TPOT SLO (0: none).
  int64_t fixed_weight_bytes = 0;
  double fixed_demand = 0, fixed_step_s = 0, fixed_tpot_s = 0;
};

struct KvprPlacement {
  std::vector<int> device_of;  // per model (input order); -1 if it fits nowhere
  std::vector<double> kvpr;    // per device, final
  double max_kvpr = 0;
  int migrations = 0;  // placed models that changed device
};

// KV bytes/s^2 demand from measured rates (see the definition above).
double KvDemand(double prompt_tokens_per_s, double decode_tokens_per_s, double kv_bytes_per_token,
                double tpot_slo_s);

// step_headroom > 0: with the step budget (above); the placement kept by
// the global check must also break the budget on no more devices.
KvprPlacement PlaceKvpr(const std::vector<ModelDemand>& models,
                        const std::vector<DeviceCapacity>& devices, double migration_threshold,
                        double step_headroom = 0);

// Max KVPR of a given assignment (device index per model).
double MaxKvpr(const std::vector<ModelDemand>& models, const std::vector<DeviceCapacity>& devices,
               const std::vector<int>& device_of);

}  // namespace ballast::global_scheduler
