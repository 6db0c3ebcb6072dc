// FP8 weights (quantization: fp8) on the CPU backend, the reference the
// CUDA backend's E4M3 weights are checked against: the row rounding
// against a brute-force search over every E4M3 code, the executor's
// output against full precision, and the option's errors.
#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "engine/checkpoint.h"
#include "engine/model_engine.h"
#include "engine/safetensors.h"
#include "engine/weights.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/unit/engine/executor_harness.h"
#include "tests/unit/engine/fp8_checkpoint.h"
#include "tests/unit/engine/test_util.h"

namespace ballast::engine {
namespace {

using testing::ExecutorHarness;
using testing::TempDir;

// The E4M3 value nearest to x (ties to the even code), by trying all 254
// finite codes; saturates at +-448.
float NearestE4M3(float x) {
  float best = 0.0f;
  int best_code = 0;
  double best_err = std::numeric_limits<double>::infinity();
  for (int code = 0; code < 256; ++code) {
    if ((code & 0x7f) == 0x7f) continue;  // NaN
    const float v = Fp8E4M3ToFloat(static_cast<uint8_t>(code));
    const double err = std::abs(static_cast<double>(v) - x);
    if (err < best_err || (err == best_err && (code & 1) == 0 && (best_code & 1) == 1)) {
      best = v;
      best_code = code;
      best_err = err;
    }
  }
  return best;
}

TEST(Fp8Weights, RowsRoundToTheNearestE4M3TimesTheRowScale) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  Matrix m;
  m.rows = 6;
  m.cols = 300;
  m.data.resize(static_cast<size_t>(m.rows) * m.cols);
  for (float& x : m.data) x = normal(rng);
  for (int i = 0; i < m.cols; ++i)
    m.data[static_cast<size_t>(2) * m.cols + i] = 0.0f;  // a zero row
  m.data[static_cast<size_t>(3) * m.cols + 7] = -5.0f;   // an outlier sets row 3's scale
  const Matrix orig = m;
  const std::vector<float> scales = RoundRowsToFp8(&m);
  ASSERT_EQ(scales.size(), 6u);
  EXPECT_EQ(scales[2], 1.0f);
  EXPECT_FLOAT_EQ(scales[3], 5.0f / 448.0f);
  for (int r = 0; r < m.rows; ++r) {
    float amax = 0.0f;
    for (int i = 0; i < m.cols; ++i) amax = std::max(amax, std::abs(orig.row(r)[i]));
    if (amax > 0) {
      EXPECT_EQ(scales[r], amax / 448.0f) << "row " << r;
    }
    for (int i = 0; i < m.cols; ++i) {
      const float want = NearestE4M3(orig.row(r)[i] / scales[r]) * scales[r];
      ASSERT_EQ(m.row(r)[i], want) << "row " << r << " col " << i << " of " << orig.row(r)[i];
    }
  }
  // The largest magnitude is kept exactly (it maps to +-448).
  EXPECT_FLOAT_EQ(m.row(3)[7], -5.0f);
}

// A model with enough width that the rounding shows but stays small.
SyntheticModelSpec Spec() {
  SyntheticModelSpec s;
  s.architecture = "llama";
  s.layers = 2;
  s.hidden = 128;
  s.heads = 4;
  s.kv_heads = 2;
  s.intermediate = 256;
  s.vocab = 300;
  s.seed = 11;
  s.init_std = 0.02;
  return s;
}

TEST(Fp8Weights, CpuLogitsMoveByTheRoundingOnly) {
  TempDir dir;
  const std::string model = testing::WriteTinyModel(dir, "m", Spec());
  ExecutorHarness full(model, 16);
  ExecutorHarness fp8(model, 16, DType::kF32, WeightQuant::kFp8);
  std::vector<int> prompt;
  for (int i = 0; i < 40; ++i) prompt.push_back((i * 37 + 5) % 300);
  const auto a = full.PromptLogits(prompt);
  const auto b = fp8.PromptLogits(prompt);
  ASSERT_EQ(a.size(), b.size());
  double max_abs = 0, max_mag = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    max_abs = std::max(max_abs, std::abs(static_cast<double>(a[i]) - b[i]));
    max_mag = std::max(max_mag, std::abs(static_cast<double>(a[i])));
  }
  // E4M3 keeps 3 mantissa bits (relative error up to 1/16 a weight), so
  // the logits move, by a few percent of their range at most.
  EXPECT_GT(max_abs, 1e-4 * max_mag);
  EXPECT_LT(max_abs, 0.1 * std::max(1.0, max_mag));
  // Embeddings, norms and lm_head are not quantized: a model whose layers'
  // linear weights are exact E4M3 multiples would not move at all.
}

TEST(Fp8Weights, AnUnknownQuantizationIsRefusedNamingTheModel) {
  TempDir dir;
  ModelEngineOptions o;
  o.name = "tiny";
  o.path = testing::WriteTinyModel(dir, "m", Spec());
  o.quantization = "int4";
  auto e = ModelEngine::Create(o);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(e.status().message().find("model tiny"), std::string::npos) << e.status();
  EXPECT_NE(e.status().message().find("quantization \"int4\""), std::string::npos) << e.status();
  EXPECT_FALSE(ModelEngine::WeightBytesNeeded(o).ok());
}

TEST(Fp8Weights, TheEngineOptionReachesTheWeights) {
  TempDir dir;
  ModelEngineOptions o;
  o.name = "tiny";
  // Large weights make the random model chaotic, so rounding changes its
  // continuation.
  SyntheticModelSpec spec = Spec();
  spec.init_std = 0.15;
  o.path = testing::WriteTinyModel(dir, "chaotic", spec);
  o.quantization = "fp8";
  const std::vector<int> prompt = {1, 2, 3, 4, 5, 6, 7, 8};
  constexpr int kSteps = 24;
  auto served = testing::GreedyTokens(o, prompt, kSteps);
  ASSERT_TRUE(served.ok()) << served.status();
  // The same greedy continuation, recomputed step by step from executors
  // over rounded (fp8) and full weights, stepped as the engine steps it:
  // the prompt in one step, then one token a step (FP8 steps of one token
  // leave their inputs unrounded: kFp8UnroundedInputMaxTokens).
  auto greedy = [&](ExecutorHarness& h) {
    std::vector<int> toks = prompt, out;
    SequenceKv seq;
    EXPECT_TRUE(h.kv->Reserve(&seq, static_cast<int>(prompt.size()) + kSteps).ok());
    for (int i = 0, start = 0; i < kSteps; ++i) {
      SequenceChunk c{&seq, start, absl::MakeConstSpan(toks).subspan(start), LogitsMode::kLast};
      std::vector<float> logits;
      const absl::Status st = h.executor->Forward({c}, &logits);
      EXPECT_TRUE(st.ok()) << st;
      if (logits.size() != static_cast<size_t>(h.config.vocab_size)) break;
      const int next =
          static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      start = static_cast<int>(toks.size());
      out.push_back(next);
      toks.push_back(next);
    }
    h.kv->Release(&seq);
    return out;
  };
  ExecutorHarness fp8(o.path, 16, DType::kF32, WeightQuant::kFp8);
  ExecutorHarness full(o.path, 16);
  EXPECT_EQ(*served, greedy(fp8));
  // This model's continuation tells the two apart, so the check above
  // would fail if the option were dropped on the way.
  EXPECT_NE(greedy(full), greedy(fp8));
}

// An FP8 checkpoint with per-channel scales holds exactly what online
// quantization makes of the original: the same logits, bit for bit.
TEST(Fp8Checkpoint, PerChannelMatchesOnlineQuantizationExactly) {
  TempDir dir;
  const std::string orig = testing::WriteTinyModel(dir, "m", Spec());
  const std::string fp8 = dir.sub("fp8");
  testing::WriteFp8Checkpoint(orig, fp8, true, testing::kCompressedChannel);
  auto cfg = ModelConfig::Load(fp8 + "/config.json");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_TRUE(cfg->fp8_checkpoint);
  EXPECT_EQ(cfg->weight_quant, WeightQuant::kFp8);
  ExecutorHarness online(orig, 16, DType::kF32, WeightQuant::kFp8);
  ExecutorHarness stored(fp8, 16);  // served as fp8 whatever the option says
  std::vector<int> prompt;
  for (int i = 0; i < 30; ++i) prompt.push_back((i * 13 + 7) % 300);
  EXPECT_EQ(stored.PromptLogits(prompt), online.PromptLogits(prompt));
}

// vLLM's "fp8" form with one scale per tensor: every row uses it.
TEST(Fp8Checkpoint, PerTensorScalesApplyToEveryRow) {
  TempDir dir;
  const std::string orig = testing::WriteTinyModel(dir, "m", Spec());
  const std::string fp8 = dir.sub("fp8");
  const auto scales = testing::WriteFp8Checkpoint(
      orig, fp8, false, R"({"quant_method": "fp8", "activation_scheme": "dynamic"})");
  auto cfg = ModelConfig::Load(fp8 + "/config.json");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  auto w = ModelWeights::Load(fp8, *cfg);
  ASSERT_TRUE(w.ok()) << w.status();
  CheckpointIndex idx;
  ASSERT_TRUE(idx.Open(fp8).ok());
  const std::string name = "model.layers.1.mlp.down_proj.weight";
  auto q = idx.Get(name, cfg->hidden_size, cfg->intermediate_size);
  ASSERT_TRUE(q.ok()) << q.status();
  const float s = scales.at(name)[0];
  const Matrix& down = w->layers[1].down;
  for (size_t i = 0; i < down.data.size(); ++i) {
    ASSERT_EQ(down.data[i], Fp8E4M3ToFloat((*q)->data[i]) * s) << i;
  }
  ExecutorHarness h(fp8, 16);
  EXPECT_FALSE(h.PromptLogits({1, 2, 3}).empty());
}

TEST(Fp8Checkpoint, UnsupportedFormsAreRefusedNamingTheKey) {
  TempDir dir;
  const std::string orig = testing::WriteTinyModel(dir, "m", Spec());
  const std::string base = R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 4,
    "vocab_size": 300, "quantization_config": )";
  for (const auto& [q, key] : std::vector<std::pair<std::string, std::string>>{
           {R"({"quant_method": "fp8", "weight_block_size": [128, 128]})",
            "quantization_config.weight_block_size"},
           {R"({"quant_method": "gptq", "bits": 4})", "quantization_config.quant_method"},
           {R"({"quant_method": "compressed-tensors", "config_groups": {"g": {"weights":
              {"type": "int", "num_bits": 8, "strategy": "channel"}}}})",
            "quantization_config.config_groups.g.weights"},
           {R"({"quant_method": "compressed-tensors", "config_groups": {"g": {"weights":
              {"type": "float", "num_bits": "8"}}}})",
            "quantization_config"}}) {
    auto c = ModelConfig::Parse(base + q + "}", "m/config.json");
    ASSERT_FALSE(c.ok()) << q;
    EXPECT_NE(c.status().message().find("m/config.json: key \"" + key + "\""), std::string::npos)
        << c.status();
  }
  // An E4M3 tensor without its scale.
  const std::string fp8 = dir.sub("fp8");
  testing::WriteFp8Checkpoint(orig, fp8, true, testing::kCompressedChannel);
  auto file = SafetensorsFile::Open(fp8 + "/model.safetensors");
  ASSERT_TRUE(file.ok());
  std::vector<OwnedTensor> kept;
  for (const auto& [name, v] : (*file)->tensors()) {
    if (name == "model.layers.0.self_attn.o_proj.weight_scale") continue;
    kept.push_back({name, v.dtype, v.shape, std::vector<uint8_t>(v.data, v.data + v.nbytes)});
  }
  file->reset();
  ASSERT_TRUE(WriteSafetensors(fp8 + "/model.safetensors", kept).ok());
  auto cfg = ModelConfig::Load(fp8 + "/config.json");
  ASSERT_TRUE(cfg.ok());
  auto w = ModelWeights::Load(fp8, *cfg);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("o_proj.weight_scale"), std::string::npos) << w.status();
}

}  // namespace
}  // namespace ballast::engine
