// The GPU page pool as seen from code that must build without CUDA: the
// factory a device's elastic memory (balloon, KV arena) gets its pages
// from. The implementation file is chosen at build time in
// memory/CMakeLists.txt: memory/cuda/gpu_page_pool.cc (a CudaPagePool over
// CUDA VMM) when a CUDA toolkit is found, memory/gpu_page_pool_stub.cc
// (UNIMPLEMENTED) otherwise. No #ifdef anywhere.
//
// Thread-safety: CreateGpuPagePool is thread-safe; the pool it returns is
// thread-safe (PagePool's contract).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "memory/page_pool.h"

namespace ballast::memory {

// A CUDA VMM page pool on `device`: pages of `page_bytes` (a multiple of the
// device's VMM granularity, 2 MiB on H100), at most `budget_bytes` mapped.
// UNAVAILABLE without a usable GPU; UNIMPLEMENTED in a build without CUDA.
absl::StatusOr<std::shared_ptr<PagePool>> CreateGpuPagePool(int device, size_t page_bytes,
                                                            int64_t budget_bytes);

}  // namespace ballast::memory
