// Sequence: one request inside a ModelEngine, as the batch planner, the KV
// manager and the engine share it. A sequence is "tokens + how many have
// KV": decode and prefill are the same operation (compute the next tokens
// whose KV is missing), and preemption just resets the computed count.
//
// Thread-safety: plain data, owned and touched only by the engine's step
// thread once it has left the engine's inbox.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "absl/time/time.h"
#include "engine/generation.h"
#include "engine/kv_cache.h"
#include "engine/sampler.h"

namespace ballast::engine {

// Where an ahead step's sampled token will go (ModelEngine::BeginStep):
// tokens[] holds this until the step that samples it finishes.
inline constexpr int kPendingToken = -1;

struct Sequence {
  GenerationRequest req;
  GenerationSink* sink = nullptr;
  std::vector<int> tokens;  // prompt, then generated tokens
  int prompt_len = 0;
  // Its length when it must end: min(prompt + max_tokens, context window).
  int max_len = std::numeric_limits<int>::max();
  // KV of the leading tokens is written, or being written by a step in
  // flight (the engine advances it when a step is launched).
  int num_computed = 0;
  // The step in flight whose row `pending_row` samples tokens.back()
  // (kPendingToken until then); -1: none. Ahead steps feed that row's
  // token to the next step on the device (SequenceChunk::from_row).
  int64_t pending_step = -1;
  int pending_row = -1;
  SequenceKv kv;
  // True once admitted (a preempted one waits again, and is re-admitted
  // first). A request refused for KV room has not been admitted.
  bool admitted_once = false;
  // Its session prefix and lease were looked up (BatchPlanner::
  // AttachSessionPrefix, at its first admission attempt): a later attempt
  // (it did not fit, or it was preempted and recomputes) does not again.
  bool prefix_taken = false;
  // Its last admission attempt found no KV room (an ahead plan that will
  // ask the device's other models at the next step does not count);
  // cleared when admitted.
  bool kv_refused = false;
  // When it last entered the running set (KvRecencyNow; larger = newer).
  uint64_t admitted_at = 0;
  bool done = false;    // its last token is out; the engine retires it
  std::mt19937_64 rng;  // host sampling
  uint64_t seed = 0;    // device sampling: draw i is Philox(seed, i)
  // The prompt's and the generated tokens the request's penalties touch:
  // built on creation when req.params.sampling.has_penalties() (the prompt
  // only for a repetition penalty), then one AddOutput per generated token.
  // Preemption keeps the generated tokens, so it describes exactly the
  // output so far; empty when the request has no penalties.
  PenaltyState penalties;
  // Set at first admission when the request's lease covers more of the
  // prompt than the device cache: its chunks are copied into the blocks
  // (from token `load_from` on) when the sequence is admitted. Layers from
  // `load_resident_layers` on (the device kept only the session's first
  // layers) load from token 0.
  std::shared_ptr<const KvPrefixLease> load;
  int load_from = 0;
  int load_resident_layers = std::numeric_limits<int>::max();
  std::unique_ptr<OutputText> out;
  GenerationResult result;
  absl::Time first_scheduled = absl::InfinitePast();
  absl::Time first_token = absl::InfinitePast();
  absl::Time last_token = absl::InfinitePast();

  // Generated tokens, counting a pending one.
  int outputs() const { return static_cast<int>(tokens.size()) - prompt_len; }
  bool pending() const { return pending_step >= 0; }
  int remaining() const { return static_cast<int>(tokens.size()) - num_computed; }
};

}  // namespace ballast::engine
