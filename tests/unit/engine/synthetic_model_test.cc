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

// One make-model command line of tests/data/golden/README.md.
SyntheticModelSpec Spec(const std::string& arch, int layers, int hidden, int heads, int kv_heads,
                        int head_dim, int intermediate, int vocab, uint64_t seed) {
  SyntheticModelSpec s;
  s.architecture = arch;
  s.layers = layers;
  s.hidden = hidden;
  s.heads = heads;
  s.kv_heads = kv_heads;
  s.head_dim = head_dim;
  s.intermediate = intermediate;
  s.vocab = vocab;
  s.max_position = 512;
  s.seed = seed;
  return s;
}

// The specs of tests/data/golden/README.md's make-model commands.
std::vector<std::pair<std::string, SyntheticModelSpec>> GoldenSpecs() {
  SyntheticModelSpec llama = Spec("llama", 2, 64, 4, 2, 0, 160, 258, 11);
  llama.llama3_rope_scaling = true;
  SyntheticModelSpec qwen2 = Spec("qwen2", 2, 64, 4, 1, 0, 128, 300, 12);
  qwen2.tie_embeddings = true;
  SyntheticModelSpec mistral = Spec("mistral", 3, 48, 6, 3, 0, 96, 258, 13);
  mistral.dtype = "fp16";
  SyntheticModelSpec qwen3 = Spec("qwen3", 2, 64, 4, 2, 64, 64, 300, 15);
  qwen3.tie_embeddings = true;
  return {{"llama", llama},
          {"qwen2", qwen2},
          {"mistral", mistral},
          {"odd_shapes", Spec("llama", 2, 40, 5, 1, 80, 64, 1000, 14)},
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
