// Replayer: sends a trace's requests and advisories to a Ballast scheduler
// over the public gRPC API at their trace times — open loop, one concurrent
// stream per request — and measures each request client-side.
//
// The harness's clock: every latency (TTFT, end to end) is timed from the
// request's scheduled arrival (release_s: start + arrival_s / rate_scale, or
// its dependency's end + delay_s), not from when the client sent it. A client
// that sends late (thread start-up, --max-inflight, CPU saturation) therefore
// cannot hide its lag from the latencies; the lag itself (send - scheduled)
// is reported per request and in total (see report.h).
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
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ballast/v1/inference.pb.h"
#include "bench/trace.h"
#include "grpcpp/security/credentials.h"

namespace ballast::bench {

struct ReplayOptions {
  std::string target = "127.0.0.1:50051";
  double rate_scale = 1.0;
  double duration_s = 0;   // 0: the whole trace
  int max_inflight = 512;  // requests beyond this wait (counted as client_delayed)
  bool progress = true;    // progress bar on stderr
  // Credentials of the connection (TLS to a scheduler that has it).
  // Default null: plaintext.
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  // Sent as "authorization: Bearer <api_key>" on every call; empty: none.
  std::string api_key;
};

struct RequestOutcome {
  std::string id, model, session;
  int turn = 0;
  int prompt_tokens = 0, cached_tokens = 0, output_tokens = 0;
  uint32_t ttft_slo_ms = 0, tpot_slo_ms = 0;  // from the trace (0: the model's)
  double release_s = -1;                      // scheduled arrival: the origin of every latency
  double send_s = -1;                         // when it was sent (later if the client lagged)
  double first_token_s = -1;
  double end_s = -1;
  double server_queue_ms = -1;
  double scheduler_ms = -1, kv_fetch_ms = -1, kv_load_ms = -1;  // parts of it (Timings)
  // The node's own TTFT (Timings.node_ttft_ms: from the arrival at the
  // scheduler, by the node's reckoning, until the engine's first token;
  // -1: not reported).
  double node_ttft_ms = -1;
  // The scheduler's TTFT (Timings.ttft_ms: from the arrival at the
  // scheduler until it read the first token from the node; -1: not
  // reported).
  double scheduler_ttft_ms = -1;
  // The node's parts of the path (Timings.node_admission_ms,
  // first_token_delivery_ms: its admission queue, its delivery of the first
  // token; -1: not reported).
  double node_admission_ms = -1, first_token_delivery_ms = -1;
  std::string kv_source;
  int preemptions = 0;              // times the server preempted it (KV recomputed)
  std::string status = "NOT_SENT";  // gRPC code name, or ABORTED (dependency failed)
  std::string message;
  bool any_token = false;

  // Latencies from the scheduled arrival (send_s if that is unknown); -1: none.
  double origin_s() const { return release_s >= 0 ? release_s : send_s; }
  double ttft_ms() const { return first_token_s < 0 ? -1 : (first_token_s - origin_s()) * 1e3; }
  double e2e_ms() const { return end_s < 0 ? -1 : (end_s - origin_s()) * 1e3; }
  // Send - scheduled arrival; -1 if it was never sent.
  double client_lag_ms() const {
    return send_s < 0 || release_s < 0 ? -1 : (send_s - release_s) * 1e3;
  }
  // TPOT needs two tokens: with fewer there is no time per output token.
  bool has_tpot() const { return output_tokens >= 2 && first_token_s >= 0 && end_s >= 0; }
  double tpot_ms() const {
    return has_tpot() ? (end_s - first_token_s) * 1e3 / (output_tokens - 1) : -1;
  }
  // TTFT outside the node: the client's send lag, the RPCs to the
  // scheduler and the node, the token's relay back and the client's read
  // of it; -1: unknown.
  double path_ms() const {
    return node_ttft_ms < 0 || first_token_s < 0 ? -1 : ttft_ms() - node_ttft_ms;
  }
  // The path's parts, -1 when unknown. Between the node and the scheduler
  // (scheduler TTFT - node TTFT): the request's RPC to the node, the node's
  // admission queue, and the first token's way back to the scheduler,
  // through the node's delivery and both gRPC stacks.
  double node_relay_ms() const {
    return node_ttft_ms < 0 || scheduler_ttft_ms < 0 ? -1 : scheduler_ttft_ms - node_ttft_ms;
  }
  // Between the client and the scheduler (client TTFT - send lag -
  // scheduler TTFT): the client's RPC to the scheduler, the scheduler's
  // write of the first token and the client's read of it.
  double client_relay_ms() const {
    const double lag = client_lag_ms();
    return scheduler_ttft_ms < 0 || first_token_s < 0 || lag < 0
               ? -1
               : ttft_ms() - lag - scheduler_ttft_ms;
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
