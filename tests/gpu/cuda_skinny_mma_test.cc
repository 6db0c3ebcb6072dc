// The tensor-core skinny GEMM (LaunchSkinnyMmaGemm) against a
// double-precision reference: BF16 and FP16, BF16/FP16 or FP32 output,
// 1 to 16 rows (both token-tile counts), output counts that do and do not
// fill a block's 16 weight rows, and depths of one step to many. Also: rows
// past m of y are not written; a token's result is the same bits whatever
// the row count (the k order is fixed); shapes the kernel does not take are
// refused.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <random>
#include <vector>

#include "engine/cuda/kernels.h"
#include "engine/dtype.h"
#include "engine/gpu_backend.h"
#include "gtest/gtest.h"
#include "tests/gpu/device_copies.h"

namespace ballast::engine::cuda {
namespace {

using testing::ToDevice;
using testing::ToHost;

bool HaveGpu() { return GpuMemoryInfo(0).ok(); }

uint16_t ToBits(float f, ActType type) {
  if (type == ActType::kBF16) return FloatToBF16(f);
  return __half_as_ushort(__float2half_rn(f));
}

float FromBits(uint16_t bits, ActType type) {
  if (type == ActType::kBF16) return BF16ToFloat(bits);
  return __half2float(__ushort_as_half(bits));
}

struct Operands {
  int m, n, k;
  ActType type;
  std::vector<uint16_t> x, w;
  uint16_t* dx = nullptr;
  uint16_t* dw = nullptr;

  Operands(int m_, int n_, int k_, ActType t, std::mt19937& rng) : m(m_), n(n_), k(k_), type(t) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    x.resize(static_cast<size_t>(m) * k);
    w.resize(static_cast<size_t>(n) * k);
    for (auto& v : x) v = ToBits(nd(rng), type);
    for (auto& v : w) v = ToBits(0.05f * nd(rng), type);
    dx = ToDevice(x);  // exactly m rows: the kernel must not read past them
    dw = ToDevice(w);
  }
  ~Operands() {
    cudaFree(dx);
    cudaFree(dw);
  }
  double Reference(int i, int j) const {
    double acc = 0;
    for (int kk = 0; kk < k; ++kk) {
      acc += static_cast<double>(FromBits(x[static_cast<size_t>(i) * k + kk], type)) *
             FromBits(w[static_cast<size_t>(j) * k + kk], type);
    }
    return acc;
  }
};

// y for `rows` of o's tokens (rows <= o.m), as floats; y's row past them
// must keep its sentinel.
std::vector<float> RunMma(const Operands& o, int rows, bool out_f32) {
  const size_t outs = static_cast<size_t>(rows) * o.n, width = out_f32 ? 4 : 2;
  void* dy = nullptr;
  EXPECT_EQ(cudaMalloc(&dy, (outs + o.n) * width), cudaSuccess);
  EXPECT_EQ(cudaMemset(dy, 0xFF, (outs + o.n) * width), cudaSuccess);  // NaN sentinels
  EXPECT_EQ(LaunchSkinnyMmaGemm(o.dx, o.dw, dy, rows, o.n, o.k, o.type, out_f32, nullptr),
            cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<float> y(outs + o.n);
  if (out_f32) {
    y = ToHost(static_cast<float*>(dy), y.size());
  } else {
    const auto bits = ToHost(static_cast<uint16_t*>(dy), y.size());
    for (size_t i = 0; i < y.size(); ++i) y[i] = FromBits(bits[i], o.type);
  }
  cudaFree(dy);
  for (int j = 0; j < o.n; ++j)
    EXPECT_TRUE(std::isnan(y[outs + j])) << "y row " << rows << " written";
  y.resize(outs);
  return y;
}

void CheckAgainstReference(const Operands& o, const std::vector<float>& y) {
  double max_err = 0, max_mag = 0;
  for (int i = 0; i < o.m; ++i) {
    for (int j = 0; j < o.n; ++j) {
      const double want = o.Reference(i, j);
      max_err = std::max(max_err, std::abs(want - y[static_cast<size_t>(i) * o.n + j]));
      max_mag = std::max(max_mag, std::abs(want));
    }
  }
  EXPECT_GT(max_mag, 0.0);
  EXPECT_LT(max_err, 0.01 * max_mag);
}

TEST(CudaSkinnyMma, MatchesReferenceForEveryTokenTile) {
  if (!HaveGpu()) GTEST_SKIP() << "no usable GPU";
  std::mt19937 rng(5);
  struct Shape {
    int m, n, k;
  };
  for (const ActType type : {ActType::kBF16, ActType::kF16}) {
    for (const Shape sh : {Shape{1, 48, 64}, Shape{3, 33, 192}, Shape{8, 130, 4096},
                           Shape{9, 16, 1024}, Shape{12, 520, 256}, Shape{16, 31, 14336}}) {
      Operands o(sh.m, sh.n, sh.k, type, rng);
      for (const bool out_f32 : {false, true}) {
        SCOPED_TRACE(::testing::Message() << (type == ActType::kBF16 ? "bf16 " : "fp16 ") << sh.m
                                          << "x" << sh.n << "x" << sh.k << " f32 " << out_f32);
        CheckAgainstReference(o, RunMma(o, sh.m, out_f32));
      }
    }
  }
}

// Each token's sums run over the same k partition in the same order
// whatever else is in the launch, so its output bits do not depend on the
// row count (one or two token tiles).
TEST(CudaSkinnyMma, ATokensResultDoesNotDependOnTheBatch) {
  if (!HaveGpu()) GTEST_SKIP() << "no usable GPU";
  std::mt19937 rng(6);
  Operands o(kSkinnyMmaGemmMaxM, 200, 4096, ActType::kBF16, rng);
  const std::vector<float> all = RunMma(o, kSkinnyMmaGemmMaxM, true);
  for (const int rows : {1, 3, 8, 9, 15}) {
    SCOPED_TRACE(::testing::Message() << rows << " rows");
    const std::vector<float> y = RunMma(o, rows, true);
    int differ = 0;
    for (size_t i = 0; i < y.size(); ++i) differ += y[i] != all[i];
    EXPECT_EQ(differ, 0);
  }
}

TEST(CudaSkinnyMma, RefusesShapesItDoesNotTake) {
  EXPECT_TRUE(SkinnyMmaGemmSupports(1, 64));
  EXPECT_TRUE(SkinnyMmaGemmSupports(kSkinnyMmaGemmMaxM, 4096));
  EXPECT_FALSE(SkinnyMmaGemmSupports(kSkinnyMmaGemmMaxM + 1, 4096));
  EXPECT_FALSE(SkinnyMmaGemmSupports(0, 4096));
  EXPECT_FALSE(SkinnyMmaGemmSupports(4, 4128));  // k % 64 != 0
  if (!HaveGpu()) GTEST_SKIP() << "no usable GPU";
  EXPECT_EQ(
      LaunchSkinnyMmaGemm(nullptr, nullptr, nullptr, 4, 64, 4128, ActType::kBF16, false, nullptr),
      cudaErrorInvalidValue);
}

}  // namespace
}  // namespace ballast::engine::cuda
