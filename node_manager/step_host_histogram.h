// StepHostHistogram: the cumulative distribution of one device's per-step
// host time — the part of an engine step spent outside the executor's
// forward (draining the inbox, planning, issuing KV loads, streaming
// tokens, finishing sequences, exporting session KV). The GPU idles for
// it unless steps overlap (issue 13); `ballast_node_step_host_seconds`
// exports it.
//
// Thread-compatible value type (DeviceWorker guards its copy).
#pragma once

#include <array>
#include <cstdint>

namespace ballast::node_manager {

struct StepHostHistogram {
  // Upper bounds (seconds) of the buckets; one more bucket takes the rest.
  static constexpr std::array<double, 10> kBoundsS = {25e-6, 50e-6, 100e-6, 200e-6, 500e-6,
                                                      1e-3,  2e-3,  5e-3,   10e-3,  50e-3};
  std::array<int64_t, kBoundsS.size() + 1> counts{};  // per bucket, not cumulative
  double sum_s = 0;
  int64_t steps = 0;

  void Add(double seconds) {
    size_t b = 0;
    while (b < kBoundsS.size() && seconds > kBoundsS[b]) ++b;
    ++counts[b];
    sum_s += seconds;
    ++steps;
  }
};

}  // namespace ballast::node_manager
