#include "server/bench_commands.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "ballast/v1/inference.grpc.pb.h"
#include "bench/plots.h"
#include "bench/replay.h"
#include "bench/report.h"
#include "bench/scale_search.h"
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

// Whether a run counts as meeting the target: valid (the client kept up)
// and at least kTargetAttainment of its requests within the TTFT SLO.
constexpr double kTargetAttainment = 0.99;
bool MeetsTarget(const bench::Report& r) {
  return r.valid && r.total.ttft_attainment >= kTargetAttainment;
}

// The rate scales of one config's runs: the --rate-scale list in order or,
// with --search, a ScaleSearch fed with each run's outcome.
class ScalePlan {
 public:
  static absl::StatusOr<ScalePlan> Create(const BenchFlags& f) {
    ScalePlan p;
    p.fixed_ = f.rate_scales;
    if (f.search.empty()) return p;
    if (f.search.size() != 2) {
      return absl::InvalidArgumentError("--search: expected LO,HI (two rate scales)");
    }
    auto s = bench::ScaleSearch::Create(
        {.lo = f.search[0], .hi = f.search[1], .max_runs = f.search_runs});
    if (!s.ok()) return s.status();
    p.search_ = std::move(*s);
    return p;
  }
  // The next scale, given the reports so far (the last one is recorded).
  std::optional<double> Next(const std::vector<bench::Report>& so_far) {
    if (!search_) {
      if (so_far.size() >= fixed_.size()) return std::nullopt;
      return fixed_[so_far.size()];
    }
    if (so_far.size() > static_cast<size_t>(search_->runs())) {
      search_->Record(so_far.back().rate_scale, MeetsTarget(so_far.back()));
    }
    return search_->Next();
  }

 private:
  std::vector<double> fixed_;
  std::optional<bench::ScaleSearch> search_;
};

// Replays `trace` at each rate scale of the plan against `target`; after
// each scale writes requests-<scale>.csv, result-<scale>.json and
// result.json (the runs so far) into `out`, then plots at the end. Returns
// the reports. `server_for` returns the scheduler address to use at rate
// scale k (and may start a server); `after_each` runs after each replay with
// the reports so far.
absl::StatusOr<std::vector<bench::Report>> ReplayAll(
    const std::vector<bench::TraceRecord>& trace, const BenchFlags& f, const std::string& out,
    const std::function<absl::StatusOr<std::string>(double)>& server_for,
    const std::function<void(const std::vector<bench::Report>&)>& after_each = {}) {
  fs::create_directories(out);
  auto plan = ScalePlan::Create(f);
  if (!plan.ok()) return plan.status();
  std::vector<bench::ReplayResult> runs;
  std::vector<bench::Report> reports;
  nlohmann::json json = {{"trace", f.trace}, {"runs", nlohmann::json::array()}};
  for (std::optional<double> next = plan->Next(reports); next; next = plan->Next(reports)) {
    const double k = *next;
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

// The lowest scale above `best` whose run missed the target (+inf: none):
// with `best`, the bracket in which the config's limit lies.
double LowestMissAbove(const std::vector<bench::Report>& runs, double best) {
  double miss = std::numeric_limits<double>::infinity();
  for (const auto& r : runs) {
    if (!MeetsTarget(r) && r.rate_scale > best) miss = std::min(miss, r.rate_scale);
  }
  return miss;
}

std::string FormatScale(double k) {
  return std::isfinite(k) ? absl::StrFormat("%g", k) : std::string("none");
}

// "1.50 (1.20-2.00)": the ratio of config c's limit to the first config's,
// and its bounds from both brackets (an open bound is "inf").
std::string FormatRatio(double best, double miss, double best0, double miss0) {
  if (best0 <= 0) return "n/a";
  const double lo = best / miss0, hi = miss / best0;
  return absl::StrFormat("%.2f (%s-%s)", best / best0, lo > 0 ? absl::StrFormat("%.2f", lo) : "0",
                         std::isfinite(hi) ? absl::StrFormat("%.2f", hi) : "inf");
}

// Writes compare.md and compare.json from the runs so far (`all[c]`: the
// reports of config c in run order; missing ones are not run yet). Invalid
// runs (client lag) are marked and never count toward the highest rate
// scale with >= 99% TTFT attainment. With --search, each config has its own
// scales, listed in one cell. Returns the Markdown.
std::string WriteCompare(const BenchFlags& f, const std::vector<std::vector<bench::Report>>& all) {
  std::vector<double> best(all.size(), 0), miss(all.size());
  bool any_invalid = false;
  for (size_t c = 0; c < all.size(); ++c) {
    for (const auto& r : all[c]) {
      any_invalid |= !r.valid;
      if (MeetsTarget(r)) best[c] = std::max(best[c], r.rate_scale);
    }
    miss[c] = LowestMissAbove(all[c], best[c]);
  }
  const bool search = !f.search.empty();
  std::string md = "| config |";
  if (search) {
    md += " runs (rate scale: TTFT attainment) |";
  } else {
    for (double k : f.rate_scales) md += absl::StrFormat(" TTFT@%gx |", k);
  }
  md +=
      " max rate scale with ≥99% TTFT | lowest scale above it missed (< 99% or invalid) |"
      " ratio to first (bounds) |\n|---|";
  for (size_t i = 0; i < (search ? 1 : f.rate_scales.size()) + 3; ++i) md += "---|";
  md += "\n";
  nlohmann::json table = nlohmann::json::array();
  for (size_t c = 0; c < all.size(); ++c) {
    nlohmann::json row = {{"config", f.configs[c]}, {"attainment", nlohmann::json::array()}};
    md += absl::StrCat("| ", fs::path(f.configs[c]).stem().string(), " |");
    std::vector<const bench::Report*> sorted;
    for (const auto& r : all[c]) sorted.push_back(&r);
    if (search) {  // by scale; a fixed grid keeps its columns' (run) order
      std::sort(sorted.begin(), sorted.end(), [](const bench::Report* a, const bench::Report* b) {
        return a->rate_scale < b->rate_scale;
      });
    }
    std::vector<std::string> cells;
    for (const bench::Report* r : sorted) {
      cells.push_back(
          absl::StrFormat("%s%.1f%%%s", search ? FormatScale(r->rate_scale) + "x: " : "",
                          100 * r->total.ttft_attainment, r->valid ? "" : " (invalid)"));
      row["attainment"].push_back({{"rate_scale", r->rate_scale},
                                   {"ttft", r->total.ttft_attainment},
                                   {"tpot", r->total.tpot_attainment},
                                   {"client_lag_p99_ms", r->client_lag_ms.p99},
                                   {"valid", r->valid}});
    }
    if (search) {
      md += absl::StrCat(" ", cells.empty() ? "not run" : absl::StrJoin(cells, ", "), " |");
    } else {
      for (size_t i = 0; i < f.rate_scales.size(); ++i) {
        // The fixed grid runs in --rate-scale order; a cell is that run's.
        md += i < all[c].size() ? absl::StrCat(" ", cells[i], " |") : std::string(" not run |");
      }
    }
    const double ratio = best[0] > 0 ? best[c] / best[0] : 0;
    md += absl::StrFormat(" %g | %s | %s |\n", best[c], FormatScale(miss[c]),
                          c == 0 ? std::string(best[0] > 0 ? "1.00" : "n/a")
                                 : FormatRatio(best[c], miss[c], best[0], miss[0]));
    row["max_rate_scale_99_ttft"] = best[c];
    // The bracket's upper end: the lowest scale above the max whose run
    // missed 99% or was invalid (absent when none did).
    if (std::isfinite(miss[c])) row["min_missed_rate_scale_99_ttft"] = miss[c];
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
  if (auto plan = ScalePlan::Create(f); !plan.ok())
    return Error(std::string(plan.status().message()));
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
