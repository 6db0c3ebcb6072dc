// cudaError_t -> absl::Status, for host code of the CUDA backend.
#pragma once

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace ballast::engine::cuda {

inline absl::Status CudaStatus(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  if (e == cudaErrorMemoryAllocation) {
    return absl::ResourceExhaustedError(absl::StrCat(what, ": out of device memory"));
  }
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(e)));
}

#define BALLAST_CUDA_RETURN(expr, what)                                                    \
  do {                                                                                     \
    if (absl::Status _st = ::ballast::engine::cuda::CudaStatus((expr), (what)); !_st.ok()) \
      return _st;                                                                          \
  } while (0)

// Owns one device allocation.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer() { Reset(); }
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) {
    o.ptr_ = nullptr;
    o.bytes_ = 0;
  }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      Reset();
      ptr_ = o.ptr_;
      bytes_ = o.bytes_;
      o.ptr_ = nullptr;
      o.bytes_ = 0;
    }
    return *this;
  }
  absl::Status Allocate(size_t bytes, const char* what) {
    Reset();
    if (bytes == 0) return absl::OkStatus();
    BALLAST_CUDA_RETURN(cudaMalloc(&ptr_, bytes), what);
    bytes_ = bytes;
    return absl::OkStatus();
  }
  void Reset() {
    if (ptr_) cudaFree(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
  }
  template <typename T = void>
  T* get() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace ballast::engine::cuda
