// The ModelEngine tests' shared pieces: a sink that collects a request's
// tokens, request and prompt makers, plain greedy decoding to check outputs
// against, and the fixture (a tiny model on disk, a second model of another
// shape, small elastic KV arenas over host pages).
#pragma once

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "engine/model_engine.h"
#include "gtest/gtest.h"
#include "memory/kv_arena.h"
#include "memory/page_pool.h"
#include "tests/unit/engine/executor_harness.h"
#include "tests/unit/engine/test_util.h"

namespace ballast::engine::testing {

class Collect : public GenerationSink {
 public:
  void OnToken(int id, const std::string& text, const TokenLogprobs*) override {
    ids.push_back(id);
    streamed += text;
  }
  void OnDone(absl::StatusOr<GenerationResult> r) override {
    result = std::move(r);
    done = true;
  }
  std::vector<int> ids;
  std::string streamed;
  bool done = false;
  absl::StatusOr<GenerationResult> result = absl::UnknownError("not done");
};

inline void RunUntilIdle(ModelEngine& e) {
  for (int i = 0; i < 100000 && e.HasWork(); ++i) e.Step();
  ASSERT_FALSE(e.HasWork());
}

inline std::vector<int> Prompt(int n, int salt) {
  std::vector<int> t = {ByteTokenizer::kBos};
  for (int i = 1; i < n; ++i) t.push_back((i * 31 + salt * 17) % 256);
  return t;
}

inline GenerationRequest Req(const std::string& id, std::vector<int> prompt, int max_tokens) {
  GenerationRequest r;
  r.id = id;
  r.prompt = std::move(prompt);
  r.params.max_tokens = max_tokens;
  r.params.ignore_eos = true;
  return r;
}

// Plain greedy decoding that recomputes the whole prefix every token.
inline std::vector<int> ReferenceGreedy(const std::string& model, std::vector<int> tokens, int n) {
  ExecutorHarness h(model, 16);
  std::vector<int> out;
  for (int i = 0; i < n; ++i) {
    auto logits = h.PromptLogits(tokens);
    const int V = h.config.vocab_size;
    const float* last = logits.data() + logits.size() - V;
    const int id = static_cast<int>(std::max_element(last, last + V) - last);
    out.push_back(id);
    tokens.push_back(id);
  }
  return out;
}

class ModelEngineTest : public ::testing::Test {
 protected:
  void SetUp() override { model_ = testing::WriteTinyModel(dir_, "m"); }
  std::unique_ptr<ModelEngine> Make(int64_t kv_bytes = 8 << 20, int batch_tokens = 64,
                                    int block_tokens = 4) {
    ModelEngineOptions o;
    o.name = "tiny";
    o.path = model_;
    o.kv_cache_bytes = kv_bytes;
    o.max_batch_tokens = batch_tokens;
    o.block_tokens = block_tokens;
    auto e = ModelEngine::Create(o);
    EXPECT_TRUE(e.ok()) << e.status();
    return std::move(*e);
  }
  // A second model of another shape (Qwen2, 1 KV head of 16).
  std::string OtherModel() {
    SyntheticModelSpec other;
    other.architecture = "qwen2";
    other.hidden = 48;
    other.heads = 3;
    other.kv_heads = 1;
    other.seed = 9;
    return WriteTinyModel(dir_, "m2", other);
  }
  // An elastic KV arena over `pages` host pages of 64 KiB (slab = page).
  static constexpr int64_t kPage = 64 << 10;
  struct Arena {
    std::shared_ptr<memory::HostPagePool> pool;
    std::shared_ptr<memory::KvArena> arena;
  };
  static Arena SmallArena(int pages) {
    Arena a;
    a.pool =
        std::shared_ptr<memory::HostPagePool>(*memory::HostPagePool::Create(kPage, pages * kPage));
    memory::KvArenaOptions ao;
    ao.slab_bytes = kPage;
    ao.reserve_bytes = 16 * kPage;
    a.arena = std::shared_ptr<memory::KvArena>(*memory::KvArena::Create(a.pool, ao));
    return a;
  }
  TempDir dir_;
  std::string model_;
};

}  // namespace ballast::engine::testing
