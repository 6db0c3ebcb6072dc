// Token sampling from logits: greedy, temperature, top-k and top-p
// (nucleus), with a per-request seeded generator.
//
// Rule, applied in this order: temperature <= 0 means greedy (argmax, lowest
// id on ties). Otherwise logits are divided by the temperature; top-k keeps
// the k largest (k <= 0 keeps all); softmax; top-p keeps the smallest prefix
// of tokens, by descending probability, whose mass reaches top_p (top_p <= 0
// or >= 1 keeps all); the kept probabilities are renormalised and one token
// is drawn with the request's generator. Pure; thread-compatible.
#pragma once

#include <cstdint>
#include <random>

namespace ballast::engine {

struct SamplingOptions {
  float temperature = 0.0f;
  float top_p = 1.0f;
  int top_k = 0;
};

int SampleToken(const float* logits, int vocab, const SamplingOptions& opts, std::mt19937_64& rng);

}  // namespace ballast::engine
