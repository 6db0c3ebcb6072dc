// CUDA kernels one by one against plain C++ references on the same
// (already rounded) inputs: RoPE + KV append with and without Qwen3's q/k
// norms, fused residual RMSNorm and SiLU-and-multiply (RoPE and RMSNorm
// through their vector kernels and their scalar fallbacks), and the GEMM
// wrapper with and without timed algorithms. The attention kernels are in
// cuda_attention_test.cc. Skips without a GPU.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
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

bool HaveGpu() { return GpuMemoryInfo(0).ok(); }

using testing::ToDevice;
using testing::ToHost;

// Residual add (with a bias when `bias`) + RMSNorm of T rows of width H,
// the device arrays starting `offset` elements into their allocations
// (offset 2: off the 16-byte boundary, so the scalar kernel runs; so does
// H % 4 != 0).
void RunRmsNorm(int T, int H, int offset, bool bias = false) {
  SCOPED_TRACE(::testing::Message() << "H=" << H << " offset=" << offset << " bias=" << bias);
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> resid(T * H + offset);
  std::vector<uint16_t> delta(T * H + offset), w(H + offset), b(H + offset);
  for (auto& x : resid) x = nd(rng);
  for (auto& x : delta) x = FloatToBF16(nd(rng));
  for (auto& x : w) x = FloatToBF16(1.0f + 0.1f * nd(rng));
  for (auto& x : b) x = FloatToBF16(0.5f * nd(rng));
  float* d_resid = ToDevice(resid);
  uint16_t* d_delta = ToDevice(delta);
  uint16_t* d_w = ToDevice(w);
  uint16_t* d_b = ToDevice(b);
  uint16_t* d_out = ToDevice(std::vector<uint16_t>(T * H + offset));
  ASSERT_EQ(LaunchAddRmsNorm(d_resid + offset, d_delta + offset, bias ? d_b + offset : nullptr,
                             d_w + offset, 1e-5f, T, H, d_out + offset, ActType::kBF16, nullptr),
            cudaSuccess);
  const auto r2 = ToHost(d_resid, T * H + offset);
  const auto o = ToHost(d_out, T * H + offset);
  for (int t = 0; t < T; ++t) {
    double ss = 0;
    std::vector<double> x(H);
    for (int i = 0; i < H; ++i) {
      const int at = offset + t * H + i;
      x[i] = resid[at] + BF16ToFloat(delta[at]) + (bias ? BF16ToFloat(b[offset + i]) : 0.0);
      ss += x[i] * x[i];
      EXPECT_NEAR(r2[at], x[i], 1e-5) << "t " << t << " i " << i;
    }
    const double inv = 1.0 / std::sqrt(ss / H + 1e-5);
    for (int i = 0; i < H; ++i) {
      EXPECT_NEAR(BF16ToFloat(o[offset + t * H + i]), BF16ToFloat(w[offset + i]) * x[i] * inv,
                  0.01 * std::abs(x[i] * inv) + 1e-3)
          << "t " << t << " i " << i;
    }
  }
  for (void* p : {static_cast<void*>(d_resid), static_cast<void*>(d_delta), static_cast<void*>(d_w),
                  static_cast<void*>(d_b), static_cast<void*>(d_out)}) {
    cudaFree(p);
  }
}

TEST(CudaKernels, RmsNormSiluAndRopeMatchReference) {
  if (!HaveGpu()) GTEST_SKIP() << "no usable GPU";
  RunRmsNorm(5, 320, 0);         // vector kernel, 2 vectors per thread at most
  RunRmsNorm(3, 4096, 0);        // Llama-3-8B
  RunRmsNorm(2, 16384, 0);       // the widest the vector kernel holds in registers
  RunRmsNorm(3, 16388, 0);       // wider: the scalar kernel
  RunRmsNorm(5, 322, 0);         // H % 4 != 0: the scalar kernel
  RunRmsNorm(5, 320, 2);         // misaligned rows: the scalar kernel
  RunRmsNorm(3, 4096, 0, true);  // with the bias (Qwen2's o_proj)
  RunRmsNorm(5, 322, 0, true);
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int T = 5;
  // SiLU(gate) * up.
  const int I = 96;
  std::vector<uint16_t> gu(T * 2 * I);
  for (auto& x : gu) x = FloatToBF16(nd(rng));
  uint16_t* d_gu = ToDevice(gu);
  uint16_t* d_act = ToDevice(std::vector<uint16_t>(T * I));
  ASSERT_EQ(LaunchSiluMul(d_gu, T, I, d_act, ActType::kBF16, nullptr), cudaSuccess);
  const auto act = ToHost(d_act, T * I);
  for (int t = 0; t < T; ++t) {
    for (int i = 0; i < I; ++i) {
      const double g = BF16ToFloat(gu[t * 2 * I + i]), u = BF16ToFloat(gu[t * 2 * I + I + i]);
      const double want = g / (1 + std::exp(-g)) * u;
      EXPECT_NEAR(BF16ToFloat(act[t * I + i]), want, 0.01 * std::abs(want) + 1e-3);
    }
  }
  cudaFree(d_gu);
  cudaFree(d_act);
}

struct GemmShape {
  int m, n, k;
  bool f32;
};

// One product of random BF16 operands through `g` on `stream`, against a
// double-precision reference.
void CheckGemm(Gemm& g, const GemmShape sh, std::mt19937& rng, cudaStream_t stream = nullptr) {
  SCOPED_TRACE(::testing::Message() << sh.m << "x" << sh.n << "x" << sh.k);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<uint16_t> x(static_cast<size_t>(sh.m) * sh.k), w(static_cast<size_t>(sh.n) * sh.k);
  for (auto& v : x) v = FloatToBF16(nd(rng));
  for (auto& v : w) v = FloatToBF16(0.05f * nd(rng));
  uint16_t* dx = ToDevice(x);
  uint16_t* dw = ToDevice(w);
  void* dy = nullptr;
  ASSERT_EQ(cudaMalloc(&dy, static_cast<size_t>(sh.m) * sh.n * 4), cudaSuccess);
  ASSERT_TRUE(g.Run(dx, dw, dy, sh.m, sh.n, sh.k, ActType::kBF16, sh.f32, stream).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<float> y(static_cast<size_t>(sh.m) * sh.n);
  if (sh.f32) {
    y = ToHost(static_cast<float*>(dy), y.size());
  } else {
    const auto yb = ToHost(static_cast<uint16_t*>(dy), y.size());
    for (size_t i = 0; i < y.size(); ++i) y[i] = BF16ToFloat(yb[i]);
  }
  double max_err = 0, max_mag = 0;
  for (int i = 0; i < sh.m; ++i) {
    for (int j = 0; j < sh.n; ++j) {
      double acc = 0;
      for (int k = 0; k < sh.k; ++k)
        acc += BF16ToFloat(x[static_cast<size_t>(i) * sh.k + k]) *
               BF16ToFloat(w[static_cast<size_t>(j) * sh.k + k]);
      max_err = std::max(max_err, std::abs(acc - y[static_cast<size_t>(i) * sh.n + j]));
      max_mag = std::max(max_mag, std::abs(acc));
    }
  }
  EXPECT_LT(max_err, 0.01 * max_mag);
  cudaFree(dx);
  cudaFree(dw);
  cudaFree(dy);
}

TEST(CudaKernels, GemmMatchesReference) {
  if (!HaveGpu()) GTEST_SKIP() << "no usable GPU";
  // Rows up to the skinny limit (8, then the default 2): the skinny kernel;
  // more: cuBLASLt.
  for (const int skinny : {kSkinnyGemmMaxM, kSkinnyGemmDefaultMaxM}) {
    for (const int tune : {0, 8}) {  // the heuristic's first algorithm; the fastest of 8 timed
      SCOPED_TRACE(::testing::Message() << "tune_candidates=" << tune << " skinny " << skinny);
      GemmOptions go;
      go.skinny_max_m = skinny;
      go.tune_candidates = tune;
      auto g = Gemm::Create(go);
      ASSERT_TRUE(g.ok()) << g.status();
      EXPECT_EQ((*g)->UsesSkinny(7, 512), skinny >= 7);
      std::mt19937 rng(9);
      // 1 x 14336 and 2 x 8456 (34 chunks of 256) run the skinny kernel's
      // whole unrolled loop, its remainder and a partial last chunk.
      for (const GemmShape sh : {GemmShape{1, 384, 512, false}, GemmShape{20, 1536, 512, false},
                                 GemmShape{300, 512, 1024, false}, GemmShape{7, 300, 512, true},
                                 GemmShape{64, 4096, 4096, false}, GemmShape{16, 1000, 4104, false},
                                 GemmShape{3, 4097, 64, true}, GemmShape{12, 96, 8, false},
                                 GemmShape{1, 130, 14336, false}, GemmShape{2, 96, 8456, true}}) {
        CheckGemm(**g, sh, rng);
      }
      if (tune == 0) {
        EXPECT_EQ((*g)->tuned_buckets(), 0);
      } else {
        EXPECT_GT((*g)->tuned_buckets(), 0);
      }
    }
  }
}

// Tuning: one timing per shape and graph row bucket (multiples of 64 past
// 256 rows), none past 2,048 rows, none while warming (SetWarming, which
// also launches an algorithm once per shape), and none under graph capture
// (the product is captured with the heuristic's first algorithm and timed
// at the next uncaptured call).
TEST(CudaKernels, GemmTunesOncePerBucketAndNotUnderCapture) {
  if (!HaveGpu()) GTEST_SKIP() << "no usable GPU";
  GemmOptions go;
  go.skinny_max_m = 0;
  go.tune_candidates = 8;
  auto made = Gemm::Create(go);
  ASSERT_TRUE(made.ok()) << made.status();
  Gemm& g = **made;
  std::mt19937 rng(11);
  // Up to 2,048 rows the buckets are the decode graphs' (multiples of 64
  // past 256); larger products are not timed.
  CheckGemm(g, {300, 512, 1024, false}, rng);  // bucket 320: timed
  EXPECT_EQ(g.tuned_buckets(), 1);
  CheckGemm(g, {310, 512, 1024, false}, rng);  // bucket 320: its winner, untimed
  EXPECT_EQ(g.tuned_buckets(), 1);
  CheckGemm(g, {400, 512, 1024, false}, rng);  // bucket 448: timed
  EXPECT_EQ(g.tuned_buckets(), 2);
  CheckGemm(g, {300, 768, 1024, true}, rng);  // another shape
  EXPECT_EQ(g.tuned_buckets(), 3);
  CheckGemm(g, {2100, 512, 256, false}, rng);  // past 2,048 rows: not timed
  EXPECT_EQ(g.tuned_buckets(), 3);
  {  // warming, as the executor's warm-up: nothing timed, each algorithm once
    uint16_t* wx = ToDevice(std::vector<uint16_t>(640 * 1024));
    uint16_t* ww = ToDevice(std::vector<uint16_t>(512 * 1024));
    uint16_t* wy = ToDevice(std::vector<uint16_t>(640 * 512));
    g.SetWarming(true);
    for (int i = 0; i < 2; ++i) {  // bucket 640, twice: the second is skipped
      EXPECT_TRUE(g.Run(wx, ww, wy, 600, 512, 1024, ActType::kBF16, false, nullptr).ok());
    }
    g.SetWarming(false);
    EXPECT_EQ(g.tuned_buckets(), 3);
    EXPECT_EQ(g.warm_launches(), 1);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    cudaFree(wx);
    cudaFree(ww);
    cudaFree(wy);
  }
  CheckGemm(g, {620, 512, 1024, false}, rng);  // bucket 640 at its next call: timed
  EXPECT_EQ(g.tuned_buckets(), 4);

  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  std::vector<uint16_t> x(1000 * 256, FloatToBF16(0.5f)), w(512 * 256, FloatToBF16(0.25f));
  uint16_t* dx = ToDevice(x);
  uint16_t* dw = ToDevice(w);
  uint16_t* dy = ToDevice(std::vector<uint16_t>(1000 * 512));
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed), cudaSuccess);
  const bool ran = g.Run(dx, dw, dy, 1000, 512, 256, ActType::kBF16, false, s).ok();
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess);
  EXPECT_TRUE(ran);
  EXPECT_EQ(g.tuned_buckets(), 4);  // nothing timed while capturing
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  const auto y = ToHost(dy, 1000 * 512);
  EXPECT_EQ(BF16ToFloat(y[0]), 256 * 0.125f);  // exact: 32 in BF16
  EXPECT_EQ(BF16ToFloat(y[999 * 512 + 511]), 256 * 0.125f);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  ASSERT_TRUE(g.Run(dx, dw, dy, 1000, 512, 256, ActType::kBF16, false, s).ok());
  EXPECT_EQ(g.tuned_buckets(), 5);  // timed at the first uncaptured call
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(BF16ToFloat(ToHost(dy, 1000 * 512)[12345]), 256 * 0.125f);
  cudaFree(dx);
  cudaFree(dw);
  cudaFree(dy);
  cudaStreamDestroy(s);

  // Batch-invariant mode times nothing: one fixed algorithm per shape.
  go.batch_invariant = true;
  auto invariant = Gemm::Create(go);
  ASSERT_TRUE(invariant.ok()) << invariant.status();
  CheckGemm(**invariant, {300, 512, 1024, false}, rng);
  EXPECT_EQ((*invariant)->tuned_buckets(), 0);
}

// RoPE + KV append for T tokens of H query and Hkv KV heads of size D,
// with the QKV bias and, when `norm`, Qwen3's per-head q/k RMSNorm first;
// FP8 KV (k scale 0.5, v scale 0.25) when `fp8`.
void RunRope(int D, int H, int Hkv, bool norm, bool fp8 = false) {
  SCOPED_TRACE(::testing::Message()
               << "D=" << D << " H=" << H << " Hkv=" << Hkv << " norm=" << norm << " fp8=" << fp8);
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int T = 3, BT = 16, width = (H + 2 * Hkv) * D;
  const float eps = 1e-6f;
  std::vector<uint16_t> qkv(T * width), bias(width), qn(D), kn(D);
  for (auto& v : qkv) v = FloatToBF16(nd(rng));
  for (auto& v : bias) v = FloatToBF16(0.1f * nd(rng));
  for (auto& v : qn) v = FloatToBF16(1.0f + 0.2f * nd(rng));
  for (auto& v : kn) v = FloatToBF16(1.0f + 0.2f * nd(rng));
  std::vector<float> inv(D / 2);
  for (int i = 0; i < D / 2; ++i) inv[i] = 1.0f / std::pow(10000.0f, 2.0f * i / D);
  const std::vector<int> seq = {0, 1, 1}, pos = {5, 17, 40};
  const std::vector<int> table = {2, 0, 0, 1, 3, 4};  // 2 seqs x 3 blocks
  const size_t row = Hkv * D * (fp8 ? 1 : 2), block_bytes = 2 * BT * row;
  uint8_t* d_pool = ToDevice(std::vector<uint8_t>(block_bytes * 5, 0));
  int* d_table = ToDevice(table);
  int* d_seq = ToDevice(seq);
  int* d_pos = ToDevice(pos);
  uint16_t* d_qkv = ToDevice(qkv);
  uint16_t* d_bias = ToDevice(bias);
  uint16_t* d_qn = ToDevice(qn);
  uint16_t* d_kn = ToDevice(kn);
  float* d_inv = ToDevice(inv);
  uint16_t* d_q = ToDevice(std::vector<uint16_t>(T * H * D));
  PagedKv kv;
  kv.block_ids = d_table;
  kv.max_blocks = 3;
  kv.base = d_pool;
  kv.block_bytes = block_bytes;
  kv.block_tokens = BT;
  kv.num_kv_heads = Hkv;
  kv.head_dim = D;
  if (fp8) {
    kv.dtype = KvType::kFP8E4M3;
    kv.k_scale = 0.5f;
    kv.v_scale = 0.25f;
  }
  const QkNorm qk = norm ? QkNorm{d_qn, d_kn, eps} : QkNorm{};
  ASSERT_EQ(LaunchRopeKvWrite(d_qkv, d_bias, qk, d_inv, TokenMap{d_seq, d_pos, T}, H, kv, d_q,
                              ActType::kBF16, nullptr),
            cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto q = ToHost(d_q, T * H * D);
  const auto pool = ToHost(d_pool, block_bytes * 5);
  for (int t = 0; t < T; ++t) {
    auto in = [&](int i) { return BF16ToFloat(qkv[t * width + i]) + BF16ToFloat(bias[i]); };
    const uint8_t* blk =
        pool.data() + table[seq[t] * 3 + pos[t] / BT] * block_bytes + (pos[t] % BT) * row;
    // A stored K (v = false) or V element, scaled back for FP8.
    auto stored = [&](const uint8_t* p, int idx, bool v = false) -> double {
      if (fp8) return Fp8E4M3ToFloat(p[idx]) * (v ? kv.v_scale : kv.k_scale);
      uint16_t b;
      std::memcpy(&b, p + idx * 2, 2);
      return BF16ToFloat(b);
    };
    // BF16 rounds to 2^-8 relative, E4M3 to 2^-4.
    const double rel = fp8 ? 0.07 : 0.01;
    for (int h = 0; h < H + Hkv; ++h) {
      double inv_rms = 1.0;
      if (norm) {
        double ss = 0;
        for (int i = 0; i < D; ++i) ss += static_cast<double>(in(h * D + i)) * in(h * D + i);
        inv_rms = 1.0 / std::sqrt(ss / D + eps);
      }
      auto x = [&](int i) {
        const double w = !norm ? 1.0 : BF16ToFloat(h < H ? qn[i] : kn[i]);
        return in(h * D + i) * inv_rms * w;
      };
      for (int i = 0; i < D / 2; ++i) {
        const double a = static_cast<double>(pos[t]) * inv[i];
        const double x1 = x(i), x2 = x(i + D / 2);
        const double o1 = x1 * std::cos(a) - x2 * std::sin(a),
                     o2 = x2 * std::cos(a) + x1 * std::sin(a);
        double g1, g2;
        if (h < H) {
          g1 = BF16ToFloat(q[(t * H + h) * D + i]);
          g2 = BF16ToFloat(q[(t * H + h) * D + i + D / 2]);
        } else {
          g1 = stored(blk, (h - H) * D + i);
          g2 = stored(blk, (h - H) * D + i + D / 2);
        }
        const double r = h < H ? 0.01 : rel;  // q stays BF16
        EXPECT_NEAR(g1, o1, r * std::abs(o1) + 1e-3) << "t " << t << " head " << h << " i " << i;
        EXPECT_NEAR(g2, o2, r * std::abs(o2) + 1e-3) << "t " << t << " head " << h << " i " << i;
      }
    }
    for (int j = 0; j < Hkv * D; ++j) {
      EXPECT_NEAR(stored(blk + BT * row, j, true), in((H + Hkv) * D + j),
                  rel * std::abs(in((H + Hkv) * D + j)) + 1e-3);
    }
  }
  for (void* p : {static_cast<void*>(d_pool), static_cast<void*>(d_table),
                  static_cast<void*>(d_seq), static_cast<void*>(d_pos), static_cast<void*>(d_qkv),
                  static_cast<void*>(d_bias), static_cast<void*>(d_qn), static_cast<void*>(d_kn),
                  static_cast<void*>(d_inv), static_cast<void*>(d_q)}) {
    cudaFree(p);
  }
}

TEST(CudaKernels, RopeKvWriteMatchesReference) {
  if (!HaveGpu()) GTEST_SKIP() << "no usable GPU";
  RunRope(64, 8, 2, false);
  RunRope(80, 5, 1, false);
  RunRope(80, 5, 1, true);  // Qwen3 q/k norms
  RunRope(128, 16, 8, true);
  RunRope(256, 4, 2, true);
  RunRope(8, 4, 2, true);  // D % 16 != 0: the scalar kernel (the others: 8 pairs a thread)
  RunRope(128, 16, 8, true, /*fp8=*/true);  // FP8 KV: 8-byte stores, scales
  RunRope(8, 4, 2, false, /*fp8=*/true);
}

}  // namespace
}  // namespace ballast::engine::cuda
