// Replayer: sends a trace's requests and advisories to a Ballast scheduler
// over the public gRPC API at their trace times — open loop, one concurrent
// stream per request — and measures each request client-side.
//
// Release rule: records without "after" at arrival_s / rate_scale; a record
// with "after" when that record has ended, plus delay_s. A request whose
// dependency failed is not sent and ends ABORTED. With duration_s > 0, only
// independent records released within the duration are kept, with
// everything that depends on them; the rest are counted as excluded.
//
// Thread-safety: Replay() is a blocking call; it runs its own threads.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ballast/v1/inference.pb.h"
#include "bench/trace.h"

namespace ballast::bench {

struct ReplayOptions {
  std::string target = "127.0.0.1:50051";
  double rate_scale = 1.0;
  double duration_s = 0;   // 0: the whole trace
  int max_inflight = 512;  // requests beyond this wait (counted as client_delayed)
  bool progress = true;    // progress bar on stderr
};

struct RequestOutcome {
  std::string id, model, session;
  int turn = 0;
  int prompt_tokens = 0, cached_tokens = 0, output_tokens = 0;
  uint32_t ttft_slo_ms = 0, tpot_slo_ms = 0;  // from the trace (0: the model's)
  double release_s = -1;                      // when the trace said to send it
  double send_s = -1;                         // when it was sent (later if max_inflight was hit)
  double first_token_s = -1;
  double end_s = -1;
  double server_queue_ms = -1;
  std::string kv_source;
  std::string status = "NOT_SENT";  // gRPC code name, or ABORTED (dependency failed)
  std::string message;
  bool any_token = false;

  double ttft_ms() const { return first_token_s < 0 ? -1 : (first_token_s - send_s) * 1e3; }
  double e2e_ms() const { return end_s < 0 ? -1 : (end_s - send_s) * 1e3; }
  double tpot_ms() const {
    return output_tokens > 1 ? (end_s - first_token_s) * 1e3 / (output_tokens - 1) : 0.0;
  }
};

struct ModelSlo {
  uint32_t ttft_ms = 0, tpot_ms = 0;
};

struct ReplayResult {
  double rate_scale = 1;
  double wall_s = 0;
  int trace_requests = 0;
  int excluded_by_duration = 0;
  int client_delayed = 0;
  std::vector<RequestOutcome> requests;
  int advisories_sent = 0;
  int advisories_skipped = 0;                  // their dependency failed
  std::map<std::string, int> advise_status;    // code name -> count
  std::map<std::string, ModelSlo> model_slos;  // from ListModels at start
};

// "device", "recomputed", ...: a KvSource's enum name without its prefix,
// lower case (CSV columns and CLI output).
std::string KvSourceName(v1::KvSource source);

absl::StatusOr<ReplayResult> Replay(const std::vector<TraceRecord>& trace,
                                    const ReplayOptions& options);

}  // namespace ballast::bench
