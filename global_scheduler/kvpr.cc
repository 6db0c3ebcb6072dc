#include "global_scheduler/kvpr.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace ballast::global_scheduler {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

double Ratio(double demand, int64_t capacity, int64_t weights) {
  const int64_t kv = capacity - weights;
  if (kv <= 0) return kInf;
  return demand / static_cast<double>(kv);
}

// Devices (of `device_of`'s assignment) where the step budget is broken.
int BudgetBreaks(const std::vector<ModelDemand>& models,
                 const std::vector<DeviceCapacity>& capacity, const std::vector<int>& device_of,
                 double headroom) {
  if (headroom <= 0) return 0;
  const size_t devices = capacity.size();
  std::vector<double> steps(devices, 0), tightest(devices, 0);
  for (size_t g = 0; g < devices; ++g) {
    steps[g] = capacity[g].fixed_step_s;
    tightest[g] = capacity[g].fixed_tpot_s;
  }
  for (size_t i = 0; i < models.size(); ++i) {
    const int g = device_of[i];
    if (g < 0) continue;
    steps[g] += models[i].step_s;
    tightest[g] = TighterTpot(tightest[g], models[i].tpot_s);
  }
  int breaks = 0;
  for (size_t g = 0; g < devices; ++g)
    breaks += StepBudgetHolds(steps[g], tightest[g], headroom) ? 0 : 1;
  return breaks;
}

// Per device, what the models placed so far (and the fixed load) add up
// to: KV demand and weight bytes, and for the step budget the sum of the
// steps and the tightest TPOT SLO.
struct DeviceLoads {
  std::vector<double> demand, steps, tightest;  // steps, tightest: the step budget
  std::vector<int64_t> weights;

  explicit DeviceLoads(const std::vector<DeviceCapacity>& devices)
      : demand(devices.size()),
        steps(devices.size()),
        tightest(devices.size()),
        weights(devices.size()) {
    Start(devices);
  }
  // Back to the devices' fixed load alone.
  void Start(const std::vector<DeviceCapacity>& devices) {
    for (size_t g = 0; g < devices.size(); ++g) {
      demand[g] = devices[g].fixed_demand;
      weights[g] = devices[g].fixed_weight_bytes;
      steps[g] = devices[g].fixed_step_s;
      tightest[g] = devices[g].fixed_tpot_s;
    }
  }
  // Whether `m`'s weights fit on device `g` beside the load.
  bool Fits(const std::vector<DeviceCapacity>& devices, size_t g, const ModelDemand& m) const {
    return weights[g] + m.weight_bytes <= devices[g].memory_bytes;
  }
  // Whether the step budget holds on device `g` with `m` added.
  bool Within(size_t g, const ModelDemand& m, double step_headroom) const {
    return StepBudgetHolds(steps[g] + m.step_s, TighterTpot(tightest[g], m.tpot_s), step_headroom);
  }
  // Device `g`'s KVPR with `m` added.
  double KvprWith(const std::vector<DeviceCapacity>& devices, size_t g,
                  const ModelDemand& m) const {
    return Ratio(demand[g] + m.demand, devices[g].memory_bytes, weights[g] + m.weight_bytes);
  }
};

// Model indices in Algorithm 1's order: descending demand, ties by name.
std::vector<size_t> DemandOrder(const std::vector<ModelDemand>& models) {
  std::vector<size_t> order(models.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return models[a].demand > models[b].demand ||
           (models[a].demand == models[b].demand && models[a].name < models[b].name);
  });
  return order;
}

// The greedy's pick for one model: the device (-1: fits nowhere), its KVPR
// with the model added, and whether it was picked within the step budget.
struct DeviceChoice {
  int best = -1;
  double best_kvpr = kInf;
  bool budgeted = false;
};

// The device with the lowest KVPR after adding `m` (ties: lower index).
DeviceChoice LowestKvprDevice(const DeviceLoads& loads, const std::vector<DeviceCapacity>& devices,
                              const ModelDemand& m, double step_headroom) {
  // Devices within the step budget first; all of them if none is.
  DeviceChoice c;
  for (const bool only_within : {true, false}) {
    for (size_t g = 0; g < devices.size(); ++g) {
      if (!loads.Fits(devices, g, m)) continue;
      if (only_within && !loads.Within(g, m, step_headroom)) continue;
      const double k = loads.KvprWith(devices, g, m);
      if (c.best < 0 || k < c.best_kvpr) {
        c.best = static_cast<int>(g);
        c.best_kvpr = k;
      }
    }
    c.budgeted = only_within && c.best >= 0;
    if (c.best >= 0 || step_headroom <= 0) break;
  }
  return c;
}

// `m`'s device: its current one where that still fits (and is within the
// budget if the pick was) and the pick's gain is within the threshold;
// else the pick `c` (which must have found a device).
int StayOrMove(const DeviceLoads& loads, const std::vector<DeviceCapacity>& devices,
               const ModelDemand& m, const DeviceChoice& c, double migration_threshold,
               double step_headroom) {
  const int cur = m.current_device;
  int best = c.best;
  if (cur >= 0 && cur < static_cast<int>(devices.size()) && cur != best &&
      loads.Fits(devices, static_cast<size_t>(cur), m) &&
      (!c.budgeted || loads.Within(static_cast<size_t>(cur), m, step_headroom))) {
    const double cur_kvpr = loads.KvprWith(devices, static_cast<size_t>(cur), m);
    // Move only if the gain exceeds the threshold.
    if (!(cur_kvpr - c.best_kvpr > migration_threshold * cur_kvpr)) best = cur;
  }
  return best;
}

// The global check: whether the models' current placement is kept over the
// fresh one `p`; fills `current` with the current devices either way.
bool KeepCurrentPlacement(const std::vector<ModelDemand>& models,
                          const std::vector<DeviceCapacity>& devices, const KvprPlacement& p,
                          double migration_threshold, double step_headroom,
                          std::vector<int>* current) {
  // Global check: if every model has a valid current device and the current
  // placement's max KVPR (under today's demands) is within the threshold of
  // the new one, keep it: re-running the greedy in a new demand order must
  // not shuffle models for a marginal gain.
  bool all_placed = !models.empty();
  current->resize(models.size());
  for (size_t i = 0; i < models.size(); ++i) {
    (*current)[i] = models[i].current_device;
    if ((*current)[i] < 0 || (*current)[i] >= static_cast<int>(devices.size())) all_placed = false;
  }
  if (!all_placed || p.migrations <= 0) return false;
  const double keep = MaxKvpr(models, devices, *current);
  const double fresh = MaxKvpr(models, devices, p.device_of);
  return std::isfinite(keep) && keep <= (1.0 + migration_threshold) * fresh &&
         BudgetBreaks(models, devices, *current, step_headroom) <=
             BudgetBreaks(models, devices, p.device_of, step_headroom);
}

}  // namespace

bool StepBudgetHolds(double step_sum_s, double min_tpot_s, double headroom) {
  return headroom <= 0 || min_tpot_s <= 0 || step_sum_s <= headroom * min_tpot_s;
}

double KvDemand(double prompt_tokens_per_s, double decode_tokens_per_s, double kv_bytes_per_token,
                double tpot_slo_s) {
  if (tpot_slo_s <= 0) return 0;
  return (prompt_tokens_per_s + decode_tokens_per_s) * kv_bytes_per_token / tpot_slo_s;
}

KvprPlacement PlaceKvpr(const std::vector<ModelDemand>& models,
                        const std::vector<DeviceCapacity>& devices, double migration_threshold,
                        double step_headroom) {
  const size_t nd = devices.size();
  DeviceLoads loads(devices);
  KvprPlacement p;
  p.device_of.assign(models.size(), -1);
  for (size_t i : DemandOrder(models)) {
    const ModelDemand& m = models[i];
    const DeviceChoice c = LowestKvprDevice(loads, devices, m, step_headroom);
    if (c.best < 0) continue;  // fits nowhere
    const int best = StayOrMove(loads, devices, m, c, migration_threshold, step_headroom);
    if (m.current_device >= 0 && best != m.current_device) ++p.migrations;
    p.device_of[i] = best;
    loads.demand[best] += m.demand;
    loads.weights[best] += m.weight_bytes;
    loads.steps[best] += m.step_s;
    loads.tightest[best] = TighterTpot(loads.tightest[best], m.tpot_s);
  }
  std::vector<int> current;
  if (KeepCurrentPlacement(models, devices, p, migration_threshold, step_headroom, &current)) {
    p.device_of = current;
    p.migrations = 0;
    loads.Start(devices);
    for (size_t i = 0; i < models.size(); ++i) {
      loads.demand[current[i]] += models[i].demand;
      loads.weights[current[i]] += models[i].weight_bytes;
    }
  }
  p.kvpr.resize(nd);
  for (size_t g = 0; g < nd; ++g) {
    p.kvpr[g] = Ratio(loads.demand[g], devices[g].memory_bytes, loads.weights[g]);
    p.max_kvpr = std::max(p.max_kvpr, p.kvpr[g]);
  }
  return p;
}

double MaxKvpr(const std::vector<ModelDemand>& models, const std::vector<DeviceCapacity>& devices,
               const std::vector<int>& device_of) {
  std::vector<double> demand(devices.size(), 0);
  std::vector<int64_t> weights(devices.size(), 0);
  for (size_t g = 0; g < devices.size(); ++g) {
    demand[g] = devices[g].fixed_demand;
    weights[g] = devices[g].fixed_weight_bytes;
  }
  for (size_t i = 0; i < models.size(); ++i) {
    if (device_of[i] < 0) continue;
    demand[device_of[i]] += models[i].demand;
    weights[device_of[i]] += models[i].weight_bytes;
  }
  double mx = 0;
  for (size_t g = 0; g < devices.size(); ++g)
    mx = std::max(mx, Ratio(demand[g], devices[g].memory_bytes, weights[g]));
  return mx;
}

}  // namespace ballast::global_scheduler
