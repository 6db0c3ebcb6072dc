// Report accounting on hand-made outcomes: classification, attainment
// against per-request and per-model SLOs, and the counts adding up.
#include "bench/report.h"

#include <algorithm>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"

#include "gtest/gtest.h"

namespace ballast::bench {
namespace {

RequestOutcome Done(const std::string& model, double ttft_ms, double tpot_ms, int tokens) {
  RequestOutcome r;
  r.id = model + std::to_string(ttft_ms);
  r.model = model;
  r.status = "OK";
  r.any_token = true;
  r.release_s = 1.0;
  r.send_s = 1.0;
  r.first_token_s = 1.0 + ttft_ms / 1e3;
  r.output_tokens = tokens;
  r.end_s = r.first_token_s + tpot_ms * (tokens - 1) / 1e3;
  return r;
}

RequestOutcome Failed(const std::string& model, const std::string& status, bool token) {
  RequestOutcome r;
  r.id = model + status;
  r.model = model;
  r.status = status;
  r.any_token = token;
  if (status != "ABORTED") {  // an aborted dependent is never sent
    r.release_s = 1.0;
    r.send_s = 1.0;
  }
  r.end_s = 1.1;
  r.message = "why " + model + " " + status;
  return r;
}

ReplayResult Result() {
  ReplayResult res;
  res.rate_scale = 2;
  res.wall_s = 10;
  res.model_slos["a"] = {100, 10};
  res.model_slos["b"] = {50, 5};
  res.requests = {Done("a", 80, 8, 5),   // meets both
                  Done("a", 120, 8, 5),  // misses TTFT
                  Done("a", 20, 12, 5),  // misses TPOT
                  Done("b", 40, 4, 3),   // meets both
                  Failed("b", "RESOURCE_EXHAUSTED", false),
                  Failed("b", "UNAVAILABLE", true),
                  Failed("a", "ABORTED", false)};
  res.trace_requests = 9;
  res.excluded_by_duration = 2;
  return res;
}

TEST(Report, ClassifiesAndCountsEveryRequest) {
  const Report r = Summarize(Result(), 1.0);
  EXPECT_TRUE(r.accounting_ok);
  EXPECT_EQ(r.total.total, 7);
  EXPECT_EQ(r.total.completed, 4);
  EXPECT_EQ(r.total.rejected, 1);
  EXPECT_EQ(r.total.failed, 2);  // UNAVAILABLE mid-stream, ABORTED dependent
  EXPECT_EQ(r.by_status.at("OK"), 4);
  EXPECT_EQ(r.per_model.at("a").total + r.per_model.at("b").total, 7);
  // Each failed status keeps its first message, and the text report says it.
  EXPECT_EQ(r.first_message.size(), 3u);
  EXPECT_EQ(r.first_message.at("UNAVAILABLE"), "why b UNAVAILABLE");
  EXPECT_EQ(r.first_message.count("OK"), 0u);  // an OK request's message is no failure's

  EXPECT_NE(FormatReport(r).find("first RESOURCE_EXHAUSTED: why b RESOURCE_EXHAUSTED"),
            std::string::npos);
}

// "First" is by end time, not trace order; a long message is cut on a
// character boundary.
TEST(Report, FirstMessageIsTheEarliestFailureOfItsStatus) {
  ReplayResult res = Result();
  RequestOutcome later = Failed("a", "UNAVAILABLE", true);
  later.end_s = 5.0;
  later.message = "later";
  res.requests.insert(res.requests.begin(), later);
  RequestOutcome earlier = Failed("a", "UNAVAILABLE", true);
  earlier.end_s = 0.5;
  earlier.message = std::string(299, 'x') + "\xC3\xA9";  // 'é' across byte 300
  res.requests.push_back(earlier);
  RequestOutcome ok = Done("a", 80, 8, 5);
  ok.message = "fine";
  res.requests.push_back(ok);
  const Report r = Summarize(res, 1.0);
  EXPECT_EQ(r.first_message.count("OK"), 0u);
  EXPECT_EQ(r.first_message.at("UNAVAILABLE"), earlier.message);
  const std::string text = FormatReport(r);
  EXPECT_NE(text.find("first UNAVAILABLE: " + std::string(299, 'x') + "\n"), std::string::npos);
}

TEST(Report, AttainmentUsesModelSlosAndTheScale) {
  Report r = Summarize(Result(), 1.0);
  EXPECT_NEAR(r.total.ttft_attainment, 3.0 / 7, 1e-9);  // a80, a20, b40
  EXPECT_NEAR(r.total.tpot_attainment, 3.0 / 7, 1e-9);  // a80, a120, b40
  EXPECT_NEAR(r.total.slo_attainment, 2.0 / 7, 1e-9);
  EXPECT_NEAR(r.goodput_rps, 0.2, 1e-9);
  EXPECT_NEAR(r.token_throughput, 1.8, 1e-9);
  r = Summarize(Result(), 2.0);  // doubled SLOs: all completed requests meet both
  EXPECT_NEAR(r.total.slo_attainment, 4.0 / 7, 1e-9);
  // A per-request SLO overrides the model's.
  ReplayResult res = Result();
  res.requests[1].ttft_slo_ms = 200;
  EXPECT_NEAR(Summarize(res, 1.0).total.ttft_attainment, 4.0 / 7, 1e-9);
}

TEST(Report, LatenciesAreTimedFromTheScheduledArrival) {
  ReplayResult res = Result();
  // Scheduled at 0.5 s, sent 0.5 s late at 1.0 s, first token 80 ms after
  // the send: its TTFT is 580 ms, not 80.
  res.requests[0].release_s = 0.5;
  EXPECT_NEAR(res.requests[0].ttft_ms(), 580, 1e-6);
  EXPECT_NEAR(res.requests[0].e2e_ms(), 580 + 32, 1e-6);
  EXPECT_NEAR(res.requests[0].client_lag_ms(), 500, 1e-6);
  const Report r = Summarize(res, 1.0);
  EXPECT_NEAR(r.total.ttft_attainment, 2.0 / 7, 1e-9);  // a80 now misses
  EXPECT_NEAR(r.total.ttft_ms.max, 580, 1e-6);
  EXPECT_EQ(r.client_lag_ms.n, 6);  // every request sent; ABORTED never was
  EXPECT_NEAR(r.client_lag_ms.max, 500, 1e-6);
  EXPECT_NEAR(r.client_lag_ms.p50, 0, 1e-6);
}

// The path outside the node's engine: client TTFT less the node's own,
// over the requests whose node reported it; in the JSON and the text.
TEST(Report, PathIsClientTtftLessTheNodesTtft) {
  ReplayResult res = Result();
  res.requests[0].node_ttft_ms = 77;  // client TTFT 80 ms
  res.requests[3].node_ttft_ms = 39;  // client TTFT 40 ms
  EXPECT_NEAR(res.requests[0].path_ms(), 3, 1e-6);
  EXPECT_EQ(res.requests[1].path_ms(), -1);  // not reported
  const Report r = Summarize(res, 1.0);
  EXPECT_EQ(r.total.path_ms.n, 2);
  EXPECT_NEAR(r.total.path_ms.max, 3, 1e-6);
  EXPECT_NEAR(r.per_model.at("b").path_ms.p50, 1, 1e-6);
  EXPECT_EQ(ToJson(r)["total"]["path_ms"]["n"], 2);
  EXPECT_EQ(r.total.node_ttft_ms.n, 2);
  EXPECT_NEAR(r.total.node_ttft_ms.max, 77, 1e-6);
  EXPECT_NEAR(ToJson(r)["per_model"]["b"]["node_ttft_ms"]["p50"].get<double>(), 39, 1e-6);
  EXPECT_NE(FormatReport(r).find("TTFT outside the node ("), std::string::npos);
  EXPECT_EQ(FormatReport(Summarize(Result(), 1.0)).find("outside the node"),
            std::string::npos);  // nothing reported, no line
}

// The path's parts: node -> scheduler is the scheduler's TTFT less the
// node's; scheduler -> client is the client's TTFT less its send lag and
// the scheduler's TTFT. With the lag they add up to the path.
TEST(Report, PathSplitsAtTheScheduler) {
  ReplayResult res = Result();
  RequestOutcome& a = res.requests[0];  // released at 1.0 s, client TTFT 80 ms
  a.send_s = 1.002;                     // sent 2 ms late
  a.node_ttft_ms = 70;
  a.scheduler_ttft_ms = 75;
  EXPECT_NEAR(a.node_relay_ms(), 5, 1e-6);
  EXPECT_NEAR(a.client_relay_ms(), 80 - 2 - 75, 1e-6);
  EXPECT_NEAR(a.client_lag_ms() + a.node_relay_ms() + a.client_relay_ms(), a.path_ms(), 1e-6);
  res.requests[3].scheduler_ttft_ms = 38;  // no node TTFT: only the client's part
  EXPECT_EQ(res.requests[3].node_relay_ms(), -1);
  EXPECT_NEAR(res.requests[3].client_relay_ms(), 2, 1e-6);
  EXPECT_EQ(res.requests[1].client_relay_ms(), -1);  // nothing reported
  const Report r = Summarize(res, 1.0);
  EXPECT_EQ(r.total.node_relay_ms.n, 1);
  EXPECT_EQ(r.total.client_relay_ms.n, 2);
  EXPECT_NEAR(r.per_model.at("a").client_relay_ms.max, 3, 1e-6);
  EXPECT_EQ(ToJson(r)["total"]["node_relay_ms"]["n"], 1);
  EXPECT_EQ(ToJson(r)["per_model"]["b"]["client_relay_ms"]["n"], 1);
  EXPECT_NE(FormatReport(r).find("node -> scheduler (scheduler TTFT - node TTFT): p50 5.00 ms"),
            std::string::npos)
      << FormatReport(r);
  EXPECT_EQ(FormatReport(r).find("admission queue"), std::string::npos);  // not reported
  a.node_admission_ms = 0.5;
  a.first_token_delivery_ms = 1.5;
  const Report parts = Summarize(res, 1.0);
  EXPECT_EQ(parts.total.node_admission_ms.n, 1);
  EXPECT_NEAR(parts.per_model.at("a").first_token_delivery_ms.p50, 1.5, 1e-6);
  EXPECT_EQ(ToJson(parts)["total"]["node_admission_ms"]["n"], 1);
  EXPECT_NE(FormatReport(parts).find("admission queue: p50 0.50 ms"), std::string::npos)
      << FormatReport(parts);
}

TEST(Report, ClientLagBeyondTheThresholdInvalidatesTheRun) {
  ReplayResult res = Result();
  EXPECT_TRUE(Summarize(res, 1.0).valid);
  for (auto& r : res.requests) r.release_s = r.send_s - 0.2;  // every send 200 ms late
  const Report r = Summarize(res, 1.0);
  EXPECT_FALSE(r.valid);
  EXPECT_NE(r.invalid_reason.find("client lag p99"), std::string::npos);
  EXPECT_NEAR(r.client_lag_ms.p99, 200, 1e-6);
  EXPECT_TRUE(Summarize(res, 1.0, 250).valid);
  const auto j = ToJson(r);
  EXPECT_FALSE(j["valid"].get<bool>());
  for (const char* k : {"client_lag_mean_ms", "client_lag_p50_ms", "client_lag_p99_ms",
                        "client_lag_max_ms", "max_client_lag_ms", "invalid_reason"}) {
    EXPECT_TRUE(j.contains(k)) << k;
  }
  EXPECT_NE(FormatReport(r).find("INVALID RUN"), std::string::npos);
}

TEST(Report, RequestsWithFewerThanTwoTokensHaveNoTpot) {
  ReplayResult res = Result();
  RequestOutcome one = Done("a", 50, 0, 1);  // one token: meets TTFT, has no TPOT
  EXPECT_FALSE(one.has_tpot());
  res.requests.push_back(one);
  res.trace_requests++;
  const Report r = Summarize(res, 1.0);
  EXPECT_EQ(r.total.no_tpot, 1);
  EXPECT_EQ(r.total.met_tpot, 3);                       // not counted as meeting TPOT
  EXPECT_NEAR(r.total.tpot_attainment, 3.0 / 7, 1e-9);  // over the 7 that can have one
  EXPECT_NEAR(r.total.ttft_attainment, 4.0 / 8, 1e-9);
  EXPECT_EQ(r.total.tpot_ms.n, 4);  // its TPOT is not a zero in the distribution
  EXPECT_EQ(r.per_model.at("a").no_tpot, 1);
}

TEST(Report, ThroughputCountsInputAndOutputTokens) {
  ReplayResult res = Result();
  for (auto& r : res.requests) r.prompt_tokens = r.status == "OK" ? 10 : 0;
  const Report r = Summarize(res, 1.0);
  EXPECT_NEAR(r.output_token_throughput, 1.8, 1e-9);
  EXPECT_NEAR(r.input_token_throughput, 4.0, 1e-9);
  EXPECT_NEAR(r.token_throughput, 5.8, 1e-9);
  EXPECT_EQ(r.total.input_tokens, 40);
}

// Preemptions (the server recomputing a request's KV) are summed and the
// requests that had any counted, per model and in total, and land in the
// JSON, the text and the CSV.
TEST(Report, CountsPreemptionsPerRequest) {
  ReplayResult res = Result();
  res.requests[0].preemptions = 2;
  res.requests[3].preemptions = 1;
  const Report r = Summarize(res, 1.0);
  EXPECT_EQ(r.total.preemptions, 3);
  EXPECT_EQ(r.total.preempted_requests, 2);
  EXPECT_EQ(r.per_model.at("a").preemptions, 2);
  EXPECT_EQ(r.per_model.at("b").preempted_requests, 1);
  EXPECT_EQ(ToJson(r)["total"]["preemptions"], 3);
  EXPECT_NE(FormatReport(r).find("preemptions 3 (2 requests)"), std::string::npos)
      << FormatReport(r);
  const std::string csv = ::testing::TempDir() + "/preemptions.csv";
  ASSERT_TRUE(WriteRequestsCsv(csv, res, 1.0).ok());
  std::ifstream in(csv);
  std::string header, first;
  std::getline(in, header);
  std::getline(in, first);
  const std::vector<std::string> names = absl::StrSplit(header, ',');
  const std::vector<std::string> values = absl::StrSplit(first, ',');
  ASSERT_EQ(names.size(), values.size());
  const auto col = std::find(names.begin(), names.end(), "preemptions");
  ASSERT_NE(col, names.end()) << header;
  EXPECT_EQ(values[static_cast<size_t>(col - names.begin())], "2");
  EXPECT_EQ(names[names.size() - 2], "node_ttft_ms");
  EXPECT_EQ(names.back(), "scheduler_ttft_ms");
  EXPECT_EQ(values.back(), "-1.000");  // not reported
}

TEST(Report, DetectsAccountingMismatch) {
  ReplayResult res = Result();
  res.requests.push_back(RequestOutcome{});  // never sent, never ended
  EXPECT_FALSE(Summarize(res, 1.0).accounting_ok);
  res = Result();
  res.trace_requests = 10;  // one request unaccounted for
  EXPECT_FALSE(Summarize(res, 1.0).accounting_ok);
}

TEST(Report, JsonHasTheDocumentedShape) {
  const auto j = ToJson(Summarize(Result(), 1.0));
  for (const char* k : {"rate_scale", "slo_scale", "total", "per_model", "by_status", "goodput_rps",
                        "token_throughput", "advisories", "accounting_ok"}) {
    EXPECT_TRUE(j.contains(k)) << k;
  }
  EXPECT_EQ(j["total"]["ttft_ms"]["n"], 4);
}

}  // namespace
}  // namespace ballast::bench
