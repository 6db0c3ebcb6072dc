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

// Golden logits of `file` for the CPU backend with `quant`.
// Argmax mismatches count only where transformers prefers its own choice by
// more than `margin` of the largest |logit| (not a near-tie).
void CheckLogits(const std::string& model, const std::string& file, WeightQuant quant,
                 double tolerance, double margin = 0) {
  const auto golden = LoadGolden(model, file);
  const auto tokens = golden["tokens"].get<std::vector<int>>();
  const auto want = golden["logits"].get<std::vector<std::vector<float>>>();
  testing::ExecutorHarness h(GoldenDir(model), 16, DType::kF32, quant);
  const size_t V = want[0].size();
  const auto all = h.PromptLogits(tokens, /*chunk=*/50);  // chunked prefill on purpose
  ASSERT_EQ(all.size(), tokens.size() * V);
  const auto got = testing::SelectRows(all, testing::GoldenPositions(golden), V);
  ASSERT_EQ(got.size(), want.size() * V);
  double max_diff = 0, max_mag = 0;
  int argmax_mismatch = 0, near_ties = 0;
  for (size_t t = 0; t < want.size(); ++t) {
    size_t best_got = 0, best_want = 0;
    for (size_t v = 0; v < V; ++v) {
      const double g = got[t * V + v], w = want[t][v];
      max_diff = std::max(max_diff, std::abs(g - w));
      max_mag = std::max(max_mag, std::abs(w));
      if (g > got[t * V + best_got]) best_got = v;
      if (w > want[t][best_want]) best_want = v;
    }
    if (best_got != best_want) {
      const bool tie = want[t][best_want] - want[t][best_got] <= margin * max_mag;
      near_ties += tie;
      argmax_mismatch += !tie;
    }
  }
  EXPECT_LT(max_diff, tolerance * std::max(1.0, max_mag)) << "max |logit| " << max_mag;
  EXPECT_EQ(argmax_mismatch, 0);
  std::cout << model << " (" << file << "): max abs logit difference vs transformers " << max_diff
            << " (max abs logit " << max_mag << "), argmax differs at " << near_ties
            << " near-ties of " << want.size() << " rows\n";
}

void CheckGreedy(const std::string& model, const std::string& file, const std::string& quant) {
  const auto golden = LoadGolden(model, file);
  const auto want = golden["greedy"].get<std::vector<int>>();
  ModelEngineOptions o;
  o.name = model;
  o.path = GoldenDir(model);
  o.block_tokens = 8;
  o.quantization = quant;
  auto got = testing::GreedyTokens(o, golden["tokens"].get<std::vector<int>>(),
                                   static_cast<int>(want.size()));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, want);
}

class Golden : public ::testing::TestWithParam<std::string> {};

// Both sides compute in float32 from the same weights; differences come
// only from summation order (the golden file also rounds to 1e-6).
TEST_P(Golden, LogitsMatchTransformers) {
  CheckLogits(GetParam(), "golden.json", WeightQuant::kNone, 1e-3);
}

TEST_P(Golden, GreedyTokensMatchTransformers) { CheckGreedy(GetParam(), "golden.json", "none"); }

// quantization: fp8 against transformers with the same rounding of every
// linear layer's weights (per row) and inputs (per token), in float32. A
// summation-order difference of 1e-7 still moves the odd input across an
// E4M3 rounding boundary (one step is 1/16 of the value), and these random
// models amplify it: measured 0.6-2.6% of the largest |logit|, and greedy
// continuations that part where the top two are near-tied (odd_shapes
// after 3 tokens, mistral after 26). Hence 3%, near-ties excused, and no
// greedy comparison (fp8_weights_test checks the engine's greedy path
// against its executor).
TEST_P(Golden, Fp8LogitsMatchTransformersWithTheSameRounding) {
  CheckLogits(GetParam(), "golden-fp8.json", WeightQuant::kFp8, 0.03, 0.02);
}

INSTANTIATE_TEST_SUITE_P(HF, Golden,
                         ::testing::Values("llama", "qwen2", "mistral", "odd_shapes", "qwen3"));

}  // namespace
}  // namespace ballast::engine
