// CPU backend: a hand-computed model, and invariances the batching engine
// relies on (paged == contiguous, chunked == unchunked, batched == alone).
#include "engine/cpu/cpu_executor.h"

#include <cmath>
#include <fstream>

#include "engine/safetensors.h"
#include "gtest/gtest.h"
#include "tests/unit/engine/executor_harness.h"
#include "tests/unit/engine/test_util.h"

namespace ballast::engine {
namespace {

using testing::ExecutorHarness;
using testing::TempDir;

OwnedTensor F32(const std::string& name, std::vector<int64_t> shape, std::vector<float> v) {
  OwnedTensor t{name, DType::kF32, std::move(shape), {}};
  t.bytes.resize(v.size() * 4);
  std::memcpy(t.bytes.data(), v.data(), t.bytes.size());
  return t;
}

// One layer, hidden 2, one head of size 2, intermediate 1, vocab 3.
// q = k = 0 makes attention uniform over the visible positions; v and o are
// identities; the MLP computes silu(h0) * h1 into dimension 0.
std::string WriteHandModel(const TempDir& dir) {
  const std::string out = dir.sub("hand");
  std::filesystem::create_directories(out);
  std::vector<OwnedTensor> ts = {
      F32("model.embed_tokens.weight", {3, 2}, {3, 4, 1, -1, 0.5, 2}),
      F32("model.layers.0.input_layernorm.weight", {2}, {1, 1}),
      F32("model.layers.0.self_attn.q_proj.weight", {2, 2}, {0, 0, 0, 0}),
      F32("model.layers.0.self_attn.k_proj.weight", {2, 2}, {0, 0, 0, 0}),
      F32("model.layers.0.self_attn.v_proj.weight", {2, 2}, {1, 0, 0, 1}),
      F32("model.layers.0.self_attn.o_proj.weight", {2, 2}, {1, 0, 0, 1}),
      F32("model.layers.0.post_attention_layernorm.weight", {2}, {1, 1}),
      F32("model.layers.0.mlp.gate_proj.weight", {1, 2}, {1, 0}),
      F32("model.layers.0.mlp.up_proj.weight", {1, 2}, {0, 1}),
      F32("model.layers.0.mlp.down_proj.weight", {2, 1}, {1, 0}),
      F32("model.norm.weight", {2}, {1, 2}),
      F32("lm_head.weight", {3, 2}, {1, 0, 0, 1, 1, 1}),
  };
  EXPECT_TRUE(WriteSafetensors(out + "/model.safetensors", ts).ok());
  std::ofstream(out + "/config.json") << R"({"architectures":["LlamaForCausalLM"],
    "hidden_size":2,"intermediate_size":1,"num_hidden_layers":1,"num_attention_heads":1,
    "num_key_value_heads":1,"vocab_size":3,"rms_norm_eps":0.0,"torch_dtype":"float32"})";
  return out;
}

// RMSNorm with unit weights and eps = 0.
std::array<double, 2> Norm(std::array<double, 2> x) {
  const double r = std::sqrt((x[0] * x[0] + x[1] * x[1]) / 2);
  return {x[0] / r, x[1] / r};
}

TEST(CpuExecutor, MatchesHandComputation) {
  TempDir dir;
  ExecutorHarness h(WriteHandModel(dir), 4);
  const std::vector<int> prompt = {0, 1};
  const std::vector<float> logits = h.PromptLogits(prompt);
  ASSERT_EQ(logits.size(), 6u);
  const std::array<std::array<double, 2>, 2> emb = {{{3, 4}, {1, -1}}};
  std::array<double, 2> v_sum = {0, 0};
  for (int p = 0; p < 2; ++p) {
    const auto n0 = Norm(emb[p]);
    v_sum[0] += n0[0];
    v_sum[1] += n0[1];
    // Uniform attention over positions [0, p]: the mean of their values.
    std::array<double, 2> x = {emb[p][0] + v_sum[0] / (p + 1), emb[p][1] + v_sum[1] / (p + 1)};
    const auto h2 = Norm(x);
    x[0] += h2[0] / (1 + std::exp(-h2[0])) * h2[1];  // silu(gate) * up, down -> dim 0
    auto f = Norm(x);
    f[1] *= 2;  // final norm weight {1, 2}
    const double want[3] = {f[0], f[1], f[0] + f[1]};
    for (int k = 0; k < 3; ++k) {
      EXPECT_NEAR(logits[p * 3 + k], want[k], 1e-5) << "position " << p << " logit " << k;
    }
  }
}

std::vector<int> Prompt(int n) {
  std::vector<int> t;
  for (int i = 0; i < n; ++i) t.push_back((i * 37 + 11) % 256);
  return t;
}

class Variants : public ::testing::TestWithParam<std::string> {};

TEST_P(Variants, PagedEqualsContiguousAndChunkedEqualsUnchunked) {
  TempDir dir;
  SyntheticModelSpec spec;
  spec.architecture = GetParam();
  spec.llama3_rope_scaling = GetParam() == "llama";
  spec.tie_embeddings = GetParam() == "qwen2" || GetParam() == "qwen3";
  if (GetParam() == "qwen3") spec.head_dim = 32;  // q_dim 128 over hidden 64
  const std::string model = testing::WriteTinyModel(dir, "m", spec);
  const std::vector<int> prompt = Prompt(45);
  ExecutorHarness contiguous(model, 64);  // one block holds the whole prompt
  const auto ref = contiguous.PromptLogits(prompt);
  for (int block : {1, 3, 16}) {
    ExecutorHarness paged(model, block);
    EXPECT_EQ(paged.PromptLogits(prompt), ref) << "block_tokens " << block;
  }
  for (int chunk : {1, 7, 16}) {
    EXPECT_EQ(contiguous.PromptLogits(prompt, chunk), ref) << "chunk " << chunk;
  }
}

INSTANTIATE_TEST_SUITE_P(Archs, Variants, ::testing::Values("llama", "qwen2", "mistral", "qwen3"));

TEST(CpuExecutor, BatchedEqualsAlone) {
  TempDir dir;
  const std::string model = testing::WriteTinyModel(dir, "m");
  ExecutorHarness h(model, 4);
  const std::vector<int> a = Prompt(9), b = {5, 6, 7};
  const auto la = h.PromptLogits(a), lb = h.PromptLogits(b);
  SequenceKv sa, sb;
  ASSERT_TRUE(h.kv->Reserve(&sa, 9).ok());
  ASSERT_TRUE(h.kv->Reserve(&sb, 3).ok());
  std::vector<SequenceChunk> batch(2);
  batch[0] = {&sa, 0, absl::MakeConstSpan(a), LogitsMode::kAll};
  batch[1] = {&sb, 0, absl::MakeConstSpan(b), LogitsMode::kLast};
  std::vector<float> out;
  ASSERT_TRUE(h.executor->Forward(batch, &out).ok());
  const int V = h.config.vocab_size;
  ASSERT_EQ(out.size(), static_cast<size_t>(10 * V));
  EXPECT_EQ(std::vector<float>(out.begin(), out.begin() + 9 * V), la);
  EXPECT_EQ(std::vector<float>(out.begin() + 9 * V, out.end()),
            std::vector<float>(lb.end() - V, lb.end()));
}

TEST(CpuExecutor, HalfPrecisionKvStaysClose) {
  TempDir dir;
  const std::string model = testing::WriteTinyModel(dir, "m");
  ExecutorHarness f32(model, 8), bf16(model, 8, DType::kBF16), f16(model, 8, DType::kF16);
  const auto prompt = Prompt(20);
  const auto ref = f32.PromptLogits(prompt), b = bf16.PromptLogits(prompt),
             h = f16.PromptLogits(prompt);
  double max_b = 0, max_h = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    max_b = std::max(max_b, std::abs(static_cast<double>(ref[i]) - b[i]));
    max_h = std::max(max_h, std::abs(static_cast<double>(ref[i]) - h[i]));
  }
  EXPECT_LT(max_b, 0.05);
  EXPECT_LT(max_h, 0.01);
  EXPECT_GT(max_b, 0.0);  // the KV really was rounded
}

// A lease's KV loaded layer by layer while the next chunk computes gives
// the logits of KV computed in place (the layer-wise wait is real: under
// TSan a forward that did not wait would race with the loader's copies).
TEST(CpuExecutor, LayerwiseLoadEqualsComputedKv) {
  TempDir dir;
  ExecutorHarness h(testing::WriteTinyModel(dir, "m"), 4);
  const std::vector<int> prompt = Prompt(14);
  const auto ref = h.PromptLogits(prompt);
  const int V = h.config.vocab_size, L = h.config.num_hidden_layers, cached = 8;
  SequenceKv a, b;
  ASSERT_TRUE(h.kv->Reserve(&a, cached).ok());
  std::vector<float> out;
  ASSERT_TRUE(
      h.executor
          ->Forward({{&a, 0, absl::MakeConstSpan(prompt).first(cached), LogitsMode::kLast}}, &out)
          .ok());
  // a's blocks to host memory, as an exported chunk would hold them.
  const size_t bb = h.kv->allocator()->block_bytes();
  const size_t per_layer = a.blocks[0].size();
  std::vector<uint8_t> host(L * per_layer * bb);
  std::vector<KvBlockCopy> out_copies;
  for (int l = 0; l < L; ++l) {
    for (size_t j = 0; j < per_layer; ++j) {
      out_copies.push_back(
          {h.kv->allocator()->Address(a.blocks[l][j]), host.data() + (l * per_layer + j) * bb, bb});
    }
  }
  ASSERT_TRUE(h.executor->CopyKvToHost(out_copies).ok());
  h.kv->Release(&a);
  ASSERT_TRUE(h.kv->Reserve(&b, static_cast<int>(prompt.size())).ok());
  LayerKvCopies load;
  load.layers.resize(L);
  for (int l = 0; l < L; ++l) {
    for (size_t j = 0; j < per_layer; ++j) {
      load.layers[l].push_back(
          {h.kv->allocator()->Address(b.blocks[l][j]), host.data() + (l * per_layer + j) * bb, bb});
    }
  }
  ASSERT_TRUE(h.executor->StartKvLoad(std::move(load)).ok());
  ASSERT_TRUE(
      h.executor
          ->Forward({{&b, cached, absl::MakeConstSpan(prompt).subspan(cached), LogitsMode::kAll}},
                    &out)
          .ok());
  ASSERT_TRUE(h.executor->WaitKvLoad().ok());
  EXPECT_EQ(out, std::vector<float>(ref.begin() + cached * V, ref.end()));
  h.kv->Release(&b);
}

TEST(CpuExecutor, RejectsTokensOutsideTheVocabulary) {
  TempDir dir;
  ExecutorHarness h(testing::WriteTinyModel(dir, "m"), 4);
  SequenceKv s;
  ASSERT_TRUE(h.kv->Reserve(&s, 1).ok());
  const std::vector<int> bad = {100000};
  std::vector<float> out;
  EXPECT_EQ(
      h.executor->Forward({{&s, 0, absl::MakeConstSpan(bad), LogitsMode::kLast}}, &out).code(),
      absl::StatusCode::kInvalidArgument);
  h.kv->Release(&s);
}

}  // namespace
}  // namespace ballast::engine
