// RMSNorms folded into the skinny products around them (kernels.h,
// SkinnyNormOut / SkinnyNormIn, through Gemm::RunSkinnyNormOut,
// RunSkinnyNormIn and RunSkinnySiluMul): against the launches they replace
// (product, LaunchAddRmsNorm, product) the residual is bit for bit the
// same, and the normed products are as close to a double-precision
// reference as the unfolded ones; a folded run repeats bit for bit; BF16
// and FP16, one and two rows, with and without a bias, output counts that
// do and do not fill the consumers' blocks.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

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

// o projection [hidden][k] -> norm over hidden -> qkv-like [n][hidden] and
// gate/up [2 inter][hidden].
struct Shape {
  int m, k, hidden, n, inter;
  bool bias;
};

struct Host {
  std::vector<float> resid;
  std::vector<uint16_t> x, w_o, bias, gamma, w_n, w_gu;
};

Host MakeInputs(const Shape& sh, ActType type, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  Host h;
  auto fill = [&](std::vector<uint16_t>& v, size_t n, float scale, float mean = 0.0f) {
    v.resize(n);
    for (auto& e : v) e = ToBits(mean + scale * nd(rng), type);
  };
  // The kernels read x in blocks of up to kSkinnyGemmMaxM rows (the
  // engine's buffers always hold them): pad.
  const size_t rows = kSkinnyGemmMaxM;
  h.resid.resize(rows * sh.hidden);
  for (auto& r : h.resid) r = 2.0f * nd(rng);
  fill(h.x, rows * sh.k, 1.0f);
  fill(h.w_o, static_cast<size_t>(sh.hidden) * sh.k, 0.05f);
  fill(h.bias, static_cast<size_t>(sh.hidden), 0.1f);
  fill(h.gamma, static_cast<size_t>(sh.hidden), 0.2f, 1.0f);
  fill(h.w_n, static_cast<size_t>(sh.n) * sh.hidden, 0.05f);
  fill(h.w_gu, 2 * static_cast<size_t>(sh.inter) * sh.hidden, 0.05f);
  return h;
}

// What the products after the norm give in double precision, from the
// residual the GPU computed (bit-identical in both paths, checked).
struct Reference {
  std::vector<double> y, z;
};

Reference Expected(const Shape& sh, const Host& h, const std::vector<float>& resid, float eps,
                   ActType type) {
  Reference ref;
  for (int i = 0; i < sh.m; ++i) {
    const float* r = resid.data() + static_cast<size_t>(i) * sh.hidden;
    double ss = 0;
    for (int j = 0; j < sh.hidden; ++j) ss += static_cast<double>(r[j]) * r[j];
    const double inv = 1.0 / std::sqrt(ss / sh.hidden + eps);
    std::vector<double> xn(static_cast<size_t>(sh.hidden));
    for (int j = 0; j < sh.hidden; ++j) xn[j] = FromBits(h.gamma[j], type) * r[j] * inv;
    auto dot = [&](const std::vector<uint16_t>& w, int row) {
      double s = 0;
      for (int j = 0; j < sh.hidden; ++j) {
        s += xn[j] * FromBits(w[static_cast<size_t>(row) * sh.hidden + j], type);
      }
      return s;
    };
    for (int c = 0; c < sh.n; ++c) ref.y.push_back(dot(h.w_n, c));
    for (int c = 0; c < sh.inter; ++c) {
      const double g = dot(h.w_gu, c), u = dot(h.w_gu, sh.inter + c);
      ref.z.push_back(g / (1 + std::exp(-g)) * u);
    }
  }
  return ref;
}

struct Errors {
  double y = 0, z = 0, y_mag = 0, z_mag = 0;
};

Errors Compare(const Reference& ref, const std::vector<uint16_t>& y, const std::vector<uint16_t>& z,
               ActType type) {
  Errors e;
  for (size_t i = 0; i < ref.y.size(); ++i) {
    e.y = std::max(e.y, std::abs(ref.y[i] - FromBits(y[i], type)));
    e.y_mag = std::max(e.y_mag, std::abs(ref.y[i]));
  }
  for (size_t i = 0; i < ref.z.size(); ++i) {
    e.z = std::max(e.z, std::abs(ref.z[i] - FromBits(z[i], type)));
    e.z_mag = std::max(e.z_mag, std::abs(ref.z[i]));
  }
  return e;
}

// Device copies of one path's buffers.
struct Run {
  float* resid;
  uint16_t *xn, *y, *z, *o;
  float* ss;
};

Run NewRun(const Shape& sh, const Host& h) {
  const size_t rows = kSkinnyGemmMaxM;
  Run r;
  r.resid = ToDevice(h.resid);
  r.xn = ToDevice(std::vector<uint16_t>(rows * sh.hidden));
  r.o = ToDevice(std::vector<uint16_t>(rows * sh.hidden));
  r.y = ToDevice(std::vector<uint16_t>(static_cast<size_t>(sh.m) * sh.n, 0xFFFF));
  r.z = ToDevice(std::vector<uint16_t>(static_cast<size_t>(sh.m) * sh.inter, 0xFFFF));
  r.ss = ToDevice(std::vector<float>(rows * SkinnyNormBlocks(sh.m, sh.hidden), -1.0f));
  return r;
}

void FreeRun(const Run& r) {
  for (void* p : {static_cast<void*>(r.resid), static_cast<void*>(r.xn), static_cast<void*>(r.o),
                  static_cast<void*>(r.y), static_cast<void*>(r.z), static_cast<void*>(r.ss)}) {
    cudaFree(p);
  }
}

void CheckFolded(Gemm& g, const Shape& sh, ActType type, std::mt19937& rng) {
  SCOPED_TRACE(::testing::Message() << (type == ActType::kBF16 ? "bf16 " : "fp16 ") << "m " << sh.m
                                    << " k " << sh.k << " hidden " << sh.hidden << " n " << sh.n
                                    << " inter " << sh.inter << (sh.bias ? " bias" : ""));
  const float eps = 1e-5f;
  const Host h = MakeInputs(sh, type, rng);
  uint16_t* x = ToDevice(h.x);
  uint16_t* w_o = ToDevice(h.w_o);
  uint16_t* bias = sh.bias ? ToDevice(h.bias) : nullptr;
  uint16_t* gamma = ToDevice(h.gamma);
  uint16_t* w_n = ToDevice(h.w_n);
  uint16_t* w_gu = ToDevice(h.w_gu);
  // Unfolded: product, add + norm, products.
  const Run a = NewRun(sh, h);
  ASSERT_TRUE(g.Run(x, w_o, a.o, sh.m, sh.hidden, sh.k, type, false, nullptr).ok());
  ASSERT_EQ(LaunchAddRmsNorm(a.resid, a.o, bias, gamma, eps, sh.m, sh.hidden, a.xn, type, nullptr),
            cudaSuccess);
  ASSERT_TRUE(g.Run(a.xn, w_n, a.y, sh.m, sh.n, sh.hidden, type, false, nullptr).ok());
  ASSERT_TRUE(g.RunSkinnySiluMul(a.xn, w_gu, a.z, sh.m, sh.inter, sh.hidden, type, nullptr).ok());
  // Folded, twice.
  const SkinnyNormIn in{nullptr, SkinnyNormBlocks(sh.m, sh.hidden), sh.hidden, eps};
  std::vector<uint16_t> y[2], z[2];
  std::vector<float> resid[2];
  for (int rep = 0; rep < 2; ++rep) {
    const Run b = NewRun(sh, h);
    SkinnyNormIn bin = in;
    bin.sumsq = b.ss;
    ASSERT_TRUE(g.RunSkinnyNormOut(x, w_o, sh.m, sh.hidden, sh.k,
                                   {b.resid, bias, gamma, b.xn, b.ss}, type, nullptr)
                    .ok());
    ASSERT_TRUE(g.RunSkinnyNormIn(b.xn, w_n, b.y, sh.m, sh.n, sh.hidden, bin, type, nullptr).ok());
    ASSERT_TRUE(
        g.RunSkinnySiluMul(b.xn, w_gu, b.z, sh.m, sh.inter, sh.hidden, type, nullptr, &bin).ok());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    y[rep] = ToHost(b.y, static_cast<size_t>(sh.m) * sh.n);
    z[rep] = ToHost(b.z, static_cast<size_t>(sh.m) * sh.inter);
    resid[rep] = ToHost(b.resid, static_cast<size_t>(sh.m) * sh.hidden);
    FreeRun(b);
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto resid_a = ToHost(a.resid, static_cast<size_t>(sh.m) * sh.hidden);
  EXPECT_EQ(resid[0], resid_a) << "the folded residual differs from LaunchAddRmsNorm's";
  EXPECT_EQ(y[0], y[1]) << "a folded run did not repeat bit for bit";
  EXPECT_EQ(z[0], z[1]) << "a folded run did not repeat bit for bit";
  const Reference ref = Expected(sh, h, resid_a, eps, type);
  const Errors unfolded = Compare(ref, ToHost(a.y, ref.y.size()), ToHost(a.z, ref.z.size()), type);
  const Errors folded = Compare(ref, y[0], z[0], type);
  ASSERT_GT(folded.y_mag, 0.0);
  ASSERT_GT(folded.z_mag, 0.0);
  // Both round x to the activation type once (at different points) and the
  // result once: the same error, within a rounding step.
  EXPECT_LT(folded.y, 0.02 * folded.y_mag);
  EXPECT_LT(folded.z, 0.02 * folded.z_mag);
  EXPECT_LT(folded.y, 2.0 * unfolded.y + 1e-3 * folded.y_mag);
  EXPECT_LT(folded.z, 2.0 * unfolded.z + 1e-3 * folded.z_mag);
  FreeRun(a);
  for (void* p : {static_cast<void*>(x), static_cast<void*>(w_o), static_cast<void*>(bias),
                  static_cast<void*>(gamma), static_cast<void*>(w_n), static_cast<void*>(w_gu)}) {
    cudaFree(p);
  }
}

TEST(CudaSkinnyNorm, FoldedNormMatchesNormThenProduct) {
  if (!HaveGpu()) GTEST_SKIP() << "no usable GPU";
  auto g = Gemm::Create(GemmOptions{});
  ASSERT_TRUE(g.ok()) << g.status();
  std::mt19937 rng(5);
  for (const ActType type : {ActType::kBF16, ActType::kF16}) {
    for (const Shape sh :
         {Shape{1, 4096, 4096, 6144, 1432, false}, Shape{2, 512, 264, 77, 96, true},
          Shape{1, 1024, 1000, 130, 64, true}, Shape{2, 2048, 2048, 512, 301, false}}) {
      CheckFolded(**g, sh, type, rng);
    }
  }
}

TEST(CudaSkinnyNorm, RefusesWhatItCannotFold) {
  if (!HaveGpu()) GTEST_SKIP() << "no usable GPU";
  GemmOptions go;
  go.skinny_max_m = kSkinnyGemmMaxM;
  auto g = Gemm::Create(go);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_TRUE(SkinnyNormSupports(2, 4096));
  EXPECT_FALSE(SkinnyNormSupports(3, 4096));  // skinny, but more rows than the fold takes
  EXPECT_FALSE(SkinnyNormSupports(1, 4100));  // not a multiple of 8
  float dummy = 0;
  const SkinnyNormOut out{&dummy, nullptr, &dummy, &dummy, &dummy};
  EXPECT_EQ(
      (*g)->RunSkinnyNormOut(&dummy, &dummy, 3, 4096, 512, out, ActType::kBF16, nullptr).code(),
      absl::StatusCode::kInternal);
  SkinnyNormOut no_sums = out;
  no_sums.sumsq = nullptr;
  EXPECT_EQ(
      (*g)->RunSkinnyNormOut(&dummy, &dummy, 1, 4096, 512, no_sums, ActType::kBF16, nullptr).code(),
      absl::StatusCode::kInternal);
  // A consumer whose block count is not its producer's.
  const SkinnyNormIn wrong{&dummy, SkinnyNormBlocks(1, 4096) + 1, 4096, 1e-5f};
  EXPECT_EQ(
      (*g)->RunSkinnyNormIn(&dummy, &dummy, &dummy, 1, 64, 4096, wrong, ActType::kBF16, nullptr)
          .code(),
      absl::StatusCode::kInternal);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

}  // namespace
}  // namespace ballast::engine::cuda
