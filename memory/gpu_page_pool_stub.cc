// memory/gpu_page_pool.h for builds without CUDA: the call says so.
#include "absl/status/status.h"
#include "memory/gpu_page_pool.h"

namespace ballast::memory {

absl::StatusOr<std::shared_ptr<PagePool>> CreateGpuPagePool(int, size_t, int64_t) {
  return absl::UnimplementedError(
      "this ballast was built without CUDA (no nvcc found at configure time): no GPU page pool; "
      "use engine.backend: cpu or rebuild with a CUDA toolkit");
}

}  // namespace ballast::memory
