// Token sampling from logits, with the penalties and log-probabilities
// users of OpenAI-style APIs expect, and a per-request seeded generator.
// The CPU implementation here is the reference the CUDA sampler
// (engine/cuda/sampling_kernels.cu) is tested against.
//
// Rule, applied in this order to one row of logits (the model's raw
// logits, `l`):
//   1. Penalties, from the request's PenaltyEntry list (one entry per token
//      that occurs in the prompt or the output):
//        repetition (HF/CTRL; 1 = off): for a token in the prompt or the
//          output, l = l > 0 ? l / r : l * r;
//        then frequency and presence (OpenAI; 0 = off), for a token
//          generated c > 0 times: l -= frequency * c + presence.
//   2. temperature <= 0 means greedy: argmax of the penalised logits,
//      lowest id on ties. Otherwise z = l / temperature and:
//   3. top-k keeps the k largest z (ties: lower id first; k <= 0 keeps
//      all);
//   4. min-p (0 = off) keeps tokens whose probability is at least
//      min_p times the most likely token's, i.e. z >= z_max + ln(min_p);
//   5. softmax over the kept tokens; top-p keeps the smallest prefix, by
//      descending probability (ties: lower id first), whose mass reaches
//      top_p (top_p <= 0 or >= 1 keeps all);
//   6. the kept probabilities are renormalised and one token is drawn.
// Log-probabilities (top_logprobs >= 0) are those of the model's raw
// distribution, log_softmax(l) before penalties and temperature (vLLM's
// default): the chosen token's, and the top_logprobs most likely tokens'
// (descending, ties lower id first).
//
// Pure functions; thread-compatible.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "absl/types/span.h"

namespace ballast::engine {

// Most alternatives a request may ask for (OpenAI's limit).
inline constexpr int kMaxTopLogprobs = 20;

struct SamplingOptions {
  float temperature = 0.0f;
  float top_p = 1.0f;
  int top_k = 0;
  // Keep tokens with p >= min_p * p_max; 0 = off. In [0, 1].
  float min_p = 0.0f;
  // OpenAI penalties on generated tokens, in [-2, 2]; 0 = off.
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  // HF repetition penalty on prompt and generated tokens, > 0; 1 = off.
  float repetition_penalty = 1.0f;
  // -1: no log-probabilities; 0: the chosen token's; 1..kMaxTopLogprobs:
  // also that many most likely alternatives.
  int top_logprobs = -1;

  bool has_penalties() const {
    return presence_penalty != 0.0f || frequency_penalty != 0.0f || repetition_penalty != 1.0f;
  }
};

// One token a request's penalties touch.
struct PenaltyEntry {
  int32_t token = 0;
  int32_t output_count = 0;  // times generated so far
  int32_t in_prompt = 0;     // 1 if the prompt holds it (repetition penalty)
};

// The penalty bookkeeping of one request: the distinct tokens of its prompt
// and output with their output counts, kept sorted by token id.
class PenaltyState {
 public:
  PenaltyState() = default;
  // `track_prompt`: record the prompt's tokens (only the repetition penalty
  // needs them).
  PenaltyState(absl::Span<const int> prompt, bool track_prompt);
  void AddOutput(int token);
  absl::Span<const PenaltyEntry> entries() const { return entries_; }

 private:
  std::vector<PenaltyEntry> entries_;  // ascending token
};

struct TokenLogprob {
  int id = 0;
  float logprob = 0.0f;
};

struct TokenLogprobs {
  float logprob = 0.0f;           // of the chosen token
  std::vector<TokenLogprob> top;  // top_logprobs entries, descending
};

// Applies rule 1 to `logits` (a row of `vocab` floats) in place.
void ApplyPenalties(float* logits, int vocab, const SamplingOptions& opts,
                    absl::Span<const PenaltyEntry> penalties);

// Fills *out for `chosen` from the raw logits (see the file comment).
void ComputeLogprobs(const float* raw_logits, int vocab, int chosen, int top_logprobs,
                     TokenLogprobs* out);

// Draws a token from raw `logits` following the rule above. `logprobs` may
// be null; when opts.top_logprobs >= 0 and it is not, it is filled.
int SampleToken(const float* logits, int vocab, const SamplingOptions& opts,
                absl::Span<const PenaltyEntry> penalties, std::mt19937_64& rng,
                TokenLogprobs* logprobs);

// Rules 2-6 only (no penalties, no log-probabilities).
int SampleToken(const float* logits, int vocab, const SamplingOptions& opts, std::mt19937_64& rng);

}  // namespace ballast::engine
