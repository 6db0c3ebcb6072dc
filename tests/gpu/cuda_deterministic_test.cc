// Deterministic mode (GpuExecutorOptions::deterministic) on the GPU: a
// sequence's logits alone equal, bit for bit, its logits when it shares
// every step with 1, 7 and 64 other sequences (prefill chunks of other
// sizes, decodes, CUDA graphs of other buckets), in BF16 and FP8. The
// default mode is run through the same scenario and its differences
// printed (not asserted: it promises no invariance). Skips without a GPU.
#include <iostream>

#include "gtest/gtest.h"
#include "tests/gpu/gpu_harness.h"
#include "tests/unit/engine/batch_invariance.h"
#include "tests/unit/engine/test_util.h"

namespace ballast::engine {
namespace {

using testing::FirstDifference;
using testing::GpuHarness;
using testing::InvarianceScenario;
using testing::TargetLogits;

class CudaDeterministic : public ::testing::TestWithParam<WeightQuant> {
 protected:
  void SetUp() override {
    BALLAST_SKIP_WITHOUT_GPU();
    dir_ = std::make_unique<testing::TempDir>();
    model_ = testing::WriteTinyModel(*dir_, "m", testing::GpuTestModelSpec());
  }
  // Differences from the alone run, per count of others ("" where equal).
  // A 300-token prompt stays in one 512-key partition (alone: the unsplit
  // path; beside the first other's 600: merged); 700 spans two (1,400
  // beside it: three).
  std::vector<std::string> Run(bool deterministic, int prompt) {
    GpuHarness h(model_, 16, "auto", true, 2048, 512, GetParam(), deterministic);
    InvarianceScenario s;
    s.vocab = h.config.vocab_size;
    s.prompt = prompt;
    s.decode_steps = 12;
    s.budget = 512;
    const std::vector<float> alone = TargetLogits(h.executor.get(), h.kv.get(), s);
    EXPECT_EQ(alone.size(), static_cast<size_t>(13 * s.vocab));
    std::vector<std::string> diffs;
    s.chunk = 37;
    for (int others : {1, 7, 64}) {
      s.others = others;
      s.seed = static_cast<uint32_t>(others);
      diffs.push_back(
          FirstDifference(alone, TargetLogits(h.executor.get(), h.kv.get(), s), s.vocab));
    }
    return diffs;
  }
  std::unique_ptr<testing::TempDir> dir_;
  std::string model_;
};

TEST_P(CudaDeterministic, LogitsAloneEqualLogitsInAnyBatch) {
  constexpr int kOthers[] = {1, 7, 64};
  for (int prompt : {700, 300}) {
    const std::vector<std::string> def = Run(false, prompt);
    for (size_t i = 0; i < def.size(); ++i) {
      std::cout << "default mode, prompt " << prompt << ", " << kOthers[i]
                << " others: " << (def[i].empty() ? "equal" : def[i]) << "\n";
    }
    const std::vector<std::string> det = Run(true, prompt);
    ASSERT_EQ(det.size(), 3u);
    for (size_t i = 0; i < det.size(); ++i) {
      EXPECT_EQ(det[i], "") << "prompt " << prompt << ", " << kOthers[i] << " others";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Quant, CudaDeterministic,
                         ::testing::Values(WeightQuant::kNone, WeightQuant::kFp8),
                         [](const auto& info) {
                           return info.param == WeightQuant::kFp8 ? "fp8" : "bf16";
                         });

}  // namespace
}  // namespace ballast::engine
