// Runs prompts through a CudaExecutor (via the gpu_backend.h factory) and
// a CpuExecutor on the same checkpoint; shared by the GPU tests. Tests call
// SkipWithoutGpu() first so they skip cleanly on machines with no GPU.
#pragma once

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "engine/gpu_backend.h"
#include "engine/kv_cache.h"
#include "engine/model_config.h"
#include "engine/synthetic_model.h"
#include "gtest/gtest.h"
#include "tests/unit/engine/executor_harness.h"

namespace ballast::engine::testing {

inline bool GpuUsable() { return GpuMemoryInfo(0).ok(); }

#define BALLAST_SKIP_WITHOUT_GPU() \
  if (!::ballast::engine::testing::GpuUsable()) GTEST_SKIP() << "no usable GPU"

// A model large enough to exercise several attention tiles and partitions,
// GQA groups of 4 and head_dim 64; shared by the GPU tests.
inline SyntheticModelSpec GpuTestModelSpec() {
  SyntheticModelSpec s;
  s.architecture = "llama";
  s.layers = 3;
  s.hidden = 512;
  s.heads = 8;
  s.kv_heads = 2;
  s.intermediate = 1024;
  s.vocab = 512;
  s.max_position = 2048;
  s.llama3_rope_scaling = true;
  s.seed = 7;
  // HF's initializer_range. Larger weights make a random model chaotic:
  // BF16 rounding alone then moves logits by several percent (measured:
  // std 0.05 at hidden 512 gives 7% in BF16, 0.8% in FP16).
  s.init_std = 0.02;
  return s;
}

class GpuHarness {
 public:
  // kv_dtype: "auto" (the model's dtype), "fp8_e4m3", ...
  GpuHarness(const std::string& model_dir, int block_tokens, const std::string& kv_dtype = "auto",
             bool graphs = true, int max_context = 2048, int max_batch_tokens = 512,
             WeightQuant quant = WeightQuant::kNone, bool deterministic = false,
             int sm_partition = 0, bool warm_products = true, int max_seqs = 0) {
    auto cfg = ModelConfig::Load(model_dir + "/config.json");
    EXPECT_TRUE(cfg.ok()) << cfg.status();
    config = *cfg;
    if (!config.fp8_checkpoint) config.weight_quant = quant;
    KvLayout layout{config.num_hidden_layers, config.num_key_value_heads, config.head_dim,
                    block_tokens, GpuAutoKvDType(config)};
    if (kv_dtype != "auto") layout.dtype = *DTypeFromConfig(kv_dtype);
    const int64_t blocks = 4096;
    auto p = CreateGpuBlockPool(0, layout.block_bytes(), blocks);
    EXPECT_TRUE(p.ok()) << p.status();
    pool = std::move(*p);
    kv = std::make_unique<KvCache>(layout, pool.get());
    GpuExecutorOptions o;
    o.cuda_graphs = graphs;
    o.max_context = max_context;
    o.max_batch_tokens = max_batch_tokens;
    o.deterministic = deterministic;
    o.sm_partition = sm_partition;
    o.warm_products = warm_products;
    o.max_seqs = max_seqs;
    auto e = CreateGpuExecutor(config, model_dir, kv.get(), o);
    EXPECT_TRUE(e.ok()) << e.status();
    executor = std::move(*e);
  }

  // Logits of every prompt token ([n, vocab]), `chunk` tokens per step.
  std::vector<float> PromptLogits(const std::vector<int>& tokens, int chunk = 0) {
    return testing::PromptLogits(executor.get(), kv.get(), tokens, chunk);
  }

  ModelConfig config;
  std::unique_ptr<memory::BlockAllocator> pool;
  std::unique_ptr<KvCache> kv;
  std::unique_ptr<Executor> executor;
};

struct Diff {
  double max_abs = 0, max_mag = 0;
  int argmax_mismatch = 0;
  // Mismatches where the reference prefers its argmax over ours by more
  // than `margin` * max |logit| (not a near-tie flipped by rounding).
  int decisive_mismatch = 0;
};

// Compares [rows, vocab] logits.
inline Diff CompareLogits(const std::vector<float>& got, const std::vector<float>& want,
                          size_t vocab, double margin = 0.0) {
  Diff d;
  EXPECT_EQ(got.size(), want.size());
  const size_t rows = std::min(got.size(), want.size()) / vocab;
  for (size_t r = 0; r < rows; ++r) {
    size_t bg = 0, bw = 0;
    for (size_t v = 0; v < vocab; ++v) {
      const double g = got[r * vocab + v], w = want[r * vocab + v];
      d.max_abs = std::max(d.max_abs, std::abs(g - w));
      d.max_mag = std::max(d.max_mag, std::abs(w));
      if (g > got[r * vocab + bg]) bg = v;
      if (w > want[r * vocab + bw]) bw = v;
    }
    d.argmax_mismatch += bg != bw;
    if (bg != bw && want[r * vocab + bw] - want[r * vocab + bg] > margin * d.max_mag)
      ++d.decisive_mismatch;
  }
  return d;
}

}  // namespace ballast::engine::testing
