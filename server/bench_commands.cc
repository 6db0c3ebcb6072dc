#include "server/bench_commands.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "ballast/v1/inference.grpc.pb.h"
#include "bench/plots.h"
#include "bench/replay.h"
#include "bench/report.h"
#include "server/client_commands.h"
#include "server/config.h"
#include "server/ports.h"
#include "server/serve_process.h"

namespace ballast::server {
namespace {

namespace fs = std::filesystem;

int Error(const std::string& msg) {
  std::cerr << "error: " << msg << "\n";
  return 2;
}

// Replays `trace` at every rate scale against `target`; after each scale
// writes requests-<scale>.csv, result-<scale>.json and result.json (the runs
// so far) into `out`, then plots at the end. Returns the reports.
// `server_for` returns the scheduler address to use at rate scale k (and may
// start a server); `after_each` runs after each replay with the reports so far.
absl::StatusOr<std::vector<bench::Report>> ReplayAll(
    const std::vector<bench::TraceRecord>& trace, const BenchFlags& f, const std::string& out,
    const std::function<absl::StatusOr<std::string>(double)>& server_for,
    const std::function<void(const std::vector<bench::Report>&)>& after_each = {}) {
  fs::create_directories(out);
  std::vector<bench::ReplayResult> runs;
  std::vector<bench::Report> reports;
  nlohmann::json json = {{"trace", f.trace}, {"runs", nlohmann::json::array()}};
  for (double k : f.rate_scales) {
    auto target = server_for(k);
    if (!target.ok()) return target.status();
    bench::ReplayOptions o;
    o.target = *target;
    o.credentials = ClientCredentials();
    if (const char* key = std::getenv("BALLAST_API_KEY")) o.api_key = key;
    o.rate_scale = k;
    o.duration_s = f.duration_s;
    o.max_inflight = f.max_inflight;
    auto res = bench::Replay(trace, o);
    if (!res.ok()) return res.status();
    bench::Report rep = bench::Summarize(*res, f.slo_scale, f.max_client_lag_ms);
    std::cout << bench::FormatReport(rep) << std::endl;
    if (auto st = bench::WriteRequestsCsv(
            (fs::path(out) / absl::StrCat("requests-", k, ".csv")).string(), *res, f.slo_scale);
        !st.ok()) {
      return st;
    }
    const nlohmann::json run = bench::ToJson(rep);
    WriteFileAtomic(fs::path(out) / absl::StrCat("result-", k, ".json"),
                    nlohmann::json({{"trace", f.trace}, {"run", run}}).dump(2) + "\n");
    json["runs"].push_back(run);
    WriteFileAtomic(fs::path(out) / "result.json", json.dump(2) + "\n");
    runs.push_back(std::move(*res));
    reports.push_back(rep);
    if (after_each) after_each(reports);
  }
  if (f.plots) {
    // Detail plots from the run closest to rate scale 1.
    size_t detail = 0;
    for (size_t i = 0; i < runs.size(); ++i) {
      if (std::abs(runs[i].rate_scale - 1) < std::abs(runs[detail].rate_scale - 1)) detail = i;
    }
    // Plots are a convenience: without gnuplot the results still stand.
    auto pngs = bench::RenderPlots(out, runs, reports, detail);
    if (pngs.ok()) {
      std::cout << "plots: " << absl::StrJoin(*pngs, ", ") << std::endl;
    } else {
      std::cerr << "warning: no plots: " << pngs.status().message() << "\n";
    }
  }
  std::cout << "results: " << (fs::path(out) / "result.json").string() << std::endl;
  return reports;
}

// Writes compare.md and compare.json from the runs so far (`all[c]`: the
// reports of config c in rate-scale order; missing ones are not run yet).
// Invalid runs (client lag) are marked and never count toward the highest
// rate scale with >= 99% TTFT attainment. Returns the Markdown.
std::string WriteCompare(const BenchFlags& f, const std::vector<std::vector<bench::Report>>& all) {
  std::vector<double> best(all.size(), 0);
  bool any_invalid = false;
  for (size_t c = 0; c < all.size(); ++c) {
    for (const auto& r : all[c]) {
      any_invalid |= !r.valid;
      if (r.valid && r.total.ttft_attainment >= 0.99) best[c] = std::max(best[c], r.rate_scale);
    }
  }
  std::string md = "| config |";
  for (double k : f.rate_scales) md += absl::StrFormat(" TTFT@%gx |", k);
  md += " max rate scale with ≥99% TTFT | ratio to first |\n|---|";
  for (size_t i = 0; i < f.rate_scales.size() + 2; ++i) md += "---|";
  md += "\n";
  nlohmann::json table = nlohmann::json::array();
  for (size_t c = 0; c < all.size(); ++c) {
    nlohmann::json row = {{"config", f.configs[c]}, {"attainment", nlohmann::json::array()}};
    md += absl::StrCat("| ", fs::path(f.configs[c]).stem().string(), " |");
    for (size_t i = 0; i < f.rate_scales.size(); ++i) {
      if (i >= all[c].size()) {
        md += " not run |";
        continue;
      }
      const bench::Report& r = all[c][i];
      md += absl::StrFormat(" %.1f%%%s |", 100 * r.total.ttft_attainment,
                            r.valid ? "" : " (invalid)");
      row["attainment"].push_back({{"rate_scale", r.rate_scale},
                                   {"ttft", r.total.ttft_attainment},
                                   {"tpot", r.total.tpot_attainment},
                                   {"client_lag_p99_ms", r.client_lag_ms.p99},
                                   {"valid", r.valid}});
    }
    const double ratio = best[0] > 0 ? best[c] / best[0] : 0;
    md += absl::StrFormat(" %g | %s |\n", best[c],
                          best[0] > 0 ? absl::StrFormat("%.2f", ratio) : std::string("n/a"));
    row["max_rate_scale_99_ttft"] = best[c];
    row["ratio_to_first"] = ratio;
    table.push_back(row);
  }
  if (any_invalid) {
    md += absl::StrFormat(
        "\n(invalid): the client lagged (send - scheduled arrival p99 > %g ms); such runs do not "
        "count toward the max rate scale.\n",
        f.max_client_lag_ms);
  }
  WriteFileAtomic(fs::path(f.out) / "compare.md", md);
  WriteFileAtomic(fs::path(f.out) / "compare.json", table.dump(2) + "\n");
  return md;
}

}  // namespace

// Writes `text` to `path` through a temporary file and a rename: a reader
// (or a kill) never sees half a file.
void WriteFileAtomic(const std::filesystem::path& path, const std::string& text) {
  const fs::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << text;
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) std::cerr << "warning: cannot write " << path.string() << ": " << ec.message() << "\n";
}

int RunTraceGenerate(const std::vector<bench::TraceRecord>& trace, const std::string& out) {
  if (auto st = bench::WriteTrace(out, trace); !st.ok()) return Error(std::string(st.message()));
  std::cout << "wrote " << out << "\n" << bench::FormatStats(bench::ComputeStats(trace));
  return 0;
}

int RunTraceImport(const bench::ImportOptions& o, const std::string& out) {
  auto imported = bench::ImportTrace(o);
  if (!imported.ok()) return Error(std::string(imported.status().message()));
  if (auto st = bench::WriteTrace(out, imported->records); !st.ok()) {
    return Error(std::string(st.message()));
  }
  std::cout << bench::FormatImportSummary(o, *imported, out) << "\n";
  return 0;
}

int RunTraceStats(const std::string& path, const std::vector<std::string>& models) {
  auto trace = bench::ReadTrace(path);
  if (!trace.ok()) return Error(std::string(trace.status().message()));
  std::cout << bench::FormatStats(bench::ComputeStats(*trace, 5.0, models));
  return 0;
}

int RunBench(const BenchFlags& f) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  auto trace = bench::ReadTrace(f.trace);
  if (!trace.ok()) return Error(std::string(trace.status().message()));
  auto reports =
      ReplayAll(*trace, f, f.out, [&](double) -> absl::StatusOr<std::string> { return f.target; });
  if (!reports.ok()) return Error(std::string(reports.status().message()));
  for (const auto& r : *reports)
    if (!r.accounting_ok) return Error("accounting mismatch (see the report)");
  return 0;
}

int RunBenchCompare(const BenchFlags& f) {
  if (f.configs.empty()) return Error("--configs needs at least one config file");
  setvbuf(stdout, nullptr, _IOLBF, 0);
  auto trace = bench::ReadTrace(f.trace);
  if (!trace.ok()) return Error(std::string(trace.status().message()));
  fs::create_directories(f.out);
  ForwardStopSignals();
  ServeStartOptions start;
  if (f.warmup) {
    // Every model of the trace, in order of first request.
    for (const auto& r : *trace) {
      if (std::find(start.warm_models.begin(), start.warm_models.end(), r.model) ==
          start.warm_models.end()) {
        start.warm_models.push_back(r.model);
      }
    }
  }
  std::vector<std::string> names;
  std::vector<std::vector<bench::Report>> all;
  for (const auto& config : f.configs) {
    const std::string name = fs::path(config).stem().string();
    const std::string out = (fs::path(f.out) / name).string();
    fs::create_directories(out);
    std::cout << "=== " << name << " (" << config << ")" << std::endl;
    names.push_back(name);
    all.emplace_back();
    ServeProcess serve;
    // A fresh server for every rate scale: runs do not share caches or state.
    auto reports = ReplayAll(
        *trace, f, out,
        [&](double k) -> absl::StatusOr<std::string> {
          serve.Stop();
          std::string target;
          auto st = serve.Start(
              config, (fs::path(out) / absl::StrCat("serve-", k, ".log")).string(), start, &target);
          if (!st.ok()) return st;
          return target;
        },
        [&](const std::vector<bench::Report>& so_far) {
          serve.Stop();
          all.back() = so_far;
          WriteCompare(f, all);
        });
    if (!reports.ok()) return Error(absl::StrCat(config, ": ", reports.status().message()));
  }
  const std::string md = WriteCompare(f, all);
  if (f.plots) {
    auto png = bench::RenderComparePlot(f.out, names, all);
    if (png.ok()) {
      std::cout << "plot: " << *png << std::endl;
    } else {
      std::cerr << "warning: no plot: " << png.status().message() << "\n";
    }
  }
  std::cout << md << "written: " << (fs::path(f.out) / "compare.md").string() << std::endl;
  RestoreStopSignals();
  return 0;
}

}  // namespace ballast::server
