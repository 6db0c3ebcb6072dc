// `ballast bench-engine`'s prefill runs: one step of many prompts or one
// (MeasurePrefill, against the GEMM peaks) and the executor's first steps
// after activation (TimeFirstSteps). Internal to engine/cuda/
// engine_bench.cc; CUDA builds only.
//
// Thread-safety: one call at a time per executor.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "engine/cuda/cuda_executor.h"
#include "engine/gpu_bench.h"
#include "nlohmann/json.hpp"

namespace ballast::engine {

// Seconds of `runs` prefill steps of `prompts` on `e` (one chunk each,
// all in one step; after one untimed run): the mean and the fastest.
struct PrefillTimes {
  double mean = 0, best = 0;
};
absl::StatusOr<PrefillTimes> TimePrefill(cuda::CudaExecutor* e, KvCache* kv,
                                         const std::vector<std::vector<int>>& prompts, int runs);
absl::StatusOr<PrefillTimes> TimePrefill(cuda::CudaExecutor* e, KvCache* kv,
                                         const std::vector<int>& prompt, int runs);

// Milliseconds of the executor's first three steps (a prefill of `tokens`,
// its KV released after each): the first pays what a server's first
// request after activation pays once (kernels loaded at their first
// launch, first-use allocations), the others are the steady state.
absl::StatusOr<nlohmann::json> TimeFirstSteps(cuda::CudaExecutor* e, KvCache* kv,
                                              const ModelConfig& c, int tokens);

// o.prefill_tokens as o.prefill_prompts prompts (one chunk each, one
// step): its time, rate and share of the GEMM peaks in `out` (when
// measured); "attention_pairs": the (query, key) pairs of causal attention.
absl::StatusOr<nlohmann::json> MeasurePrefill(const GpuEngineBenchOptions& o, const ModelConfig& c,
                                              KvCache* kv, cuda::CudaExecutor* e,
                                              const nlohmann::json& out);

}  // namespace ballast::engine
