#include "bench/report.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ballast::bench {
namespace {

// `s` cut to at most `bytes` bytes without splitting a UTF-8 character.
std::string Clip(const std::string& s, size_t bytes) {
  if (s.size() <= bytes) return s;
  size_t n = bytes;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  return s.substr(0, n);
}

struct Slo {
  double ttft_ms, tpot_ms;
};

Slo SloFor(const RequestOutcome& r, const ReplayResult& res, double scale) {
  ModelSlo m;
  if (auto it = res.model_slos.find(r.model); it != res.model_slos.end()) m = it->second;
  const double ttft = r.ttft_slo_ms ? r.ttft_slo_ms : m.ttft_ms;
  const double tpot = r.tpot_slo_ms ? r.tpot_slo_ms : m.tpot_ms;
  // A model with no SLO at all (unknown model): nothing can meet it.
  return {ttft > 0 ? ttft * scale : -1, tpot > 0 ? tpot * scale : -1};
}

struct Verdict {
  Outcome outcome;
  bool ttft_ok, tpot_ok, no_tpot;
};

Verdict Judge(const RequestOutcome& r, const ReplayResult& res, double slo_scale) {
  const Outcome o = Classify(r);
  const Slo slo = SloFor(r, res, slo_scale);
  const bool done = o == Outcome::kCompleted;
  Verdict v{o, false, false, done && !r.has_tpot()};
  v.ttft_ok = done && slo.ttft_ms >= 0 && r.ttft_ms() <= slo.ttft_ms;
  v.tpot_ok = done && r.has_tpot() && slo.tpot_ms >= 0 && r.tpot_ms() <= slo.tpot_ms;
  return v;
}

struct Acc {
  std::vector<double> ttft, tpot, e2e, queue, path, node_relay, client_relay, node_ttft, admission,
      delivery;
};

void Add(GroupReport& g, Acc& a, const RequestOutcome& r, const Verdict& v) {
  ++g.total;
  if (v.outcome == Outcome::kCompleted) ++g.completed;
  if (v.outcome == Outcome::kRejected) ++g.rejected;
  if (v.outcome == Outcome::kFailed) ++g.failed;
  g.met_ttft += v.ttft_ok;
  g.met_tpot += v.tpot_ok;
  g.no_tpot += v.no_tpot;
  g.met_both += v.ttft_ok && (v.tpot_ok || v.no_tpot);
  g.input_tokens += r.prompt_tokens;
  g.output_tokens += r.output_tokens;
  g.preemptions += r.preemptions;
  g.preempted_requests += r.preemptions > 0;
  if (v.outcome == Outcome::kCompleted) {
    a.ttft.push_back(r.ttft_ms());
    if (r.has_tpot()) a.tpot.push_back(r.tpot_ms());
    a.e2e.push_back(r.e2e_ms());
    if (r.server_queue_ms >= 0) a.queue.push_back(r.server_queue_ms);
    if (r.path_ms() >= 0) a.path.push_back(r.path_ms());
    if (r.node_ttft_ms >= 0) a.node_ttft.push_back(r.node_ttft_ms);
    if (r.node_admission_ms >= 0) a.admission.push_back(r.node_admission_ms);
    if (r.first_token_delivery_ms >= 0) a.delivery.push_back(r.first_token_delivery_ms);
    if (r.node_relay_ms() >= 0) a.node_relay.push_back(r.node_relay_ms());
    if (r.client_relay_ms() >= 0) a.client_relay.push_back(r.client_relay_ms());
  }
}

void Finish(GroupReport& g, Acc& a) {
  const double n = std::max(1, g.total);
  g.ttft_attainment = g.met_ttft / n;
  g.tpot_attainment = g.met_tpot / static_cast<double>(std::max(1, g.total - g.no_tpot));
  g.slo_attainment = g.met_both / n;
  g.ttft_ms = SummarizeLatency(a.ttft);
  g.tpot_ms = SummarizeLatency(a.tpot);
  g.e2e_ms = SummarizeLatency(a.e2e);
  g.queue_ms = SummarizeLatency(a.queue);
  g.path_ms = SummarizeLatency(a.path);
  g.node_relay_ms = SummarizeLatency(a.node_relay);
  g.client_relay_ms = SummarizeLatency(a.client_relay);
  g.node_ttft_ms = SummarizeLatency(a.node_ttft);
  g.node_admission_ms = SummarizeLatency(a.admission);
  g.first_token_delivery_ms = SummarizeLatency(a.delivery);
}

nlohmann::json ToJson(const GroupReport& g) {
  return {{"total", g.total},
          {"completed", g.completed},
          {"rejected", g.rejected},
          {"failed", g.failed},
          {"ttft_attainment", g.ttft_attainment},
          {"tpot_attainment", g.tpot_attainment},
          {"slo_attainment", g.slo_attainment},
          {"no_tpot", g.no_tpot},
          {"input_tokens", g.input_tokens},
          {"output_tokens", g.output_tokens},
          {"preemptions", g.preemptions},
          {"preempted_requests", g.preempted_requests},
          {"ttft_ms", ToJson(g.ttft_ms)},
          {"tpot_ms", ToJson(g.tpot_ms)},
          {"e2e_ms", ToJson(g.e2e_ms)},
          {"queue_ms", ToJson(g.queue_ms)},
          {"path_ms", ToJson(g.path_ms)},
          {"node_relay_ms", ToJson(g.node_relay_ms)},
          {"client_relay_ms", ToJson(g.client_relay_ms)},
          {"node_ttft_ms", ToJson(g.node_ttft_ms)},
          {"node_admission_ms", ToJson(g.node_admission_ms)},
          {"first_token_delivery_ms", ToJson(g.first_token_delivery_ms)}};
}

}  // namespace

nlohmann::json ToJson(const LatencySummary& s) {
  return {{"n", s.n},     {"mean", s.mean}, {"p50", s.p50},
          {"p90", s.p90}, {"p99", s.p99},   {"max", s.max}};
}

LatencySummary SummarizeLatency(std::vector<double> v) {
  LatencySummary s;
  s.n = static_cast<int>(v.size());
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  double sum = 0;
  for (double x : v) sum += x;
  s.mean = sum / static_cast<double>(v.size());
  auto pct = [&](double p) {
    const size_t k = static_cast<size_t>(std::ceil(p * static_cast<double>(v.size()))) - 1;
    return v[std::min(k, v.size() - 1)];
  };
  s.p50 = pct(0.50);
  s.p90 = pct(0.90);
  s.p99 = pct(0.99);
  s.max = v.back();
  return s;
}

Outcome Classify(const RequestOutcome& r) {
  if (r.status == "OK") return Outcome::kCompleted;
  static const char* kRejected[] = {"INVALID_ARGUMENT",    "NOT_FOUND",    "RESOURCE_EXHAUSTED",
                                    "FAILED_PRECONDITION", "OUT_OF_RANGE", "UNIMPLEMENTED",
                                    "PERMISSION_DENIED"};
  if (!r.any_token) {
    for (const char* c : kRejected)
      if (r.status == c) return Outcome::kRejected;
  }
  return Outcome::kFailed;
}

Report Summarize(const ReplayResult& res, double slo_scale, double max_client_lag_ms) {
  Report rep;
  rep.rate_scale = res.rate_scale;
  rep.slo_scale = slo_scale;
  rep.wall_s = res.wall_s;
  rep.trace_requests = res.trace_requests;
  rep.excluded_by_duration = res.excluded_by_duration;
  rep.client_delayed = res.client_delayed;
  rep.advisories_sent = res.advisories_sent;
  rep.advisories_skipped = res.advisories_skipped;
  rep.advise_status = res.advise_status;
  std::map<std::string, Acc> acc;
  Acc all;
  std::vector<double> lag;
  std::map<std::string, double> first_end;  // per failed status: its message's end
  for (const auto& r : res.requests) {
    const Verdict v = Judge(r, res, slo_scale);
    Add(rep.total, all, r, v);
    Add(rep.per_model[r.model], acc[r.model], r, v);
    ++rep.by_status[r.status];
    if (r.status != "OK" && !r.message.empty()) {
      // The earliest to end (an unknown end counts as last), else the
      // first in the trace.
      const double end = r.end_s >= 0 ? r.end_s : std::numeric_limits<double>::infinity();
      auto [it, fresh] = first_end.emplace(r.status, end);
      if (fresh || end < it->second) {
        it->second = end;
        rep.first_message[r.status] = r.message;
      }
    }
    if (r.client_lag_ms() >= 0) lag.push_back(r.client_lag_ms());
  }
  Finish(rep.total, all);
  for (auto& [m, g] : rep.per_model) Finish(g, acc[m]);
  if (rep.wall_s > 0) {
    rep.goodput_rps = rep.total.met_both / rep.wall_s;
    rep.input_token_throughput = static_cast<double>(rep.total.input_tokens) / rep.wall_s;
    rep.output_token_throughput = static_cast<double>(rep.total.output_tokens) / rep.wall_s;
    rep.token_throughput = rep.input_token_throughput + rep.output_token_throughput;
  }
  rep.client_lag_ms = SummarizeLatency(std::move(lag));
  rep.max_client_lag_ms = max_client_lag_ms;
  if (rep.client_lag_ms.p99 > max_client_lag_ms) {
    rep.valid = false;
    rep.invalid_reason =
        absl::StrFormat("client lag p99 %.1f ms > %g ms", rep.client_lag_ms.p99, max_client_lag_ms);
  }
  int by_status = 0;
  for (const auto& [s, n] : rep.by_status) by_status += n;
  rep.accounting_ok =
      rep.total.completed + rep.total.rejected + rep.total.failed == rep.total.total &&
      rep.total.total + rep.excluded_by_duration == rep.trace_requests &&
      by_status == rep.total.total && rep.by_status.count("NOT_SENT") == 0;
  return rep;
}

nlohmann::json ToJson(const Report& r) {
  nlohmann::json per_model = nlohmann::json::object();
  for (const auto& [m, g] : r.per_model) per_model[m] = ToJson(g);
  return {{"rate_scale", r.rate_scale},
          {"slo_scale", r.slo_scale},
          {"wall_s", r.wall_s},
          {"trace_requests", r.trace_requests},
          {"excluded_by_duration", r.excluded_by_duration},
          {"client_delayed", r.client_delayed},
          {"total", ToJson(r.total)},
          {"per_model", per_model},
          {"by_status", r.by_status},
          {"first_message", r.first_message},
          {"goodput_rps", r.goodput_rps},
          {"token_throughput", r.token_throughput},
          {"input_token_throughput", r.input_token_throughput},
          {"output_token_throughput", r.output_token_throughput},
          {"client_lag_mean_ms", r.client_lag_ms.mean},
          {"client_lag_p50_ms", r.client_lag_ms.p50},
          {"client_lag_p99_ms", r.client_lag_ms.p99},
          {"client_lag_max_ms", r.client_lag_ms.max},
          {"max_client_lag_ms", r.max_client_lag_ms},
          {"valid", r.valid},
          {"invalid_reason", r.invalid_reason},
          {"advisories",
           {{"sent", r.advisories_sent},
            {"skipped", r.advisories_skipped},
            {"by_status", r.advise_status}}},
          {"accounting_ok", r.accounting_ok}};
}

std::string FormatReport(const Report& r) {
  std::string out = absl::StrFormat(
      "rate scale %g, SLO scale %g: %d requests (%d completed, %d rejected, %d failed; %d excluded "
      "by --duration) in %.1f s\n",
      r.rate_scale, r.slo_scale, r.total.total, r.total.completed, r.total.rejected, r.total.failed,
      r.excluded_by_duration, r.wall_s);
  out += absl::StrFormat("%-16s %6s %8s %8s %8s %10s %10s %10s\n", "MODEL", "REQS", "TTFT-OK",
                         "TPOT-OK", "BOTH", "TTFT p50", "TTFT p99", "TPOT p50");
  auto row = [&](const std::string& name, const GroupReport& g) {
    out += absl::StrFormat("%-16s %6d %7.1f%% %7.1f%% %7.1f%% %8.1fms %8.1fms %8.2fms\n", name,
                           g.total, 100 * g.ttft_attainment, 100 * g.tpot_attainment,
                           100 * g.slo_attainment, g.ttft_ms.p50, g.ttft_ms.p99, g.tpot_ms.p50);
  };
  for (const auto& [m, g] : r.per_model) row(m, g);
  row("TOTAL", r.total);
  out += absl::StrFormat(
      "goodput %.2f req/s, throughput %.1f tokens/s (%.1f in + %.1f out); %d without TPOT "
      "(< 2 tokens); advisories sent %d",
      r.goodput_rps, r.token_throughput, r.input_token_throughput, r.output_token_throughput,
      r.total.no_tpot, r.advisories_sent);
  for (const auto& [s, n] : r.advise_status) out += absl::StrFormat(" [%s: %d]", s, n);
  out += absl::StrFormat("; preemptions %d (%d requests)\n", r.total.preemptions,
                         r.total.preempted_requests);
  if (!r.by_status.empty()) {
    out += "by status:";
    for (const auto& [s, n] : r.by_status) out += absl::StrFormat(" %s=%d", s, n);
    out += "\n";
    for (const auto& [s, m] : r.first_message) {
      out += absl::StrFormat("  first %s: %s\n", s, Clip(m, 300));
    }
  }
  out += absl::StrFormat(
      "client lag (send - scheduled): mean %.1f ms, p50 %.1f, p99 %.1f, max %.1f\n",
      r.client_lag_ms.mean, r.client_lag_ms.p50, r.client_lag_ms.p99, r.client_lag_ms.max);
  if (r.total.path_ms.n > 0 && r.total.path_ms.max > 0) {
    out += absl::StrFormat(
        "TTFT outside the node (client TTFT - node TTFT): p50 %.2f ms, p90 %.2f, p99 %.2f; the "
        "node's own TTFT: p50 %.2f ms, p99 %.2f\n",
        r.total.path_ms.p50, r.total.path_ms.p90, r.total.path_ms.p99, r.total.node_ttft_ms.p50,
        r.total.node_ttft_ms.p99);
  }
  if (r.total.node_relay_ms.n > 0 && r.total.client_relay_ms.n > 0) {
    const LatencySummary &n = r.total.node_relay_ms, &c = r.total.client_relay_ms;
    out += absl::StrFormat(
        "  node -> scheduler (scheduler TTFT - node TTFT): p50 %.2f ms, p90 %.2f, p99 %.2f; "
        "scheduler -> client (client TTFT - send lag - scheduler TTFT): p50 %.2f ms, p90 %.2f, "
        "p99 %.2f\n",
        n.p50, n.p90, n.p99, c.p50, c.p90, c.p99);
  }
  if (r.total.node_admission_ms.n > 0 && r.total.first_token_delivery_ms.n > 0) {
    const LatencySummary &a = r.total.node_admission_ms, &d = r.total.first_token_delivery_ms;
    out += absl::StrFormat(
        "  in node -> scheduler, the node's admission queue: p50 %.2f ms, p90 %.2f, p99 %.2f; its "
        "delivery of the first token: p50 %.2f ms, p90 %.2f, p99 %.2f\n",
        a.p50, a.p90, a.p99, d.p50, d.p90, d.p99);
  }
  if (!r.valid) out += absl::StrCat("INVALID RUN: ", r.invalid_reason, "\n");
  if (!r.accounting_ok) out += "ACCOUNTING MISMATCH: counts do not add up\n";
  return out;
}

absl::Status WriteRequestsCsv(const std::string& path, const ReplayResult& res, double slo_scale) {
  std::ofstream out(path, std::ios::trunc);
  if (!out) return absl::PermissionDeniedError(absl::StrCat("cannot write ", path));
  out << "id,model,session,turn,status,class,release_s,send_s,client_lag_ms,ttft_ms,tpot_ms,e2e_ms,"
         "queue_ms,"
         "prompt_tokens,cached_tokens,output_tokens,kv_source,ttft_slo_ms,tpot_slo_ms,ttft_met,"
         "tpot_met,scheduler_ms,kv_fetch_ms,kv_load_ms,preemptions,node_ttft_ms,scheduler_ttft_"
         "ms\n";
  for (const auto& r : res.requests) {
    const Verdict v = Judge(r, res, slo_scale);
    const Slo slo = SloFor(r, res, slo_scale);
    const char* cls = v.outcome == Outcome::kCompleted  ? "completed"
                      : v.outcome == Outcome::kRejected ? "rejected"
                                                        : "failed";
    out << absl::StrFormat(
        "%s,%s,%s,%d,%s,%s,%.4f,%.4f,%.3f,%.3f,%.3f,%.3f,%.3f,%d,%d,%d,%s,%.1f,%.1f,%d,%s,%.3f,"
        "%.3f,%.3f,%d,%.3f,%.3f\n",
        r.id, r.model, r.session, r.turn, r.status, cls, r.release_s, r.send_s, r.client_lag_ms(),
        r.ttft_ms(), r.tpot_ms(), r.e2e_ms(), r.server_queue_ms, r.prompt_tokens, r.cached_tokens,
        r.output_tokens, r.kv_source, slo.ttft_ms, slo.tpot_ms, v.ttft_ok,
        v.no_tpot ? "" : (v.tpot_ok ? "1" : "0"), r.scheduler_ms, r.kv_fetch_ms, r.kv_load_ms,
        r.preemptions, r.node_ttft_ms, r.scheduler_ttft_ms);
  }
  out.close();
  return out ? absl::OkStatus() : absl::DataLossError(absl::StrCat("short write to ", path));
}

}  // namespace ballast::bench
