#include "sim/sim_remap.h"

#include <algorithm>
#include <cmath>

#include "sim/sim_device.h"

namespace ballast::sim {
int64_t LayerBytes(const ModelShape& part) {
  if (part.layers <= 0) return 0;
  const double q = static_cast<double>(part.heads) * part.head_dim;
  const double kv = static_cast<double>(part.kv_heads) * part.head_dim;
  // Attention (q, k, v, o), the MLP (gate, up, down) and the two norms.
  const double params = 2.0 * part.hidden * q + 2.0 * part.hidden * kv +
                        3.0 * part.hidden * static_cast<double>(part.intermediate) +
                        2.0 * part.hidden;
  return static_cast<int64_t>(params) * part.weight_dtype_bytes;
}

RemapTimings TimingsOf(const EngineModel& engine, const SimPolicy& policy, const SimModel& model) {
  const ModelShape part = model.Part();
  RemapTimings t;
  t.layers = part.layers;
  t.layer_bytes = LayerBytes(part);
  t.t_transfer = static_cast<double>(t.layer_bytes) / engine.h2d_bytes_per_s();
  if (t.layers > 0) t.t_compute = TpStepSeconds(engine, policy, model, {1, 1.0, 0, 0}) / t.layers;
  return t;
}

int RemapCap(const RemapTimings& t, const SimRemap& options, bool active, double others) {
  const int n = t.layers;
  if (n < 2) return 0;
  const int floor_cap =
      std::clamp(static_cast<int>(std::floor(options.max_fraction * n)), 0, n - 2);
  if (!options.respect_timing || !active || t.t_compute <= 0 || t.t_transfer <= 0) {
    return floor_cap;
  }
  const double t_transfer = memory::SharedTransfer(t.t_transfer, others);
  if (t_transfer < 0) return 0;
  return memory::MaxAlpha(n, t_transfer, t.t_compute, floor_cap);
}

memory::StreamingPlan PlanFor(const RemapTimings& t, int alpha, bool respect_timing,
                              double others) {
  memory::StreamingPlan p;
  const double t_transfer = memory::SharedTransfer(t.t_transfer, others);
  if (t_transfer > 0) p = memory::PlanStreaming(t.layers, alpha, t_transfer, t.t_compute);
  if (p.alpha == 0 && alpha > 0 && !respect_timing && alpha + 2 <= t.layers) {
    p.alpha = alpha;
    p.slots = 2;
    p.streamed = memory::StreamedLayers(t.layers, alpha + 2);
  }
  return p;
}

double StreamingStall(const RemapTimings& t, const memory::StreamingPlan& plan, double step_s,
                      double others) {
  if (plan.alpha <= 0 || t.layers <= 0) return 0;
  // The link's load over the load this model alone puts on it: 1 while
  // the link carries every busy model's copies.
  const double own = memory::LinkShare(t.layers, plan, t.t_transfer, t.t_compute);
  const double stretch = std::max(1.0, own + std::max(0.0, others)) / std::max(1.0, own);
  const double copies = memory::CopiesPerStep(plan) * t.t_transfer * stretch;
  return std::max(0.0, copies - step_s);
}

void RemapCounters::Add(const RemapCounters& o) {
  remap_events += o.remap_events;
  revert_events += o.revert_events;
  capped_events += o.capped_events;
  forced_reverts += o.forced_reverts;
  kv_wait_requests += o.kv_wait_requests;
  max_lent_bytes = std::max(max_lent_bytes, o.max_lent_bytes);
  streamed_steps += o.streamed_steps;
  streamed_bytes += o.streamed_bytes;
  stall_s += o.stall_s;
  copy_pauses += o.copy_pauses;
  copy_s += o.copy_s;
  for (const auto& [m, a] : o.max_alpha) max_alpha[m] = std::max(max_alpha[m], a);
  for (const auto& [m, s] : o.layer_seconds) layer_seconds[m] += s;
}

nlohmann::json RemapJson(const SimRemap& options, const RemapCounters& c, const SimConfig& config) {
  nlohmann::json max_alpha = nlohmann::json::object(), by_model = nlohmann::json::object();
  double layer_seconds = 0;
  for (const auto& [m, a] : c.max_alpha) {
    max_alpha[config.models[static_cast<size_t>(m)].name] = a;
  }
  for (const auto& [m, s] : c.layer_seconds) {
    by_model[config.models[static_cast<size_t>(m)].name] = s;
    layer_seconds += s;
  }
  return {{"max_fraction", options.max_fraction},
          {"respect_timing", options.respect_timing},
          {"revert_after_s", options.revert_after_s},
          {"remap_events", c.remap_events},
          {"revert_events", c.revert_events},
          {"capped_events", c.capped_events},
          {"forced_reverts", c.forced_reverts},
          {"kv_wait_requests", c.kv_wait_requests},
          {"max_alpha", max_alpha},
          {"max_lent_gib", static_cast<double>(c.max_lent_bytes) / (1LL << 30)},
          {"layer_seconds", layer_seconds},
          {"layer_seconds_by_model", by_model},
          {"streamed_steps", c.streamed_steps},
          {"streamed_gib", static_cast<double>(c.streamed_bytes) / (1LL << 30)},
          {"stall_s", c.stall_s},
          {"copy_pauses", c.copy_pauses},
          {"copy_s", c.copy_s}};
}

}  // namespace ballast::sim
