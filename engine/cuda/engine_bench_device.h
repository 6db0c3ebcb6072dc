// The device measurements of `ballast bench-engine` (engine_bench.cc):
// the device's name, its copy rate and the HBM rate its rooflines use, and
// cuBLASLt's 8192^3 BF16 GEMM rate that prefill is compared with. Internal
// to the engine benchmark's files; CUDA builds only.
//
// Thread-safety: each call makes and frees its own buffers and stream; one
// call at a time per device (they time the whole device).
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/gpu_bench.h"
#include "nlohmann/json.hpp"

namespace ballast::engine::bench_internal {

// The device's name, its measured copy and read-only rates and the HBM
// rate the rooflines use (o.hbm_bytes_per_s, else the datasheet's, else
// the copy rate) into `out` ("device", "copy_bytes_per_s",
// "read_bytes_per_s", "hbm_bytes_per_s"); returns that
// HBM rate. Makes o.device current.
absl::StatusOr<double> DescribeDevice(const GpuEngineBenchOptions& o, nlohmann::json* out);

// gemm_peak_tflops and gemm_peak_random_tflops (o.gemm_peak), and the
// tuning in effect (none in deterministic mode, as the engine's Gemm).
absl::Status AddGemmPeaks(const GpuEngineBenchOptions& o, nlohmann::json* out);

}  // namespace ballast::engine::bench_internal
