// Small helpers shared by the engine benchmark's files (engine_bench.cc,
// engine_bench_mixed.cc): the clock they time with and the synthetic
// prompt they feed the model. Internal to those files; CUDA builds only.
//
// Thread-safety: stateless functions, safe from any thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "engine/model_config.h"

namespace ballast::engine::bench_internal {

using Clock = std::chrono::steady_clock;

// Seconds from `a` to `b`.
inline double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// A deterministic prompt of `n` tokens: (i * 7919 + 13) mod the vocabulary.
inline std::vector<int> PromptFor(int n, const ModelConfig& c) {
  std::vector<int> prompt(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    prompt[static_cast<size_t>(i)] = static_cast<int>((i * 7919 + 13) % c.vocab_size);
  }
  return prompt;
}

// One decode token per sequence, each distinct: (1 + s * 7919) mod the
// vocabulary. With one token for all, equal contexts made every row of a
// batch identical, and the same GEMMs ran 10-17% faster than a server's
// ever do (the power repeated data saves at the card's limit;
// docs/benchmarks.md, "Distinct rows").
inline std::vector<int> DistinctTokens(int n, int vocab) {
  std::vector<int> toks(static_cast<size_t>(n));
  for (int s = 0; s < n; ++s)
    toks[static_cast<size_t>(s)] = static_cast<int>((1 + 7919LL * s) % vocab);
  return toks;
}

}  // namespace ballast::engine::bench_internal
