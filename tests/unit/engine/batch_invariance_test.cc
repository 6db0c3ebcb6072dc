// The CPU backend is batch-invariant by construction (each product and
// each query's attention is reduced in one order, whatever else is in the
// step): a sequence's logits alone and sharing its steps with 1, 7 and 64
// others, its prompt chunked differently, are equal bit for bit. The CUDA
// backend meets the same test in deterministic mode (tests/gpu).
#include "tests/unit/engine/batch_invariance.h"

#include "gtest/gtest.h"
#include "tests/unit/engine/executor_harness.h"
#include "tests/unit/engine/test_util.h"

namespace ballast::engine {
namespace {

TEST(CpuBatchInvariance, LogitsAloneEqualLogitsInAnyBatch) {
  testing::TempDir dir;
  SyntheticModelSpec spec;
  spec.vocab = 258;
  spec.max_position = 2048;
  const std::string model = testing::WriteTinyModel(dir, "m", spec);
  testing::ExecutorHarness h(model, 16);
  testing::InvarianceScenario s;
  s.vocab = h.config.vocab_size;
  s.prompt = 150;
  s.decode_steps = 6;
  s.budget = 1 << 20;
  const std::vector<float> alone = testing::TargetLogits(h.executor.get(), h.kv.get(), s);
  ASSERT_EQ(alone.size(), static_cast<size_t>(7 * s.vocab));
  s.chunk = 37;
  s.budget = 256;
  for (int others : {1, 7, 64}) {
    s.others = others;
    s.seed = static_cast<uint32_t>(others);
    EXPECT_EQ(testing::FirstDifference(
                  alone, testing::TargetLogits(h.executor.get(), h.kv.get(), s), s.vocab),
              "")
        << others << " others";
  }
}

}  // namespace
}  // namespace ballast::engine
