// SLO attainment report of one replay: every request of the trace ends as
// completed (OK), rejected (the server refused it up front: INVALID_ARGUMENT,
// NOT_FOUND, RESOURCE_EXHAUSTED, FAILED_PRECONDITION, OUT_OF_RANGE,
// UNIMPLEMENTED, PERMISSION_DENIED with no token streamed) or failed (any
// other status, ABORTED dependents included), or was excluded by --duration;
// the counts add up to the trace's requests, and `accounting_ok` says so.
//
// Attainment: a request meets its TTFT SLO if it completed and its TTFT,
// timed from its scheduled arrival (replay.h), is <= SLO x slo_scale; TTFT
// attainment is over all requests sent or aborted. TPOT (mean time per output
// token after the first) needs >= 2 output tokens: a completed request with
// fewer has no TPOT, is counted apart (`no_tpot`), and is left out of TPOT
// attainment's numerator and denominator; its "both" verdict is its TTFT
// verdict. The SLO is the trace's per-request value, else the model's from
// ListModels. Goodput: requests meeting both SLOs per second of replay.
// Throughput: input (prompt) + output tokens per second, and each apart.
//
// Client lag (send - scheduled arrival) is summarised over the requests sent;
// a run whose lag p99 exceeds `max_client_lag_ms` is marked invalid
// (`valid` false, with the reason): its latencies measure the client.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "bench/replay.h"
#include "nlohmann/json.hpp"

namespace ballast::bench {

struct LatencySummary {
  int n = 0;
  double mean = 0, p50 = 0, p90 = 0, p99 = 0, max = 0;
};
// The summary of `v` (any order): nearest-rank percentiles.
LatencySummary SummarizeLatency(std::vector<double> v);
// {n, mean, p50, p90, p99, max}.
nlohmann::json ToJson(const LatencySummary& s);

struct GroupReport {
  int total = 0, completed = 0, rejected = 0, failed = 0;
  int met_ttft = 0, met_tpot = 0, met_both = 0;
  int no_tpot = 0;  // completed with < 2 output tokens: no TPOT
  double ttft_attainment = 0, tpot_attainment = 0, slo_attainment = 0;
  int64_t input_tokens = 0, output_tokens = 0;
  // Server-side preemptions (KV room taken, the KV recomputed): in total,
  // and how many requests had at least one (thrash, issue 13).
  int64_t preemptions = 0;
  int preempted_requests = 0;
  LatencySummary ttft_ms, tpot_ms, e2e_ms, queue_ms;
  // TTFT outside the node (RequestOutcome::path_ms), requests
  // whose node reported its own TTFT.
  LatencySummary path_ms;
  // Its parts (RequestOutcome::node_relay_ms, client_relay_ms), requests
  // that reported them.
  LatencySummary node_relay_ms, client_relay_ms;
  // The node's parts of node -> scheduler (RequestOutcome::
  // node_admission_ms, first_token_delivery_ms), requests that reported them.
  LatencySummary node_admission_ms, first_token_delivery_ms;
  // The node's own TTFT (RequestOutcome::node_ttft_ms), requests whose
  // node reported it: the TTFT without the path, what the simulator's
  // engine model alone decides.
  LatencySummary node_ttft_ms;
};

struct Report {
  double rate_scale = 1, slo_scale = 1, wall_s = 0;
  int trace_requests = 0, excluded_by_duration = 0, client_delayed = 0;
  GroupReport total;
  std::map<std::string, GroupReport> per_model;
  std::map<std::string, int> by_status;
  // Each failed status's first message (in trace order), so a run's
  // failures say why without its requests CSV.
  std::map<std::string, std::string> first_message;
  double goodput_rps = 0;
  double token_throughput = 0;  // input + output tokens/s
  double input_token_throughput = 0, output_token_throughput = 0;
  LatencySummary client_lag_ms;  // send - scheduled arrival, requests sent
  double max_client_lag_ms = 0;  // the p99 threshold this run was judged by
  bool valid = true;             // client lag p99 within the threshold
  std::string invalid_reason;
  int advisories_sent = 0, advisories_skipped = 0;
  std::map<std::string, int> advise_status;
  bool accounting_ok = false;
};

enum class Outcome { kCompleted, kRejected, kFailed };
Outcome Classify(const RequestOutcome& r);

// Default threshold on the client's lag p99 (ms); see README.
inline constexpr double kDefaultMaxClientLagMs = 50;

Report Summarize(const ReplayResult& result, double slo_scale,
                 double max_client_lag_ms = kDefaultMaxClientLagMs);
nlohmann::json ToJson(const Report& r);
std::string FormatReport(const Report& r);
// One row per request: id, model, session, turn, status, class, times (the
// scheduled arrival, the send and the client lag), SLO verdicts (tpot_met is
// empty for a request without TPOT), preemptions.
absl::Status WriteRequestsCsv(const std::string& path, const ReplayResult& result,
                              double slo_scale);

}  // namespace ballast::bench
