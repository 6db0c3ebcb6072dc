// The tensor-core skinny products (kernels.h, LaunchSkinnyMma and its SiLU
// and W8A8 forms) against double-precision references over the values the
// device holds: 2-byte weights in BF16 and FP16, E4M3 weights beside 2-byte
// activations (W8A16; the E4M3 bytes decoded here, bit by bit, from the
// format's definition) and beside E4M3 activations (W8A8), every row count
// from 1 to 16, widths that leave a partial last tile. A row's result must
// not depend on how many rows share the launch (bit for bit). Skips
// without a GPU.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

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

// E4M3 (1 sign, 4 exponent bits of bias 7, 3 mantissa bits; exponent 0:
// subnormal) as a double, from the format's definition.
double DecodeE4m3(uint8_t b) {
  const int e = (b >> 3) & 15, mant = b & 7;
  const double mag =
      e == 0 ? mant * std::ldexp(1.0, -9) : (1.0 + mant / 8.0) * std::ldexp(1.0, e - 7);
  return (b & 0x80) != 0 ? -mag : mag;
}

struct Operands {
  int m = 0, n = 0, k = 0;
  std::vector<double> x, w;  // the values the device multiplies, [m][k] and [n][k]
  void* dx = nullptr;        // x in the activation type (or E4M3, W8A8)
  float* dx_scale = nullptr;
  void* dw = nullptr;  // w in the activation type or E4M3
  float* dw_scale = nullptr;
  ~Operands() {
    for (void* p : {dx, static_cast<void*>(dx_scale), dw, static_cast<void*>(dw_scale)}) {
      cudaFree(p);
    }
  }
};

// Random 2-byte x and w, their E4M3 forms rounded on the device when asked
// (LaunchQuantizeRowsFp8: w_fp8 for the weights, x_fp8 for x), and the
// values each form stands for.
void MakeOperands(Operands* o, int m, int n, int k, ActType type, bool w_fp8, bool x_fp8,
                  uint32_t seed) {
  o->m = m;
  o->n = n;
  o->k = k;
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  auto rounded = [&](size_t count, float scale, std::vector<double>* values) {
    std::vector<uint16_t> bits(count);
    values->resize(count);
    for (size_t i = 0; i < count; ++i) {
      bits[i] = ToActBits(scale * nd(rng), type);
      (*values)[i] = FromActBits(bits[i], type);
    }
    return bits;
  };
  // w first: x's rows for m rows are then the first rows of x for more.
  const auto wb = rounded(static_cast<size_t>(n) * k, 0.05f, &o->w);
  const auto xb = rounded(static_cast<size_t>(m) * k, 1.0f, &o->x);
  const SrcType src = type == ActType::kBF16 ? SrcType::kBF16 : SrcType::kF16;
  auto to_fp8 = [&](const std::vector<uint16_t>& bits, int rows, void** d, float** d_scale,
                    std::vector<double>* values) {
    uint16_t* d_src = ToDevice(bits);
    ASSERT_EQ(cudaMalloc(d, bits.size()), cudaSuccess);
    ASSERT_EQ(cudaMalloc(d_scale, rows * sizeof(float)), cudaSuccess);
    ASSERT_EQ(LaunchQuantizeRowsFp8(d_src, src, rows, k, *d, *d_scale, nullptr), cudaSuccess);
    const auto q = ToHost(static_cast<uint8_t*>(*d), bits.size());
    const auto s = ToHost(*d_scale, rows);
    for (size_t i = 0; i < q.size(); ++i) (*values)[i] = DecodeE4m3(q[i]) * s[i / k];
    cudaFree(d_src);
  };
  if (w_fp8) {
    to_fp8(wb, n, &o->dw, &o->dw_scale, &o->w);
  } else {
    o->dw = ToDevice(wb);
  }
  if (x_fp8) {
    to_fp8(xb, m, &o->dx, &o->dx_scale, &o->x);
  } else {
    o->dx = ToDevice(xb);
  }
}

double Dot(const Operands& o, int i, int r) {
  double acc = 0;
  for (int j = 0; j < o.k; ++j) {
    acc += o.x[static_cast<size_t>(i) * o.k + j] * o.w[static_cast<size_t>(r) * o.k + j];
  }
  return acc;
}

// y [m][n] read back as doubles (the activation type, or FP32).
std::vector<double> Output(const void* dy, size_t count, ActType type, bool f32) {
  std::vector<double> y(count);
  if (f32) {
    const auto v = ToHost(static_cast<const float*>(dy), count);
    std::copy(v.begin(), v.end(), y.begin());
  } else {
    const auto v = ToHost(static_cast<const uint16_t*>(dy), count);
    for (size_t i = 0; i < count; ++i) y[i] = FromActBits(v[i], type);
  }
  return y;
}

enum class Form { k2Byte, kW8A16, kW8A8 };

// One plain product through the tensor-core kernel; returns y's bits.
std::vector<uint8_t> RunPlain(const Operands& o, ActType type, Form form, bool f32) {
  const size_t bytes = static_cast<size_t>(o.m) * o.n * (f32 ? 4 : 2);
  void* dy = nullptr;
  EXPECT_EQ(cudaMalloc(&dy, bytes), cudaSuccess);
  cudaError_t e = cudaSuccess;
  switch (form) {
    case Form::k2Byte:
      e = LaunchSkinnyMma(o.dx, o.dw, dy, o.m, o.n, o.k, type, f32, nullptr);
      break;
    case Form::kW8A16:
      e = LaunchSkinnyMma(o.dx, o.dw, dy, o.m, o.n, o.k, type, false, nullptr, o.dw_scale);
      break;
    case Form::kW8A8:
      e = LaunchSkinnyMmaFp8(o.dx, o.dx_scale, o.dw, o.dw_scale, dy, o.m, o.n, o.k, type, nullptr);
      break;
  }
  EXPECT_EQ(e, cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto y = Output(dy, static_cast<size_t>(o.m) * o.n, type, f32);
  double max_err = 0, max_mag = 0;
  for (int i = 0; i < o.m; ++i) {
    for (int r = 0; r < o.n; ++r) {
      const double want = Dot(o, i, r);
      max_err = std::max(max_err, std::abs(want - y[static_cast<size_t>(i) * o.n + r]));
      max_mag = std::max(max_mag, std::abs(want));
    }
  }
  // The reference multiplies the device's values: only the FP32 sums'
  // order and y's rounding (2^-9 of |y| in BF16) differ.
  EXPECT_LT(max_err, 0.005 * max_mag) << "max |y| " << max_mag;
  std::vector<uint8_t> bits(bytes);
  EXPECT_EQ(cudaMemcpy(bits.data(), dy, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(dy);
  return bits;
}

TEST(CudaSkinnyMma, ProductsMatchTheReferenceAndDoNotDependOnTheRows) {
  if (!HaveGpu()) GTEST_SKIP() << "no usable GPU";
  struct Case {
    ActType type;
    Form form;
    bool f32;
  };
  const Case cases[] = {
      {ActType::kBF16, Form::k2Byte, false}, {ActType::kF16, Form::k2Byte, false},
      {ActType::kBF16, Form::k2Byte, true},  {ActType::kBF16, Form::kW8A16, false},
      {ActType::kF16, Form::kW8A16, false},  {ActType::kBF16, Form::kW8A8, false},
      {ActType::kF16, Form::kW8A8, false}};
  // n = 40: two full tiles and half of a third; k = 1,152: 9 chunks of 128
  // bytes (2-byte weights: 18) over 8 warps; 4,096 x 64: one chunk a warp.
  const std::pair<int, int> shapes[] = {{40, 1152}, {64, 4096}};
  for (const Case& c : cases) {
    for (const auto& [n, k] : shapes) {
      const bool w8 = c.form != Form::k2Byte, x8 = c.form == Form::kW8A8;
      Operands all;
      MakeOperands(&all, kSkinnyMmaMaxM, n, k, c.type, w8, x8, 11 + n);
      std::vector<uint8_t> all_bits;
      {
        SCOPED_TRACE(::testing::Message() << "m=16 n=" << n << " k=" << k << " form "
                                          << static_cast<int>(c.form) << " f32 " << c.f32);
        all_bits = RunPlain(all, c.type, c.form, c.f32);
      }
      for (int m = 1; m < kSkinnyMmaMaxM; ++m) {
        SCOPED_TRACE(::testing::Message() << "m=" << m << " n=" << n << " k=" << k << " form "
                                          << static_cast<int>(c.form) << " f32 " << c.f32);
        // The first m rows of the same operands (x8: E4M3 rows keep their
        // own scales, so the same bytes).
        Operands few;
        MakeOperands(&few, m, n, k, c.type, w8, x8, 11 + n);
        const auto bits = RunPlain(few, c.type, c.form, c.f32);
        ASSERT_EQ(0, std::memcmp(bits.data(), all_bits.data(), bits.size()))
            << "rows 0.." << m - 1 << " differ from the same rows among 16";
      }
    }
  }
}

TEST(CudaSkinnyMma, SiluPairsMatchTheReference) {
  if (!HaveGpu()) GTEST_SKIP() << "no usable GPU";
  const int inter = 40, k = 1152;
  for (const ActType type : {ActType::kBF16, ActType::kF16}) {
    for (const bool w8 : {false, true}) {
      for (const int m : {1, 3, 8, 9, 16}) {
        SCOPED_TRACE(::testing::Message()
                     << "m=" << m << " fp16 " << (type == ActType::kF16) << " E4M3 weights " << w8);
        Operands o;  // w: [gate; up], 2 inter rows
        MakeOperands(&o, m, 2 * inter, k, type, w8, false, 5 + m);
        void* dy = nullptr;
        ASSERT_EQ(cudaMalloc(&dy, static_cast<size_t>(m) * inter * 2), cudaSuccess);
        ASSERT_EQ(LaunchSkinnyMmaSiluMul(o.dx, o.dw, dy, m, inter, k, type, nullptr, o.dw_scale),
                  cudaSuccess);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const auto y = Output(dy, static_cast<size_t>(m) * inter, type, false);
        double max_err = 0, max_mag = 0;
        for (int i = 0; i < m; ++i) {
          for (int c = 0; c < inter; ++c) {
            // g and u rounded to the activation type, as the kernel's epilogue.
            const double g = FromActBits(ToActBits(static_cast<float>(Dot(o, i, c)), type), type);
            const double u =
                FromActBits(ToActBits(static_cast<float>(Dot(o, i, inter + c)), type), type);
            const double want = g / (1.0 + std::exp(-g)) * u;
            max_err = std::max(max_err, std::abs(want - y[static_cast<size_t>(i) * inter + c]));
            max_mag = std::max(max_mag, std::abs(want));
          }
        }
        // g and u may round the other way from the reference's (one unit of
        // the activation type each), then y's own rounding.
        EXPECT_LT(max_err, 0.02 * max_mag) << "max |y| " << max_mag;
        cudaFree(dy);
      }
    }
  }
}

TEST(CudaSkinnyMma, RefusesWhatItCannotRun) {
  EXPECT_TRUE(SkinnyMmaSupports(1, 128));
  EXPECT_TRUE(SkinnyMmaSupports(kSkinnyMmaMaxM, 14336));
  EXPECT_FALSE(SkinnyMmaSupports(0, 128));
  EXPECT_FALSE(SkinnyMmaSupports(kSkinnyMmaMaxM + 1, 128));
  EXPECT_FALSE(SkinnyMmaSupports(4, 4104));  // not a multiple of 128
  EXPECT_LE(kSkinnyMmaDefaultMaxM, kSkinnyMmaMaxM);
  // Checked before anything is launched, so no device is needed.
  EXPECT_EQ(LaunchSkinnyMma(nullptr, nullptr, nullptr, 17, 64, 128, ActType::kBF16, false, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(LaunchSkinnyMma(nullptr, nullptr, nullptr, 2, 64, 96, ActType::kBF16, false, nullptr),
            cudaErrorInvalidValue);
  float scale = 1.0f;  // E4M3 weights write the activation type only
  EXPECT_EQ(
      LaunchSkinnyMma(nullptr, nullptr, nullptr, 2, 64, 128, ActType::kBF16, true, nullptr, &scale),
      cudaErrorInvalidValue);
  EXPECT_EQ(LaunchSkinnyMmaFp8(nullptr, nullptr, nullptr, nullptr, nullptr, 2, 64, 128,
                               ActType::kBF16, nullptr),
            cudaErrorInvalidValue);
}

}  // namespace
}  // namespace ballast::engine::cuda
