// Synthetic checkpoints are a pure function of the spec: however many
// threads draw the weights, the files are byte for byte those the
// single-threaded generator wrote for the golden checkpoints in
// tests/data/golden (committed, and the inputs of transformers' goldens).
#include "engine/synthetic_model.h"

#include <fstream>
#include <sstream>

#include "gtest/gtest.h"
#include "tests/unit/engine/golden.h"
#include "tests/unit/engine/test_util.h"

namespace ballast::engine {
namespace {

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The specs of tests/data/golden/README.md's make-model commands.
std::vector<std::pair<std::string, SyntheticModelSpec>> GoldenSpecs() {
  SyntheticModelSpec llama;
  llama.architecture = "llama";
  llama.layers = 2;
  llama.hidden = 64;
  llama.heads = 4;
  llama.kv_heads = 2;
  llama.intermediate = 160;
  llama.vocab = 258;
  llama.max_position = 512;
  llama.seed = 11;
  llama.llama3_rope_scaling = true;
  SyntheticModelSpec qwen2;
  qwen2.architecture = "qwen2";
  qwen2.layers = 2;
  qwen2.hidden = 64;
  qwen2.heads = 4;
  qwen2.kv_heads = 1;
  qwen2.intermediate = 128;
  qwen2.vocab = 300;
  qwen2.max_position = 512;
  qwen2.seed = 12;
  qwen2.tie_embeddings = true;
  SyntheticModelSpec mistral;
  mistral.architecture = "mistral";
  mistral.layers = 3;
  mistral.hidden = 48;
  mistral.heads = 6;
  mistral.kv_heads = 3;
  mistral.intermediate = 96;
  mistral.vocab = 258;
  mistral.max_position = 512;
  mistral.seed = 13;
  mistral.dtype = "fp16";
  SyntheticModelSpec odd;
  odd.architecture = "llama";
  odd.layers = 2;
  odd.hidden = 40;
  odd.heads = 5;
  odd.kv_heads = 1;
  odd.head_dim = 80;
  odd.intermediate = 64;
  odd.vocab = 1000;
  odd.max_position = 512;
  odd.seed = 14;
  SyntheticModelSpec qwen3;
  qwen3.architecture = "qwen3";
  qwen3.layers = 2;
  qwen3.hidden = 64;
  qwen3.heads = 4;
  qwen3.kv_heads = 2;
  qwen3.head_dim = 64;
  qwen3.intermediate = 64;
  qwen3.vocab = 300;
  qwen3.max_position = 512;
  qwen3.seed = 15;
  qwen3.tie_embeddings = true;
  return {{"llama", llama},
          {"qwen2", qwen2},
          {"mistral", mistral},
          {"odd_shapes", odd},
          {"qwen3", qwen3}};
}

TEST(SyntheticModel, ThreadsWriteTheSingleThreadedBytes) {
  testing::TempDir dir;
  for (const auto& [name, spec] : GoldenSpecs()) {
    const std::string want = Slurp(testing::GoldenDir(name) + "/model.safetensors");
    ASSERT_FALSE(want.empty()) << name;
    // One thread; then 4 threads over chunks far smaller than the tensors
    // (an odd size, so chunks end mid-row), which spreads every tensor.
    for (const SyntheticWriteOptions& o :
         {SyntheticWriteOptions{.threads = 1},
          SyntheticWriteOptions{.threads = 4, .chunk_samples = 997}}) {
      const std::string out = dir.sub(name + "-" + std::to_string(o.threads));
      ASSERT_TRUE(WriteSyntheticModel(spec, out, o).ok()) << name;
      EXPECT_TRUE(Slurp(out + "/model.safetensors") == want)
          << name << " with " << o.threads << " threads differs from the golden checkpoint";
      EXPECT_EQ(Slurp(out + "/config.json"), Slurp(testing::GoldenDir(name) + "/config.json"))
          << name;
    }
  }
}

}  // namespace
}  // namespace ballast::engine
