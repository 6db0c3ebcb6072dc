// dtype conversions, config.json parsing and safetensors reading/writing.
#include <fstream>

#include "engine/dtype.h"
#include "engine/model_config.h"
#include "engine/safetensors.h"
#include "engine/weights.h"
#include "gtest/gtest.h"
#include "tests/unit/engine/test_util.h"

namespace ballast::engine {
namespace {

using testing::TempDir;

TEST(DType, KnownEncodings) {
  EXPECT_EQ(FloatToBF16(1.0f), 0x3F80);
  EXPECT_EQ(FloatToBF16(-2.0f), 0xC000);
  EXPECT_EQ(BF16ToFloat(0x3F80), 1.0f);
  EXPECT_EQ(FloatToHalf(1.0f), 0x3C00);
  EXPECT_EQ(FloatToHalf(-2.0f), 0xC000);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7BFF);
  EXPECT_EQ(FloatToHalf(1e6f), 0x7C00);                   // overflow to inf
  EXPECT_EQ(HalfToFloat(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(HalfToFloat(0x3555), 0.333251953125f);
  // Round to nearest even: 1 + 2^-11 is halfway between two halves.
  EXPECT_EQ(FloatToHalf(1.0f + std::ldexp(1.0f, -11)), 0x3C00);
  EXPECT_EQ(FloatToHalf(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3C02);
  for (float f : {0.1f, -3.7f, 1234.5f, 6.1e-5f}) {
    EXPECT_NEAR(HalfToFloat(FloatToHalf(f)), f, std::abs(f) * 1e-3);
    EXPECT_NEAR(BF16ToFloat(FloatToBF16(f)), f, std::abs(f) * 8e-3);
  }
}

TEST(DType, Fp8E4M3Encodings) {
  EXPECT_EQ(FloatToFp8E4M3(1.0f), 0x38);
  EXPECT_EQ(FloatToFp8E4M3(-2.0f), 0xC0);
  EXPECT_EQ(FloatToFp8E4M3(448.0f), 0x7E);
  EXPECT_EQ(FloatToFp8E4M3(1e6f), 0x7E);                  // saturates
  EXPECT_EQ(FloatToFp8E4M3(std::ldexp(1.0f, -9)), 0x01);  // smallest subnormal
  EXPECT_EQ(FloatToFp8E4M3(0.0f), 0x00);
  EXPECT_EQ(Fp8E4M3ToFloat(0x7E), 448.0f);
  EXPECT_EQ(Fp8E4M3ToFloat(0x01), std::ldexp(1.0f, -9));
  EXPECT_TRUE(std::isnan(Fp8E4M3ToFloat(0x7F)));
  // 1 + 1/16 is halfway between 1 and 1.125: ties to even (1.0).
  EXPECT_EQ(FloatToFp8E4M3(1.0625f), 0x38);
  EXPECT_EQ(FloatToFp8E4M3(1.1875f), 0x3A);  // halfway 1.125/1.25 -> 1.25 (even)
  // Every code round-trips exactly.
  for (int c = 0; c < 256; ++c) {
    const float f = Fp8E4M3ToFloat(static_cast<uint8_t>(c));
    if (std::isnan(f)) continue;
    if (f == 0.0f) continue;  // -0 and +0
    EXPECT_EQ(FloatToFp8E4M3(f), c) << c;
  }
  for (float f : {0.013f, -3.7f, 100.0f, 0.4f}) {
    EXPECT_NEAR(Fp8E4M3ToFloat(FloatToFp8E4M3(f)), f, std::abs(f) / 16);
  }
}

TEST(ModelConfig, ParsesLlama3AndDefaults) {
  auto c = ModelConfig::Parse(R"({"architectures":["LlamaForCausalLM"],"hidden_size":64,
    "intermediate_size":128,"num_hidden_layers":2,"num_attention_heads":4,"vocab_size":300,
    "rope_scaling":{"rope_type":"llama3","factor":8.0,"low_freq_factor":1.0,
    "high_freq_factor":4.0,"original_max_position_embeddings":8192}})",
                              "x/config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_key_value_heads, 4);
  EXPECT_EQ(c->head_dim, 16);
  ASSERT_TRUE(c->rope_scaling.has_value());
  EXPECT_EQ(c->rope_scaling->original_max_position_embeddings, 8192);
}

// Qwen3: q/k norms always, biases only with attention_bias (q, k, v and o),
// head_dim 128 when config.json leaves it out (Qwen3Config's default).
TEST(ModelConfig, ParsesQwen3) {
  const std::string base = R"({"architectures":["Qwen3ForCausalLM"],"model_type":"qwen3",
    "hidden_size":64,"intermediate_size":128,"num_hidden_layers":2,"num_attention_heads":4,
    "num_key_value_heads":2,"vocab_size":300,"tie_word_embeddings":true,)";
  auto c = ModelConfig::Parse(base + R"("head_dim":32,"attention_bias":false})", "x/config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->qk_norm);
  EXPECT_FALSE(c->qkv_bias);
  EXPECT_FALSE(c->o_bias);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_EQ(c->head_dim, 32);
  EXPECT_EQ(c->q_dim(), 128);
  auto round = ModelConfig::Parse(c->ToJson(), "round trip");
  ASSERT_TRUE(round.ok()) << round.status();
  EXPECT_TRUE(round->qk_norm);
  EXPECT_EQ(round->head_dim, 32);
  EXPECT_EQ(round->NumParameters(), c->NumParameters());
  auto d = ModelConfig::Parse(base + R"("attention_bias":true})", "x/config.json");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->head_dim, 128);
  EXPECT_TRUE(d->qkv_bias);
  EXPECT_TRUE(d->o_bias);
  auto llama = ModelConfig::Parse(R"({"architectures":["LlamaForCausalLM"],"hidden_size":64,
    "intermediate_size":128,"num_hidden_layers":2,"num_attention_heads":4,"vocab_size":300})",
                                  "x/config.json");
  ASSERT_TRUE(llama.ok()) << llama.status();
  EXPECT_FALSE(llama->qk_norm);
}

// Llama 3.1 and later list several EOS ids in config.json.
TEST(ModelConfig, EosTokenIdMayBeAList) {
  const std::string base = R"({"architectures":["LlamaForCausalLM"],"hidden_size":64,
    "intermediate_size":128,"num_hidden_layers":2,"num_attention_heads":4,"vocab_size":300,)";
  auto c = ModelConfig::Parse(base + R"("eos_token_id":[128001,128008,128009]})", "x/config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->eos_token_id, 128001);
  auto bad = ModelConfig::Parse(base + R"("eos_token_id":[]})", "x/config.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("eos_token_id"), std::string::npos);
}

TEST(ModelConfig, ErrorsNameFileAndKey) {
  auto c = ModelConfig::Parse(R"({"architectures":["LlamaForCausalLM"],"hidden_size":64})",
                              "m/config.json");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("m/config.json"), std::string::npos);
  EXPECT_NE(c.status().message().find("intermediate_size"), std::string::npos);
  auto d = ModelConfig::Parse(R"({"architectures":["GPT2LMHeadModel"]})", "m/config.json");
  EXPECT_NE(d.status().message().find("GPT2LMHeadModel"), std::string::npos);
  auto e = ModelConfig::Parse(R"({"architectures":["LlamaForCausalLM"],"hidden_size":"big"})",
                              "m/config.json");
  EXPECT_NE(e.status().message().find("hidden_size"), std::string::npos);
}

TEST(Safetensors, RoundTrip) {
  TempDir dir;
  OwnedTensor t{"w", DType::kBF16, {2, 3}, std::vector<uint8_t>(12, 0)};
  OwnedTensor u{"b", DType::kF32, {3}, std::vector<uint8_t>(12, 1)};
  ASSERT_TRUE(WriteSafetensors(dir.sub("a.safetensors"), {t, u}).ok());
  auto f = SafetensorsFile::Open(dir.sub("a.safetensors"));
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_NE((*f)->Find("w"), nullptr);
  EXPECT_EQ((*f)->Find("w")->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ((*f)->Find("b")->data[0], 1);
}

TEST(Safetensors, TruncatedFileNamesTheTensor) {
  TempDir dir;
  const std::string model = testing::WriteTinyModel(dir, "m");
  const std::string file = model + "/model.safetensors";
  std::filesystem::resize_file(file, std::filesystem::file_size(file) - 100);
  auto f = SafetensorsFile::Open(file);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(f.status().message().find("tensor \"lm_head.weight\""), std::string::npos)
      << f.status();
  EXPECT_NE(f.status().message().find("truncated"), std::string::npos);
}

// Headers a fuzzer found (fuzz/corpus/safetensors_fuzzer/float-dimension.*):
// a dimension past 2^64 (JSON parses it as a float) and element counts past
// 2^63 are refused, naming the tensor, with no undefined conversion.
TEST(Safetensors, OversizedDimensionsAreRefusedNamingTheTensor) {
  TempDir dir;
  auto open = [&](const std::string& entry) {
    const std::string header = "{\"t\": " + entry + "}";
    std::string bytes(8, '\0');
    for (int b = 0; b < 8; ++b) bytes[b] = static_cast<char>((header.size() >> (8 * b)) & 0xff);
    bytes += header + std::string(16, '\0');
    const std::string path = dir.sub("x.safetensors");
    std::ofstream(path, std::ios::binary) << bytes;
    return SafetensorsFile::Open(path);
  };
  auto huge =
      open(R"({"dtype": "F32", "shape": [43333333333333333333333, 2], "data_offsets": [0, 16]})");
  ASSERT_FALSE(huge.ok());
  EXPECT_NE(huge.status().message().find("tensor \"t\": shape is not an array of integers"),
            std::string::npos)
      << huge.status();
  auto wide =
      open(R"({"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 16]})");
  ASSERT_FALSE(wide.ok());
  EXPECT_NE(wide.status().message().find("more than 2^63 elements"), std::string::npos)
      << wide.status();
  auto fine = open(R"({"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]})");
  EXPECT_TRUE(fine.ok()) << fine.status();
}

TEST(Weights, CorruptValuesNameTheTensor) {
  TempDir dir;
  const std::string model = testing::WriteTinyModel(dir, "m");
  const std::string file = model + "/model.safetensors";
  // Overwrite the first value of model.norm.weight with a bf16 NaN.
  auto f = SafetensorsFile::Open(file);
  ASSERT_TRUE(f.ok());
  const TensorView* v = (*f)->Find("model.norm.weight");
  ASSERT_NE(v, nullptr);
  // make-model writes embed_tokens first, at the start of the data section.
  const TensorView* first = (*f)->Find("model.embed_tokens.weight");
  uint64_t hlen = 0;
  {
    std::ifstream in(file, std::ios::binary);
    in.read(reinterpret_cast<char*>(&hlen), 8);
  }
  const std::streamoff where = 8 + static_cast<std::streamoff>(hlen) + (v->data - first->data);
  f->reset();
  {
    std::fstream io(file, std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(where);
    const uint16_t nan = 0x7FC0;
    io.write(reinterpret_cast<const char*>(&nan), 2);
  }
  auto cfg = ModelConfig::Load(model + "/config.json");
  ASSERT_TRUE(cfg.ok());
  auto w = ModelWeights::Load(model, *cfg);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("model.norm.weight"), std::string::npos) << w.status();
}

TEST(Weights, ShapeMismatchNamesTheTensor) {
  TempDir dir;
  const std::string model = testing::WriteTinyModel(dir, "m");
  auto cfg = ModelConfig::Load(model + "/config.json");
  ASSERT_TRUE(cfg.ok());
  cfg->intermediate_size = 96;
  auto w = ModelWeights::Load(model, *cfg);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("model.layers.0.mlp.gate_proj.weight"), std::string::npos)
      << w.status();
}

}  // namespace
}  // namespace ballast::engine
