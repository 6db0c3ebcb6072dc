// Overlapped decode steps (GpuExecutorOptions::overlap_min_rows,
// engine/cuda/cuda_forward_overlap.cc) against the CPU backend and against
// the same executor without overlap: the two halves' interleaved layers,
// their own attention orders and plans, the second stream and the
// products' SM target compute what one pass over the whole batch does.
// Skips without a GPU.
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "engine/cuda/cuda_executor.h"
#include "gtest/gtest.h"
#include "tests/gpu/gpu_harness.h"
#include "tests/unit/engine/executor_harness.h"
#include "tests/unit/engine/test_util.h"

namespace ballast::engine {
namespace {

using testing::CompareLogits;
using testing::GpuHarness;

// BF16 activations against the CPU backend's float32 (as
// cuda_executor_test.cc).
constexpr double kHalfTolerance = 0.03;

class CudaOverlap : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!testing::GpuUsable()) GTEST_SKIP() << "no usable GPU";
    dir_ = std::make_unique<testing::TempDir>();
    model_ = testing::WriteTinyModel(*dir_, "m", testing::GpuTestModelSpec());
  }

  // 300 sequences of spread prompts (8 to 47 tokens, and 400 for every
  // 37th, so the halves' plans differ and some contexts are split; about
  // 2,900 of the pools' 4,096 blocks over the 3 layers), prefilled one at
  // a time, then kSteps decode steps of all of them: the decode steps'
  // logits.
  template <typename H>
  std::vector<float> Run(H& h) {
    std::vector<SequenceKv> seqs(kSeqs);
    std::vector<std::vector<int>> toks(kSeqs);
    for (int s = 0; s < kSeqs; ++s) {
      const int len = s % 37 == 0 ? 400 : 8 + (s * 29) % 40;
      for (int i = 0; i < len; ++i) toks[s].push_back((s * 13 + i * 7) % 500);
      EXPECT_TRUE(h.kv->Reserve(&seqs[s], len + kSteps).ok());
    }
    std::vector<float> out;
    for (int s = 0; s < kSeqs; ++s) {  // one prompt a step: within 512 tokens
      SequenceChunk c{&seqs[s], 0, absl::MakeConstSpan(toks[s]), LogitsMode::kLast};
      EXPECT_TRUE(h.executor->Forward({c}, &out).ok());
    }
    std::vector<float> all;
    for (int step = 0; step < kSteps; ++step) {
      std::vector<SequenceChunk> batch;
      std::vector<int> next(kSeqs);
      for (int s = 0; s < kSeqs; ++s) {
        next[s] = (step * 11 + s * 5) % 500;
        batch.push_back({&seqs[s], static_cast<int>(toks[s].size()),
                         absl::MakeConstSpan(&next[s], 1), LogitsMode::kLast});
      }
      EXPECT_TRUE(h.executor->Forward(batch, &out).ok());
      all.insert(all.end(), out.begin(), out.end());
      for (int s = 0; s < kSeqs; ++s) toks[s].push_back(next[s]);
    }
    for (auto& s : seqs) h.kv->Release(&s);
    return all;
  }

  static constexpr int kSeqs = 300, kSteps = 3, kVocab = 512;
  std::unique_ptr<testing::TempDir> dir_;
  std::string model_;
};

// Overlapped steps (the 320-row bucket split 160 / 160), with and without
// an SM target for the products, replayed from graphs: the logits match
// the CPU backend's as closely as the same executor's without overlap, and
// no decisive argmax differs.
TEST_F(CudaOverlap, HalvesMatchTheCpuBackendAndTheWholeBatch) {
  testing::ExecutorHarness cpu(model_, 16);
  const auto want = Run(cpu);
  GpuHarness whole(model_, 16);
  const auto base = Run(whole);
  for (int sms : {0, 64}) {
    GpuHarness h(model_, 16, "auto", /*graphs=*/true, 2048, 512, WeightQuant::kNone, false, 0, true,
                 0, /*overlap_min_rows=*/256, /*overlap_gemm_sms=*/sms);
    const auto got = Run(h);
    const auto* e = dynamic_cast<const cuda::CudaExecutor*>(h.executor.get());
    ASSERT_NE(e, nullptr);
    EXPECT_GE(e->graph_replays(), kSteps - 1);
    EXPECT_EQ(e->last_graph_rows(), 320);
    EXPECT_EQ(e->last_overlap_split(), 160);
    const auto d = CompareLogits(got, want, kVocab);
    const auto d0 = CompareLogits(base, want, kVocab);
    const auto dw = CompareLogits(got, base, kVocab);
    std::cout << "overlap (SM target " << sms << ") vs cpu: max abs diff " << d.max_abs
              << " (whole batch vs cpu " << d0.max_abs << ", overlap vs whole " << dw.max_abs
              << "), argmax flips " << d.argmax_mismatch << " (" << d0.argmax_mismatch << ") of "
              << kSteps * kSeqs << "\n";
    EXPECT_LT(d.max_abs, kHalfTolerance * std::max(1.0, d.max_mag));
    const auto decisive =
        CompareLogits(got, want, kVocab, 2.0 * d.max_abs / std::max(1e-9, d.max_mag));
    EXPECT_EQ(decisive.decisive_mismatch, 0) << d.argmax_mismatch << " argmax flips in all";
    // Not worse than rounding: within twice the whole batch's own error.
    EXPECT_LT(d.max_abs, 2.0 * std::max(d0.max_abs, 1e-3));
  }
}

// Below overlap_min_rows, and in eager steps, nothing is split.
TEST_F(CudaOverlap, SmallAndEagerStepsAreNotSplit) {
  GpuHarness h(model_, 16, "auto", /*graphs=*/true, 2048, 512, WeightQuant::kNone, false, 0, true,
               0, /*overlap_min_rows=*/512);
  Run(h);
  const auto* e = dynamic_cast<const cuda::CudaExecutor*>(h.executor.get());
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->last_graph_rows(), 320);
  EXPECT_EQ(e->last_overlap_split(), 0);
}

}  // namespace
}  // namespace ballast::engine
