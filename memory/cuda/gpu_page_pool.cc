// memory/gpu_page_pool.h for builds with CUDA.
#include "memory/gpu_page_pool.h"

#include "memory/cuda/cuda_page_pool.h"

namespace ballast::memory {

absl::StatusOr<std::shared_ptr<PagePool>> CreateGpuPagePool(int device, size_t page_bytes,
                                                            int64_t budget_bytes) {
  auto p = CudaPagePool::Create(device, page_bytes, budget_bytes);
  if (!p.ok()) return p.status();
  return std::shared_ptr<PagePool>(std::move(*p));
}

}  // namespace ballast::memory
