// Gemm: the CUDA backend's matrix products through cuBLASLt.
//
//   y[M][N] = x[M][K] * w[N][K]^T
//
// x and w in the activation type (BF16 or FP16), FP32 accumulation, y in the
// activation type or FP32 (logits). Weights keep Hugging Face's [out, in]
// row-major layout. Decode-sized products (a few rows) use the skinny
// kernel of kernels.h instead. Each shape's descriptors and heuristic algorithm are
// built once and cached, so a step issues no host-side planning and the
// calls can be captured in CUDA graphs. A caller-provided workspace keeps
// cuBLASLt from allocating.
//
// Thread-safety: thread-compatible (one step thread drives it).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

#include "absl/status/statusor.h"
#include "engine/cuda/kernels.h"

namespace ballast::engine::cuda {

class Gemm {
 public:
  // workspace_bytes: cuBLASLt workspace (32 MiB suffices on H100).
  // skinny_max_m: products with at most this many rows (decode) use
  // LaunchSkinnyGemm instead of cuBLASLt; 0 = always cuBLASLt.
  static absl::StatusOr<std::unique_ptr<Gemm>> Create(size_t workspace_bytes,
                                                      int skinny_max_m = kSkinnyGemmDefaultMaxM);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  absl::Status Run(const void* x, const void* w, void* y, int m, int n, int k, ActType type,
                   bool out_f32, cudaStream_t stream);

 private:
  struct Plan;
  using Key = std::tuple<int, int, int, int, bool>;
  Gemm() = default;
  absl::StatusOr<Plan*> GetPlan(int m, int n, int k, ActType type, bool out_f32);

  void* handle_ = nullptr;  // cublasLtHandle_t
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  int skinny_max_m_ = 0;
  std::map<Key, std::unique_ptr<Plan>> plans_;
};

}  // namespace ballast::engine::cuda
