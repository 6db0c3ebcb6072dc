// Generation requests, results and the sink through which an engine reports
// tokens, plus OutputText: stop-string matching with hold-back, so streamed
// text never contains a stop string or a prefix of one that later matches.
//
// Thread-safety: plain data, except GenerationSink, which engines call from
// their step thread (implementations must be thread-safe with respect to
// their consumers).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/kv_tiers.h"
#include "engine/sampler.h"
#include "engine/tokenizer.h"

namespace ballast::engine {

struct GenerationParams {
  int max_tokens = 16;
  SamplingOptions sampling;
  std::optional<uint64_t> seed;  // unset: seeded from std::random_device
  std::vector<std::string> stop;
  bool ignore_eos = false;
  // Leave special tokens (Tokenizer::IsSpecial) out of the text; the ids
  // are reported either way. Default on, as in transformers and vLLM.
  bool skip_special_tokens = true;
};

struct GenerationRequest {
  std::string id;
  // Whole prompt: the session's history, then this turn's tokens.
  std::vector<int> prompt;
  // How many leading prompt tokens are session history (0: new session).
  int history_tokens = 0;
  std::string session_id;  // empty: do not keep KV after the request
  GenerationParams params;
  int priority = 0;
  absl::Time arrival = absl::InfinitePast();  // InfinitePast: set on Submit
  // TTFT SLO (ms); 0: none (the device's arbitration then uses its default).
  double ttft_slo_ms = 0;
  // Fail with RESOURCE_EXHAUSTED, rather than serve late, when arbitration
  // finds the TTFT SLO cannot be met.
  bool reject_if_slo_unmet = false;
  // Whose KV this is: chunks are keyed by tenant, so nothing is shared
  // across tenants (engine/kv_tiers.h). Empty: the default tenant.
  std::string tenant;
  // The prompt prefix's KV found below the device (null: none), and the
  // time the node spent finding and reading it (ms).
  std::shared_ptr<const KvPrefixLease> lease;
  double kv_fetch_ms = 0;
};

enum class FinishReason { kLength, kEos, kStop, kContext };

struct GenerationResult {
  FinishReason reason = FinishReason::kLength;
  int prompt_tokens = 0;
  int cached_tokens = 0;  // prompt tokens whose KV was reused
  std::vector<int> output_tokens;
  std::string text;
  KvSource kv_source = KvSource::kNone;
  // The device copy came from an Advise prefetch made this long before
  // (ms); -1 otherwise.
  double prefetch_lead_ms = -1;
  // Time reading the prompt prefix's KV from the node's tiers or a peer,
  // and the time its step waited to start its copy onto the device (ms;
  // both part of the TTFT). With layer-wise loading (the default) the copy
  // itself overlaps the step and kv_load_ms only counts starting it.
  double kv_fetch_ms = 0, kv_load_ms = 0;
  // Bytes of KV copied onto the device from a lease for this request.
  int64_t kv_loaded_bytes = 0;
  int preemptions = 0;
  double queue_ms = 0, ttft_ms = 0, mean_tpot_ms = 0, e2e_ms = 0;
};

class GenerationSink {
 public:
  virtual ~GenerationSink() = default;
  // One call per generated token, in order; `text` is the text released
  // with it (possibly empty).
  virtual void OnToken(int id, const std::string& text, const TokenLogprobs* logprobs) = 0;
  // Exactly one call, last: the result, or CANCELLED / another error.
  virtual void OnDone(absl::StatusOr<GenerationResult> result) = 0;
};

// Detokenizes a request's output and applies its stop strings.
class OutputText {
 public:
  OutputText(const Tokenizer* tokenizer, std::vector<std::string> stop,
             bool skip_special_tokens = true);
  // Adds a token. Returns the text to release now. Sets *stopped when a stop
  // string matched (the text is then cut before it and nothing follows).
  std::string Add(int id, bool* stopped);
  // Ends the output: releases everything held back.
  std::string Finish();
  // Everything released so far.
  const std::string& released() const { return released_; }

 private:
  std::string Release(size_t upto);
  StreamDecoder decoder_;
  std::vector<std::string> stop_;
  size_t max_stop_ = 0;
  std::string text_;      // decoded output so far
  std::string released_;  // prefix of text_ already released
};

}  // namespace ballast::engine
