// Copies between host vectors and raw device allocations for the GPU
// kernel tests (cudaMalloc'd; the test frees them), and activation bits.
// Failures are gtest failures of the calling test.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "engine/cuda/kernels.h"
#include "engine/dtype.h"
#include "gtest/gtest.h"

namespace ballast::engine::testing {

template <typename T>
T* ToDevice(const std::vector<T>& v) {
  T* d = nullptr;
  EXPECT_EQ(cudaMalloc(&d, std::max<size_t>(1, v.size() * sizeof(T))), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  return d;
}

template <typename T>
std::vector<T> ToHost(const T* d, size_t n) {
  std::vector<T> v(n);
  EXPECT_EQ(cudaMemcpy(v.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return v;
}

// A float as 16-bit activation bits (BF16 or FP16, rounded to nearest
// even), and back.
inline uint16_t ToActBits(float f, cuda::ActType type) {
  if (type == cuda::ActType::kBF16) return FloatToBF16(f);
  return __half_as_ushort(__float2half_rn(f));
}

inline float FromActBits(uint16_t bits, cuda::ActType type) {
  if (type == cuda::ActType::kBF16) return BF16ToFloat(bits);
  return __half2float(__ushort_as_half(bits));
}

}  // namespace ballast::engine::testing
