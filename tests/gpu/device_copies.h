// Copies between host vectors and raw device allocations for the GPU
// kernel tests (cudaMalloc'd; the test frees them). Failures are gtest
// failures of the calling test.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

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

}  // namespace ballast::engine::testing
