// Runs prompts through a CpuExecutor with a chosen KV block size and prefill
// chunk size; shared by the executor and golden-logit tests.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/cpu/cpu_executor.h"
#include "engine/model_config.h"
#include "engine/model_engine.h"
#include "engine/weights.h"
#include "gtest/gtest.h"
#include "memory/host_block_pool.h"

namespace ballast::engine::testing {

// Logits of every prompt token ([n, vocab]) from any backend, prefilling
// `chunk` tokens per step (0 = all at once) into a fresh sequence.
inline std::vector<float> PromptLogits(Executor* executor, KvCache* kv,
                                       const std::vector<int>& tokens, int chunk = 0) {
  SequenceKv seq;
  EXPECT_TRUE(kv->Reserve(&seq, static_cast<int>(tokens.size())).ok());
  std::vector<float> all;
  const int n = static_cast<int>(tokens.size());
  if (chunk <= 0) chunk = n;
  for (int start = 0; start < n; start += chunk) {
    SequenceChunk c;
    c.kv = &seq;
    c.start_pos = start;
    c.tokens = absl::MakeConstSpan(tokens).subspan(start, std::min(chunk, n - start));
    c.logits = LogitsMode::kAll;
    std::vector<float> out;
    auto st = executor->Forward({c}, &out);
    EXPECT_TRUE(st.ok()) << st;
    all.insert(all.end(), out.begin(), out.end());
  }
  kv->Release(&seq);
  return all;
}

// Greedy tokens of one request through a ModelEngine built from `o`,
// stepped on this thread until done (EOS ignored).
inline absl::StatusOr<std::vector<int>> GreedyTokens(const ModelEngineOptions& o,
                                                     const std::vector<int>& prompt, int n) {
  auto e = ModelEngine::Create(o);
  if (!e.ok()) return e.status();
  struct Sink : GenerationSink {
    void OnToken(int, const std::string&, const TokenLogprobs*) override {}
    void OnDone(absl::StatusOr<GenerationResult> r) override { result = std::move(r); }
    absl::StatusOr<GenerationResult> result = absl::UnknownError("not done");
  } sink;
  GenerationRequest r;
  r.id = "greedy";
  r.prompt = prompt;
  r.params.max_tokens = n;
  r.params.ignore_eos = true;
  if (auto st = (*e)->Submit(r, &sink); !st.ok()) return st;
  while ((*e)->HasWork()) (*e)->Step();
  if (!sink.result.ok()) return sink.result.status();
  return sink.result->output_tokens;
}

class ExecutorHarness {
 public:
  ExecutorHarness(const std::string& model_dir, int block_tokens, DType kv_dtype = DType::kF32,
                  WeightQuant quant = WeightQuant::kNone) {
    auto cfg = ModelConfig::Load(model_dir + "/config.json");
    EXPECT_TRUE(cfg.ok()) << cfg.status();
    config = *cfg;
    if (!config.fp8_checkpoint) config.weight_quant = quant;
    auto w = ModelWeights::Load(model_dir, config);
    EXPECT_TRUE(w.ok()) << w.status();
    KvLayout layout{config.num_hidden_layers, config.num_key_value_heads, config.head_dim,
                    block_tokens, kv_dtype};
    pool = *memory::HostBlockPool::Create(layout.block_bytes(), 4096);
    kv = std::make_unique<KvCache>(layout, pool.get());
    executor =
        *CpuExecutor::Create(config, std::make_shared<ModelWeights>(std::move(*w)), kv.get());
  }

  // Logits of every prompt token ([n, vocab]), prefilling `chunk` tokens per
  // step (0 = all at once).
  std::vector<float> PromptLogits(const std::vector<int>& tokens, int chunk = 0) {
    return testing::PromptLogits(executor.get(), kv.get(), tokens, chunk);
  }

  ModelConfig config;
  std::unique_ptr<memory::HostBlockPool> pool;
  std::unique_ptr<KvCache> kv;
  std::unique_ptr<CpuExecutor> executor;
};

}  // namespace ballast::engine::testing
