// engine/gpu_bench.h for builds without CUDA: every call says so.
#include "absl/status/status.h"
#include "engine/gpu_bench.h"

namespace ballast::engine {
namespace {

absl::Status NotBuilt() {
  return absl::UnimplementedError(
      "this ballast was built without CUDA (no nvcc found at configure time); "
      "the GPU benchmarks need a build with a CUDA toolkit");
}

}  // namespace

absl::StatusOr<std::string> RunGpuEngineBench(const GpuEngineBenchOptions&) { return NotBuilt(); }

absl::StatusOr<std::string> RunGpuActivationBench(const GpuActivationBenchOptions&) {
  return NotBuilt();
}

}  // namespace ballast::engine
