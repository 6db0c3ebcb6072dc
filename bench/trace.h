// Workload traces: the JSONL format every benchmark replays, and its reader
// and writer. One JSON object per line:
//
//   {"type":"request", "id":"r17", "model":"tiny-llama",
//    "arrival_s":12.5,            // release time (seconds from trace start)
//    "after":"r16", "delay_s":4.2,// optional: release delay_s after r16 ends
//    "session":"chat-3", "turn":2,// optional: multi-turn session
//    "prompt":"text" | "prompt_tokens":120,   // text, or a length to synthesise
//    "output_tokens":64,          // max_tokens sent (ignore_eos is set)
//    "ttft_ms":500, "tpot_ms":50, // optional per-request SLO
//    "priority":0}
//   {"type":"advise", "id":"a17", "model":"tiny-llama", "session":"chat-3",
//    "arrival_s":...,"after":...,"delay_s":..., // released like requests
//    "for":"r17",                 // the request it announces ("" = spurious)
//    "expected_arrival_s":11.0, "next_hops":["coder"]}
//
// A record with "after" is released when that record has ended (completed or
// failed) plus delay_s; arrival_s is then only its nominal time. Records
// without "after" are released at arrival_s / rate_scale. Delays are human
// or tool time and do not scale.
//
// Thread-compatible value types.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ballast::bench {

// The longest time a trace may name (arrival_s, delay_s, expected_arrival_s):
// about 116 days. Longer is refused when parsing: the statistics walk the
// trace on a 1 s grid, and the replay would never reach such a time.
inline constexpr double kMaxTraceSeconds = 1e7;

struct TraceRecord {
  enum class Type { kRequest, kAdvise };
  Type type = Type::kRequest;
  std::string id;
  std::string model;
  double arrival_s = 0;
  std::string after;
  double delay_s = 0;
  std::string session;
  int turn = 0;
  std::string prompt;  // empty: synthesise prompt_tokens bytes of text
  int prompt_tokens = 0;
  int output_tokens = 0;
  uint32_t ttft_ms = 0, tpot_ms = 0;
  int priority = 0;
  // Advise only.
  std::string for_request;
  double expected_arrival_s = 0;
  std::vector<std::string> next_hops;

  bool is_request() const { return type == Type::kRequest; }
};

// Reads and validates a trace: ids unique, "after" names an earlier record,
// requests have a model and output_tokens > 0 and a prompt or a length.
// Errors name the file and line.
absl::StatusOr<std::vector<TraceRecord>> ReadTrace(const std::string& path);
absl::StatusOr<std::vector<TraceRecord>> ParseTrace(const std::string& text,
                                                    const std::string& origin);
absl::Status WriteTrace(const std::string& path, const std::vector<TraceRecord>& records);
std::string ToJsonLine(const TraceRecord& r);

// Deterministic filler text of `tokens` bytes (one token per byte for the
// byte tokenizer), varied by `salt`.
std::string SynthesizePrompt(int tokens, uint64_t salt);

}  // namespace ballast::bench
