// RMSNorms folded into the skinny products around them (kernels.h,
// SkinnyNormOut / SkinnyNormIn, through Gemm::RunSkinnyNormOut,
// RunSkinnyNormIn and RunSkinnySiluMul): against the launches they replace
// (product, LaunchAddRmsNorm, product) the residual is bit for bit the
// same, and the normed products are as close to a double-precision
// reference as the unfolded ones; a folded run repeats bit for bit; BF16
// and FP16, one and two rows, with and without a bias, output counts that
// do and do not fill the consumers' blocks. And the qkv product with RoPE
// and the KV write in its epilogue (RunSkinnyRopeKv) against the product
// and LaunchRopeKvWrite. Each also with E4M3 weights (W8A16: the products'
// w_scale), against the same launches on the same E4M3 weights and a
// reference over their dequantized values.
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

using testing::FromActBits;
using testing::ToActBits;
using testing::ToDevice;
using testing::ToHost;

bool HaveGpu() { return GpuMemoryInfo(0).ok(); }

// A weight matrix [rows][cols] on the device: in the activation type, or
// E4M3 with one scale a row (LaunchQuantizeRowsFp8 of it). *values: what
// the device's weights stand for (dequantized), for the references.
struct DevWeights {
  void* w = nullptr;
  float* scale = nullptr;  // null: the activation type
};

DevWeights Upload(const std::vector<uint16_t>& bits, int rows, int cols, ActType type, bool fp8,
                  std::vector<double>* values) {
  DevWeights d;
  uint16_t* src = ToDevice(bits);
  values->resize(bits.size());
  if (!fp8) {
    d.w = src;
    for (size_t i = 0; i < bits.size(); ++i) (*values)[i] = FromActBits(bits[i], type);
    return d;
  }
  uint8_t* q = nullptr;
  EXPECT_EQ(cudaMalloc(&q, bits.size()), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&d.scale, rows * sizeof(float)), cudaSuccess);
  const SrcType st = type == ActType::kBF16 ? SrcType::kBF16 : SrcType::kF16;
  EXPECT_EQ(LaunchQuantizeRowsFp8(src, st, rows, cols, q, d.scale, nullptr), cudaSuccess);
  const auto qh = ToHost(q, bits.size());
  const auto sh = ToHost(d.scale, static_cast<size_t>(rows));
  for (size_t i = 0; i < qh.size(); ++i) {
    (*values)[i] = static_cast<double>(Fp8E4M3ToFloat(qh[i])) * sh[i / cols];
  }
  cudaFree(src);
  d.w = q;
  return d;
}

void Free(const DevWeights& d) {
  cudaFree(d.w);
  cudaFree(d.scale);
}

// The plain product on either kind of weights (E4M3: RunFp8, which takes
// up to four rows unquantized).
absl::Status Plain(Gemm& g, const void* x, const DevWeights& w, void* y, int m, int n, int k,
                   ActType type) {
  if (w.scale != nullptr) return g.RunFp8(x, w.w, w.scale, y, m, n, k, type, nullptr);
  return g.Run(x, w.w, y, m, n, k, type, false, nullptr);
}

// o projection [hidden][k] -> norm over hidden -> qkv-like [n][hidden] and
// gate/up [2 inter][hidden].
struct Shape {
  int m, k, hidden, n, inter;
  bool bias;
  bool fp8 = false;  // E4M3 weights
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
    for (auto& e : v) e = ToActBits(mean + scale * nd(rng), type);
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
// residual the GPU computed (bit-identical in both paths, checked), over
// the weights' values (w_n, w_gu: as Upload gives them).
struct Reference {
  std::vector<double> y, z;
};

Reference Expected(const Shape& sh, const Host& h, const std::vector<double>& w_n,
                   const std::vector<double>& w_gu, const std::vector<float>& resid, float eps,
                   ActType type) {
  Reference ref;
  for (int i = 0; i < sh.m; ++i) {
    const float* r = resid.data() + static_cast<size_t>(i) * sh.hidden;
    double ss = 0;
    for (int j = 0; j < sh.hidden; ++j) ss += static_cast<double>(r[j]) * r[j];
    const double inv = 1.0 / std::sqrt(ss / sh.hidden + eps);
    std::vector<double> xn(static_cast<size_t>(sh.hidden));
    for (int j = 0; j < sh.hidden; ++j) xn[j] = FromActBits(h.gamma[j], type) * r[j] * inv;
    auto dot = [&](const std::vector<double>& w, int row) {
      double s = 0;
      for (int j = 0; j < sh.hidden; ++j) s += xn[j] * w[static_cast<size_t>(row) * sh.hidden + j];
      return s;
    };
    for (int c = 0; c < sh.n; ++c) ref.y.push_back(dot(w_n, c));
    for (int c = 0; c < sh.inter; ++c) {
      const double g = dot(w_gu, c), u = dot(w_gu, sh.inter + c);
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
    e.y = std::max(e.y, std::abs(ref.y[i] - FromActBits(y[i], type)));
    e.y_mag = std::max(e.y_mag, std::abs(ref.y[i]));
  }
  for (size_t i = 0; i < ref.z.size(); ++i) {
    e.z = std::max(e.z, std::abs(ref.z[i] - FromActBits(z[i], type)));
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
  SCOPED_TRACE(::testing::Message()
               << (type == ActType::kBF16 ? "bf16 " : "fp16 ") << "m " << sh.m << " k " << sh.k
               << " hidden " << sh.hidden << " n " << sh.n << " inter " << sh.inter
               << (sh.bias ? " bias" : "") << (sh.fp8 ? " e4m3 weights" : ""));
  const float eps = 1e-5f;
  const Host h = MakeInputs(sh, type, rng);
  uint16_t* x = ToDevice(h.x);
  std::vector<double> o_val, n_val, gu_val;
  const DevWeights w_o = Upload(h.w_o, sh.hidden, sh.k, type, sh.fp8, &o_val);
  uint16_t* bias = sh.bias ? ToDevice(h.bias) : nullptr;
  uint16_t* gamma = ToDevice(h.gamma);
  const DevWeights w_n = Upload(h.w_n, sh.n, sh.hidden, type, sh.fp8, &n_val);
  const DevWeights w_gu = Upload(h.w_gu, 2 * sh.inter, sh.hidden, type, sh.fp8, &gu_val);
  // Unfolded: product, add + norm, products.
  const Run a = NewRun(sh, h);
  ASSERT_TRUE(Plain(g, x, w_o, a.o, sh.m, sh.hidden, sh.k, type).ok());
  ASSERT_EQ(LaunchAddRmsNorm(a.resid, a.o, bias, gamma, eps, sh.m, sh.hidden, a.xn, type, nullptr),
            cudaSuccess);
  ASSERT_TRUE(Plain(g, a.xn, w_n, a.y, sh.m, sh.n, sh.hidden, type).ok());
  ASSERT_TRUE(g.RunSkinnySiluMul(a.xn, w_gu.w, a.z, sh.m, sh.inter, sh.hidden, type, nullptr,
                                 nullptr, w_gu.scale)
                  .ok());
  // Folded, twice.
  const SkinnyNormIn in{nullptr, SkinnyNormBlocks(sh.m, sh.hidden), sh.hidden, eps};
  std::vector<uint16_t> y[2], z[2];
  std::vector<float> resid[2];
  for (int rep = 0; rep < 2; ++rep) {
    const Run b = NewRun(sh, h);
    SkinnyNormIn bin = in;
    bin.sumsq = b.ss;
    ASSERT_TRUE(g.RunSkinnyNormOut(x, w_o.w, sh.m, sh.hidden, sh.k,
                                   {b.resid, bias, gamma, b.xn, b.ss}, type, nullptr, w_o.scale)
                    .ok());
    ASSERT_TRUE(
        g.RunSkinnyNormIn(b.xn, w_n.w, b.y, sh.m, sh.n, sh.hidden, bin, type, nullptr, w_n.scale)
            .ok());
    ASSERT_TRUE(g.RunSkinnySiluMul(b.xn, w_gu.w, b.z, sh.m, sh.inter, sh.hidden, type, nullptr,
                                   &bin, w_gu.scale)
                    .ok());
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
  const Reference ref = Expected(sh, h, n_val, gu_val, resid_a, eps, type);
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
  for (const DevWeights& w : {w_o, w_n, w_gu}) Free(w);
  for (void* p : {static_cast<void*>(x), static_cast<void*>(bias), static_cast<void*>(gamma)}) {
    cudaFree(p);
  }
}

TEST(CudaSkinnyNorm, FoldedNormMatchesNormThenProduct) {
  if (!HaveGpu()) GTEST_SKIP() << "no usable GPU";
  auto g = Gemm::Create(GemmOptions{});
  ASSERT_TRUE(g.ok()) << g.status();
  std::mt19937 rng(5);
  for (const ActType type : {ActType::kBF16, ActType::kF16}) {
    for (Shape sh : {Shape{1, 4096, 4096, 6144, 1432, false}, Shape{2, 512, 264, 77, 96, true},
                     Shape{1, 1024, 1000, 130, 64, true}, Shape{2, 2048, 2048, 512, 301, false}}) {
      CheckFolded(**g, sh, type, rng);
      if (sh.k % 16 == 0 && sh.hidden % 16 == 0) {  // E4M3 rows of 16-byte loads
        sh.fp8 = true;
        CheckFolded(**g, sh, type, rng);
      }
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
  EXPECT_TRUE(SkinnyGemmFp8WeightsSupports(4, 4096));
  EXPECT_FALSE(SkinnyGemmFp8WeightsSupports(5, 4096));  // W8A16 takes up to four rows
  EXPECT_FALSE(SkinnyGemmFp8WeightsSupports(1, 4104));  // E4M3 rows of whole 16-byte loads
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

// The qkv product with RoPE and the KV write in its epilogue
// (RunSkinnyRopeKv) against the product rounded into qkv and then
// LaunchRopeKvWrite: q and the cache bit for bit.
struct RopeShape {
  int m, D, H, Hkv, k;
  bool bias, fp8, norm_in, padding;  // padding: the last token's position is -1
  bool e4m3_weights = false;
};

void CheckRope(Gemm& g, const RopeShape& sh, std::mt19937& rng) {
  SCOPED_TRACE(::testing::Message()
               << "m " << sh.m << " D " << sh.D << " H " << sh.H << " Hkv " << sh.Hkv << " k "
               << sh.k << (sh.bias ? " bias" : "") << (sh.fp8 ? " fp8" : "")
               << (sh.norm_in ? " norm_in" : "") << (sh.padding ? " padding" : "")
               << (sh.e4m3_weights ? " e4m3 weights" : ""));
  const ActType type = ActType::kBF16;
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int width = (sh.H + 2 * sh.Hkv) * sh.D, BT = 16;
  std::vector<uint16_t> x(static_cast<size_t>(kSkinnyGemmMaxM) * sh.k), w(width * sh.k),
      bias(width);
  for (auto& v : x) v = ToActBits(nd(rng), type);
  for (auto& v : w) v = ToActBits(0.05f * nd(rng), type);
  for (auto& v : bias) v = ToActBits(0.1f * nd(rng), type);
  std::vector<float> inv(sh.D / 2);
  for (int i = 0; i < sh.D / 2; ++i) inv[i] = 1.0f / std::pow(500000.0f, 2.0f * i / sh.D);
  std::vector<int> seq = {0, 1}, pos = {5, 40};
  if (sh.padding) pos[sh.m - 1] = -1;
  const std::vector<int> table = {2, 0, 0, 1, 3, 4};  // 2 seqs x 3 blocks
  const size_t row = static_cast<size_t>(sh.Hkv) * sh.D * (sh.fp8 ? 1 : 2),
               block_bytes = 2 * BT * row;
  // A producer's per-block sums of squares (any positive values).
  const int blocks = SkinnyNormBlocks(sh.m, sh.k);
  std::vector<float> sums(static_cast<size_t>(kSkinnyNormMaxM) * blocks);
  for (auto& v : sums) v = 1.0f + std::abs(nd(rng));
  uint16_t* dx = ToDevice(x);
  std::vector<double> w_val;
  const DevWeights dw = Upload(w, width, sh.k, type, sh.e4m3_weights, &w_val);
  uint16_t* dbias = sh.bias ? ToDevice(bias) : nullptr;
  float* dinv = ToDevice(inv);
  int* dseq = ToDevice(seq);
  int* dpos = ToDevice(pos);
  int* dtable = ToDevice(table);
  float* dsums = ToDevice(sums);
  const SkinnyNormIn in{dsums, blocks, sh.k, 1e-5f};
  uint16_t* dqkv = ToDevice(std::vector<uint16_t>(static_cast<size_t>(sh.m) * width));
  std::vector<uint8_t> pools[2];
  std::vector<uint16_t> qs[2];
  for (int fused = 0; fused < 2; ++fused) {
    uint8_t* dpool = ToDevice(std::vector<uint8_t>(block_bytes * 5, 0x5A));
    uint16_t* dq = ToDevice(std::vector<uint16_t>(static_cast<size_t>(sh.m) * sh.H * sh.D, 0x1234));
    PagedKv kv;
    kv.block_ids = dtable;
    kv.max_blocks = 3;
    kv.base = dpool;
    kv.block_bytes = block_bytes;
    kv.block_tokens = BT;
    kv.num_kv_heads = sh.Hkv;
    kv.head_dim = sh.D;
    if (sh.fp8) {
      kv.dtype = KvType::kFP8E4M3;
      kv.k_scale = 0.5f;
      kv.v_scale = 0.25f;
    }
    const TokenMap tokens{dseq, dpos, sh.m};
    if (fused == 1) {
      ASSERT_TRUE(SkinnyRopeSupports(sh.m, sh.k, sh.H, kv));
      const SkinnyRope rope{dinv, tokens, kv, dq, dbias, sh.H};
      ASSERT_TRUE(g.RunSkinnyRopeKv(dx, dw.w, sh.m, sh.k, sh.norm_in ? &in : nullptr, rope, type,
                                    nullptr, dw.scale)
                      .ok());
    } else {
      if (sh.norm_in) {
        ASSERT_TRUE(
            g.RunSkinnyNormIn(dx, dw.w, dqkv, sh.m, width, sh.k, in, type, nullptr, dw.scale).ok());
      } else {
        ASSERT_TRUE(Plain(g, dx, dw, dqkv, sh.m, width, sh.k, type).ok());
      }
      ASSERT_EQ(LaunchRopeKvWrite(dqkv, dbias, QkNorm{}, dinv, tokens, sh.H, kv, dq, type, nullptr),
                cudaSuccess);
    }
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    pools[fused] = ToHost(dpool, block_bytes * 5);
    qs[fused] = ToHost(dq, static_cast<size_t>(sh.m) * sh.H * sh.D);
    cudaFree(dpool);
    cudaFree(dq);
  }
  EXPECT_EQ(qs[1], qs[0]) << "q differs from the product + LaunchRopeKvWrite";
  EXPECT_EQ(pools[1], pools[0]) << "the KV cache differs from the product + LaunchRopeKvWrite";
  size_t written = 0;
  for (uint8_t b : pools[1]) written += b != 0x5A;
  EXPECT_GT(written, row) << "no K or V was written";
  Free(dw);
  for (void* p : {static_cast<void*>(dx), static_cast<void*>(dbias), static_cast<void*>(dinv),
                  static_cast<void*>(dseq), static_cast<void*>(dpos), static_cast<void*>(dtable),
                  static_cast<void*>(dsums), static_cast<void*>(dqkv)}) {
    cudaFree(p);
  }
}

TEST(CudaSkinnyRope, RopeEpilogueMatchesTheProductThenLaunchRopeKvWrite) {
  if (!HaveGpu()) GTEST_SKIP() << "no usable GPU";
  auto g = Gemm::Create(GemmOptions{});
  ASSERT_TRUE(g.ok()) << g.status();
  std::mt19937 rng(9);
  for (RopeShape sh : {RopeShape{1, 128, 32, 8, 4096, false, false, true, false},
                       RopeShape{2, 64, 4, 2, 256, true, false, false, false},
                       RopeShape{2, 64, 4, 2, 256, true, true, true, false},
                       RopeShape{1, 16, 6, 3, 512, false, true, false, false},
                       RopeShape{2, 128, 8, 1, 1024, true, false, true, true}}) {
    CheckRope(**g, sh, rng);
    sh.e4m3_weights = true;
    CheckRope(**g, sh, rng);
  }
  PagedKv odd;
  odd.num_kv_heads = 2;
  odd.head_dim = 12;  // pairs of 4 need D % 8 == 0
  EXPECT_FALSE(SkinnyRopeSupports(1, 256, 4, odd));
  odd.head_dim = 64;
  EXPECT_TRUE(SkinnyRopeSupports(2, 256, 4, odd));
  EXPECT_FALSE(SkinnyRopeSupports(3, 256, 4, odd));
}

}  // namespace
}  // namespace ballast::engine::cuda
