// Helpers shared by the simulator's tests: an engine model whose every step
// takes kStep (or a fixed time per layer), catalogue models by shape name,
// trace records and outcome lookup. Header-only; test code only.
#pragma once

#include <gtest/gtest.h>

#include <array>
#include <string>

#include "bench/trace.h"
#include "sim/simulator.h"

namespace ballast::sim::testing {

inline constexpr double kStep = 0.010;  // every engine step, whatever its work

inline EngineModel ConstantEngine(double h2d = 1e9) {
  std::array<double, kFeatures> k{};
  k[0] = kStep;
  return EngineModel(k, h2d, 1.0);
}

// An engine model whose step takes `latency` (k0, the launch latency that
// overlapped steps do not share) plus `per_layer` seconds of GPU work per
// layer, whatever its batch: llama-1b's step has 16 layers, llama-3b's 28,
// llama-8b's 32.
inline EngineModel LayerEngine(double latency, double per_layer, double h2d = 1e9) {
  std::array<double, kFeatures> k{};
  k[0] = latency;
  k[1] = per_layer;
  return EngineModel(k, h2d, 1.0);
}

// A model of a named shape, TPOT SLO 100 ms and TTFT 1 s.
inline SimModel Model(const std::string& name, const std::string& shape = "llama-1b", int tp = 1) {
  SimModel m;
  m.name = name;
  m.shape_name = shape;
  m.shape = *NamedShape(shape);
  m.tp = tp;
  m.ttft_ms = 1000;
  m.tpot_ms = 100;
  return m;
}

inline bench::TraceRecord Req(const std::string& id, const std::string& model, double t, int prompt,
                              int output) {
  bench::TraceRecord r;
  r.id = id;
  r.model = model;
  r.arrival_s = t;
  r.prompt_tokens = prompt;
  r.output_tokens = output;
  return r;
}

inline const bench::RequestOutcome& Find(const SimResult& r, const std::string& id) {
  for (const auto& o : r.replay.requests) {
    if (o.id == id) return o;
  }
  ADD_FAILURE() << "no request " << id;
  static const bench::RequestOutcome kNone;
  return kNone;
}

}  // namespace ballast::sim::testing
