// The GPU backend of a build without CUDA: every call says so.
#include "absl/status/status.h"
#include "engine/gpu_backend.h"

namespace ballast::engine {
namespace {

absl::Status NotBuilt() {
  return absl::UnimplementedError(
      "this ballast was built without CUDA (no nvcc found at configure time); "
      "use engine.backend: cpu or rebuild with a CUDA toolkit");
}

}  // namespace

bool GpuBackendBuilt() { return false; }

absl::StatusOr<std::unique_ptr<Executor>> CreateGpuExecutor(const ModelConfig&, const std::string&,
                                                            KvCache*, const GpuExecutorOptions&) {
  return NotBuilt();
}

absl::StatusOr<std::unique_ptr<memory::BlockAllocator>> CreateGpuBlockPool(int, size_t, int64_t) {
  return NotBuilt();
}

absl::StatusOr<std::pair<int64_t, int64_t>> GpuMemoryInfo(int) { return NotBuilt(); }

std::shared_ptr<void> PinHostMemory(void*, size_t) { return nullptr; }

absl::StatusOr<std::shared_ptr<HostArena>> CreatePinnedHostArena(int64_t, size_t) {
  return NotBuilt();
}

// Without CUDA there are no GPU weights; ModelEngine never asks (the cuda
// backend is refused first), so 0 is never used as a size.
int64_t GpuWeightBytes(const ModelConfig&) { return 0; }

}  // namespace ballast::engine
