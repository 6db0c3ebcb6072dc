// The CPU engine against Hugging Face transformers: golden logits and greedy
// tokens produced by tests/gpu/make_golden.py (LlamaForCausalLM with Llama-3
// RoPE scaling, Qwen2ForCausalLM with QKV bias and tied embeddings,
// MistralForCausalLM from FP16 weights, a Llama with head_dim 80 and 5 query
// heads over 1 KV head, Qwen3ForCausalLM with q/k norms and tied
// embeddings) on the same safetensors files.
#include <fstream>
#include <iostream>

#include "engine/model_engine.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/unit/engine/executor_harness.h"
#include "tests/unit/engine/golden.h"

namespace ballast::engine {
namespace {

using testing::GoldenDir;
using testing::LoadGolden;

class Golden : public ::testing::TestWithParam<std::string> {};

TEST_P(Golden, LogitsMatchTransformers) {
  const auto golden = LoadGolden(GetParam());
  const auto tokens = golden["tokens"].get<std::vector<int>>();
  const auto want = golden["logits"].get<std::vector<std::vector<float>>>();
  testing::ExecutorHarness h(GoldenDir(GetParam()), 16);
  const size_t V = want[0].size();
  const auto all = h.PromptLogits(tokens, /*chunk=*/50);  // chunked prefill on purpose
  ASSERT_EQ(all.size(), tokens.size() * V);
  const auto got = testing::SelectRows(all, testing::GoldenPositions(golden), V);
  ASSERT_EQ(got.size(), want.size() * V);
  double max_diff = 0, max_mag = 0;
  int argmax_mismatch = 0;
  for (size_t t = 0; t < want.size(); ++t) {
    size_t best_got = 0, best_want = 0;
    for (size_t v = 0; v < V; ++v) {
      const double g = got[t * V + v], w = want[t][v];
      max_diff = std::max(max_diff, std::abs(g - w));
      max_mag = std::max(max_mag, std::abs(w));
      if (g > got[t * V + best_got]) best_got = v;
      if (w > want[t][best_want]) best_want = v;
    }
    argmax_mismatch += best_got != best_want;
  }
  // Both sides compute in float32 from the same weights; differences come
  // only from summation order (the golden file also rounds to 1e-6).
  EXPECT_LT(max_diff, 1e-3 * std::max(1.0, max_mag)) << "max |logit| " << max_mag;
  EXPECT_EQ(argmax_mismatch, 0);
  RecordProperty("max_abs_diff", std::to_string(max_diff));
  std::cout << GetParam() << ": max abs logit difference vs transformers " << max_diff
            << " (max abs logit " << max_mag << ")\n";
}

TEST_P(Golden, GreedyTokensMatchTransformers) {
  const auto golden = LoadGolden(GetParam());
  const auto want = golden["greedy"].get<std::vector<int>>();
  ModelEngineOptions o;
  o.name = GetParam();
  o.path = GoldenDir(GetParam());
  o.block_tokens = 8;
  auto got = testing::GreedyTokens(o, golden["tokens"].get<std::vector<int>>(),
                                   static_cast<int>(want.size()));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, want);
}

INSTANTIATE_TEST_SUITE_P(HF, Golden,
                         ::testing::Values("llama", "qwen2", "mistral", "odd_shapes", "qwen3"));

}  // namespace
}  // namespace ballast::engine
