// Executor: the model-executor interface every backend implements (cpu/
// now, cuda/ later). One call runs one forward step over a flat batch of
// sequence chunks: prefill chunks and single decode tokens mixed. Attention
// reads and writes KV only through each sequence's block table, so the
// backend never changes when the allocator does.
//
// Thread-safety: an Executor is driven by one thread at a time.
#pragma once

#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "engine/kv_cache.h"
#include "engine/model_config.h"
#include "engine/sampler.h"

namespace ballast::engine {

enum class LogitsMode {
  kNone,  // no logits (a prefill chunk that does not end the prompt)
  kLast,  // logits of the chunk's last token
  kAll,   // logits of every token of the chunk (tests, scoring)
};

struct SequenceChunk {
  // Block table with capacity for start_pos + tokens.size() positions; KV of
  // positions [0, start_pos) already written by earlier steps.
  const SequenceKv* kv = nullptr;
  int start_pos = 0;
  absl::Span<const int> tokens;
  LogitsMode logits = LogitsMode::kLast;
};

// How to draw one token on the device: the request's sampling options, its
// seed, and how many tokens it has drawn so far (the counter-based generator
// makes each draw reproducible from (seed, counter)).
struct DeviceSampling {
  SamplingOptions options;
  uint64_t seed = 0;
  uint64_t counter = 0;
};

class Executor {
 public:
  virtual ~Executor() = default;
  // Runs the step. `logits` receives, in chunk order, one row of
  // vocab_size floats per requested token.
  virtual absl::Status Forward(absl::Span<const SequenceChunk> batch,
                               std::vector<float>* logits) = 0;
  // Backends that sample on the device (so logits never cross to the host)
  // return true and implement ForwardSample.
  virtual bool samples_on_device() const { return false; }
  // Runs the step and draws one token per requested logits row (`sampling`
  // has one entry per row, in chunk order) into `tokens`.
  virtual absl::Status ForwardSample(absl::Span<const SequenceChunk> batch,
                                     absl::Span<const DeviceSampling> sampling,
                                     std::vector<int>* tokens) {
    return absl::UnimplementedError("this backend samples on the host");
  }
  virtual const ModelConfig& config() const = 0;
  // Bytes of weights this executor holds (checkpoint dtype on the CPU, the
  // device copy on GPUs).
  virtual int64_t weight_bytes() const = 0;
};

}  // namespace ballast::engine
