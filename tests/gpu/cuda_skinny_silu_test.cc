// The decode MLP's fused gate/up product and SiLU (LaunchSkinnyGemmSiluMul,
// through Gemm::RunSkinnySiluMul) against the two launches it replaces (the
// skinny product into [m][2 * inter], then LaunchSiluMul): bit for bit, in
// BF16 and FP16, for 1 to 8 rows, with output counts that do and do not
// fill the kernel's blocks; and both against a double-precision reference.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "engine/cuda/gemm.h"
#include "engine/cuda/kernels.h"
#include "engine/dtype.h"
#include "engine/gpu_backend.h"
#include "gtest/gtest.h"
#include "tests/gpu/device_copies.h"

namespace ballast::engine::cuda {
namespace {

using testing::FromActBits;
using testing::ToActBits;
using testing::ToDevice;
using testing::ToHost;

bool HaveGpu() { return GpuMemoryInfo(0).ok(); }

struct Shape {
  int m, inter, k;
};

void CheckFusedSilu(Gemm& g, Shape sh, ActType type, std::mt19937& rng) {
  SCOPED_TRACE(::testing::Message() << (type == ActType::kBF16 ? "bf16 " : "fp16 ") << sh.m << "x"
                                    << sh.inter << "x" << sh.k);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const size_t xs = static_cast<size_t>(sh.m) * sh.k, ws = 2 * static_cast<size_t>(sh.inter) * sh.k;
  // The CUDA-core kernel reads x in blocks of up to kSkinnyGemmMaxM rows
  // (the engine's activation buffers always hold them): pad the allocation.
  std::vector<uint16_t> x(static_cast<size_t>(std::max(kSkinnyGemmMaxM, sh.m)) * sh.k), w(ws);
  for (size_t i = 0; i < xs; ++i) x[i] = ToActBits(nd(rng), type);
  for (auto& v : w) v = ToActBits(0.05f * nd(rng), type);
  const size_t outs = static_cast<size_t>(sh.m) * sh.inter;
  uint16_t* dx = ToDevice(x);
  uint16_t* dw = ToDevice(w);
  uint16_t* d_gu = ToDevice(std::vector<uint16_t>(2 * outs));
  uint16_t* d_two = ToDevice(std::vector<uint16_t>(outs));
  uint16_t* d_one = ToDevice(std::vector<uint16_t>(outs, 0xFFFF));  // NaN: unwritten shows
  ASSERT_TRUE(g.UsesSkinnySiluMul(nullptr, sh.m, sh.k));
  ASSERT_TRUE(g.Run(dx, dw, d_gu, sh.m, 2 * sh.inter, sh.k, type, false, nullptr).ok());
  ASSERT_EQ(LaunchSiluMul(d_gu, sh.m, sh.inter, d_two, type, nullptr), cudaSuccess);
  ASSERT_TRUE(g.RunSkinnySiluMul(dx, dw, d_one, sh.m, sh.inter, sh.k, type, nullptr).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto two = ToHost(d_two, outs), one = ToHost(d_one, outs);
  int differ = 0;
  double max_err = 0, max_mag = 0;
  for (int i = 0; i < sh.m; ++i) {
    for (int j = 0; j < sh.inter; ++j) {
      const size_t at = static_cast<size_t>(i) * sh.inter + j;
      if (one[at] != two[at]) ++differ;
      double gate = 0, up = 0;
      for (int k = 0; k < sh.k; ++k) {
        const double xv = FromActBits(x[static_cast<size_t>(i) * sh.k + k], type);
        gate += xv * FromActBits(w[static_cast<size_t>(j) * sh.k + k], type);
        up += xv * FromActBits(w[static_cast<size_t>(sh.inter + j) * sh.k + k], type);
      }
      const double want = gate / (1 + std::exp(-gate)) * up;
      max_err = std::max(max_err, std::abs(want - FromActBits(one[at], type)));
      max_mag = std::max(max_mag, std::abs(want));
    }
  }
  EXPECT_EQ(differ, 0) << "of " << outs << " outputs differ from the two launches'";
  EXPECT_GT(max_mag, 0.0);
  EXPECT_LT(max_err, 0.02 * max_mag);
  for (void* p : {static_cast<void*>(dx), static_cast<void*>(dw), static_cast<void*>(d_gu),
                  static_cast<void*>(d_two), static_cast<void*>(d_one)}) {
    cudaFree(p);
  }
}

TEST(CudaSkinnySilu, FusedGateUpMatchesTheTwoLaunchesBitForBit) {
  if (!HaveGpu()) GTEST_SKIP() << "no usable GPU";
  GemmOptions go;
  go.skinny_max_m = kSkinnyGemmMaxM;
  auto g = Gemm::Create(go);
  ASSERT_TRUE(g.ok()) << g.status();
  std::mt19937 rng(11);
  for (const ActType type : {ActType::kBF16, ActType::kF16}) {
    for (const Shape sh : {Shape{1, 96, 512}, Shape{1, 1432, 4096}, Shape{2, 301, 264},
                           Shape{3, 64, 1024}, Shape{5, 77, 128}, Shape{8, 130, 520}}) {
      CheckFusedSilu(**g, sh, type, rng);
    }
  }
}

// The same on the tensor-core kernel (LaunchSkinnyMmaSiluMul; 3 to 16
// rows past the CUDA-core kernel's 2): a gate row's sum is the same in a
// tile of 8 gate and 8 up rows as among 16 rows of the plain product.
TEST(CudaSkinnySilu, TensorCoreFusedGateUpMatchesTheTwoLaunchesBitForBit) {
  if (!HaveGpu()) GTEST_SKIP() << "no usable GPU";
  GemmOptions go;
  go.skinny_max_m = 2;
  go.skinny_mma_max_m = kSkinnyMmaMaxM;
  go.skinny_mma_2byte = true;
  auto g = Gemm::Create(go);
  ASSERT_TRUE(g.ok()) << g.status();
  std::mt19937 rng(13);
  for (const ActType type : {ActType::kBF16, ActType::kF16}) {
    for (const Shape sh :
         {Shape{3, 96, 512}, Shape{8, 1432, 4096}, Shape{9, 301, 1152}, Shape{16, 77, 128}}) {
      ASSERT_FALSE((*g)->UsesSkinny(sh.m, sh.k));
      CheckFusedSilu(**g, sh, type, rng);
    }
  }
}

TEST(CudaSkinnySilu, RefusesProductsTooTallForTheSkinnyKernel) {
  if (!HaveGpu()) GTEST_SKIP() << "no usable GPU";
  GemmOptions go;
  go.skinny_max_m = 2;
  {  // three rows go to the tensor-core kernel (skinny_mma_max_m's default)
    GemmOptions with_mma = go;
    with_mma.skinny_mma_2byte = true;
    auto mma = Gemm::Create(with_mma);
    ASSERT_TRUE(mma.ok()) << mma.status();
    EXPECT_FALSE((*mma)->UsesSkinny(3, 512));
    EXPECT_TRUE((*mma)->UsesSkinnySiluMul(nullptr, 3, 512));
    EXPECT_FALSE((*mma)->UsesSkinnySiluMul(nullptr, kSkinnyMmaMaxM + 1, 512));
    EXPECT_FALSE((*mma)->UsesSkinnySiluMul(nullptr, 3, 520));  // k % 128 != 0
  }
  EXPECT_FALSE(Gemm::Create(go).value()->UsesSkinnySiluMul(nullptr, 3, 512));  // 2-byte: off
  go.skinny_mma_2byte = true;
  go.skinny_mma_max_m = 0;
  auto g = Gemm::Create(go);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_TRUE((*g)->UsesSkinny(2, 512));
  EXPECT_FALSE((*g)->UsesSkinny(3, 512));
  EXPECT_FALSE((*g)->UsesSkinny(1, 500));  // k % 8 != 0
  EXPECT_FALSE((*g)->UsesSkinnySiluMul(nullptr, 3, 512));
  const absl::Status s =
      (*g)->RunSkinnySiluMul(nullptr, nullptr, nullptr, 3, 64, 512, ActType::kBF16, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  go.skinny_max_m = kSkinnyGemmMaxM;
  go.skinny_mma_max_m = kSkinnyMmaMaxM;
  go.skinny_mma_2byte = true;
  go.batch_invariant = true;
  auto inv = Gemm::Create(go);
  ASSERT_TRUE(inv.ok()) << inv.status();
  EXPECT_FALSE((*inv)->UsesSkinny(1, 512));
  EXPECT_FALSE((*inv)->UsesSkinnySiluMul(nullptr, 12, 512));
}

}  // namespace
}  // namespace ballast::engine::cuda
