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
  std::vector<double> demand(nd), steps(nd), tightest(nd);  // steps, tightest: the step budget
  std::vector<int64_t> weights(nd);
  auto start = [&] {
    for (size_t g = 0; g < nd; ++g) {
      demand[g] = devices[g].fixed_demand;
      weights[g] = devices[g].fixed_weight_bytes;
      steps[g] = devices[g].fixed_step_s;
      tightest[g] = devices[g].fixed_tpot_s;
    }
  };
  start();
  std::vector<size_t> order(models.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return models[a].demand > models[b].demand ||
           (models[a].demand == models[b].demand && models[a].name < models[b].name);
  });
  KvprPlacement p;
  p.device_of.assign(models.size(), -1);
  for (size_t i : order) {
    const ModelDemand& m = models[i];
    auto within = [&](size_t g) {
      return StepBudgetHolds(steps[g] + m.step_s, TighterTpot(tightest[g], m.tpot_s),
                             step_headroom);
    };
    // Devices within the step budget first; all of them if none is.
    int best = -1;
    double best_kvpr = kInf;
    bool budgeted = false;
    for (const bool only_within : {true, false}) {
      for (size_t g = 0; g < nd; ++g) {
        if (weights[g] + m.weight_bytes > devices[g].memory_bytes) continue;
        if (only_within && !within(g)) continue;
        const double k =
            Ratio(demand[g] + m.demand, devices[g].memory_bytes, weights[g] + m.weight_bytes);
        if (best < 0 || k < best_kvpr) {
          best = static_cast<int>(g);
          best_kvpr = k;
        }
      }
      budgeted = only_within && best >= 0;
      if (best >= 0 || step_headroom <= 0) break;
    }
    if (best < 0) continue;  // fits nowhere
    const int cur = m.current_device;
    if (cur >= 0 && cur < static_cast<int>(nd) && cur != best &&
        weights[cur] + m.weight_bytes <= devices[cur].memory_bytes &&
        (!budgeted || within(static_cast<size_t>(cur)))) {
      const double cur_kvpr =
          Ratio(demand[cur] + m.demand, devices[cur].memory_bytes, weights[cur] + m.weight_bytes);
      // Move only if the gain exceeds the threshold.
      if (!(cur_kvpr - best_kvpr > migration_threshold * cur_kvpr)) best = cur;
    }
    if (cur >= 0 && best != cur) ++p.migrations;
    p.device_of[i] = best;
    demand[best] += m.demand;
    weights[best] += m.weight_bytes;
    steps[best] += m.step_s;
    tightest[best] = TighterTpot(tightest[best], m.tpot_s);
  }
  // Global check: if every model has a valid current device and the current
  // placement's max KVPR (under today's demands) is within the threshold of
  // the new one, keep it: re-running the greedy in a new demand order must
  // not shuffle models for a marginal gain.
  bool all_placed = !models.empty();
  std::vector<int> current(models.size());
  for (size_t i = 0; i < models.size(); ++i) {
    current[i] = models[i].current_device;
    if (current[i] < 0 || current[i] >= static_cast<int>(nd)) all_placed = false;
  }
  if (all_placed && p.migrations > 0) {
    const double keep = MaxKvpr(models, devices, current);
    const double fresh = MaxKvpr(models, devices, p.device_of);
    if (std::isfinite(keep) && keep <= (1.0 + migration_threshold) * fresh &&
        BudgetBreaks(models, devices, current, step_headroom) <=
            BudgetBreaks(models, devices, p.device_of, step_headroom)) {
      p.device_of = current;
      p.migrations = 0;
      start();
      for (size_t i = 0; i < models.size(); ++i) {
        demand[current[i]] += models[i].demand;
        weights[current[i]] += models[i].weight_bytes;
      }
    }
  }
  p.kvpr.resize(nd);
  for (size_t g = 0; g < nd; ++g) {
    p.kvpr[g] = Ratio(demand[g], devices[g].memory_bytes, weights[g]);
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
