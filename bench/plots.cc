#include "bench/plots.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ballast::bench {
namespace {

std::string Quote(const std::string& s) { return "'" + s + "'"; }

absl::Status RunGnuplot(const std::string& dir, const std::string& script,
                        const std::string& name) {
  namespace fs = std::filesystem;
  std::ofstream(fs::path(dir) / name) << script;
  const std::string cmd = absl::StrCat("cd ", Quote(dir), " && gnuplot ", name, " 2> gnuplot.log");
  if (std::system(cmd.c_str()) != 0) {
    return absl::UnavailableError(absl::StrCat("gnuplot failed (is gnuplot-nox installed?); see ",
                                               (fs::path(dir) / "gnuplot.log").string()));
  }
  return absl::OkStatus();
}

// Attainment vs rate scale: writes attainment.dat, adds its plot to
// `script` and its PNG to `pngs`.
void AddAttainmentPlot(const std::string& dir, const std::vector<Report>& reports,
                       std::string* script, std::vector<std::string>* pngs) {
  namespace fs = std::filesystem;
  std::set<std::string> models;
  for (const auto& r : reports)
    for (const auto& [m, g] : r.per_model) models.insert(m);
  std::ofstream dat(fs::path(dir) / "attainment.dat");
  dat << "# rate_scale ttft_total tpot_total";
  for (const auto& m : models) dat << " ttft_" << m;
  dat << "\n";
  std::vector<size_t> order(reports.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return reports[a].rate_scale < reports[b].rate_scale; });
  for (size_t i : order) {
    const Report& r = reports[i];
    dat << absl::StrFormat("%g %g %g", r.rate_scale, 100 * r.total.ttft_attainment,
                           100 * r.total.tpot_attainment);
    for (const auto& m : models) {
      auto it = r.per_model.find(m);
      dat << " " << (it == r.per_model.end() ? 0.0 : 100 * it->second.ttft_attainment);
    }
    dat << "\n";
  }
  *script +=
      absl::StrCat("set output ", Quote((fs::path(dir) / "attainment.png").string()), "\n",
                   "set title 'SLO attainment vs rate scale'\nset xlabel 'rate scale'\n",
                   "set ylabel 'attainment (%)'\nset yrange [0:105]\nset xrange [*:*]\n",
                   "plot 'attainment.dat' using 1:2 with linespoints lw 2 title 'TTFT (all)', ",
                   "'' using 1:3 with linespoints lw 2 title 'TPOT (all)', ",
                   "99 with lines dt 3 lc rgb 'red' title '99%'");
  int col = 4;
  for (const auto& m : models) {
    *script += absl::StrCat(", '' using 1:", col++, " with linespoints dt 2 title 'TTFT ", m, "'");
  }
  *script += "\nset yrange [*:*]\n";
  pngs->push_back((fs::path(dir) / "attainment.png").string());
}

// Latency CDFs of `run`'s OK requests per model: writes latency_cdf.dat
// and, if any, adds its plot to `script` and its PNG to `pngs`.
void AddLatencyCdfPlot(const std::string& dir, const ReplayResult& run, std::string* script,
                       std::vector<std::string>* pngs) {
  namespace fs = std::filesystem;
  std::map<std::string, std::vector<double>> ttft, e2e;
  for (const auto& r : run.requests) {
    if (r.status != "OK") continue;
    ttft[r.model].push_back(r.ttft_ms());
    e2e[r.model].push_back(r.e2e_ms());
  }
  std::string plot_ttft, plot_e2e;
  int block = 0;
  {
    std::ofstream dat(fs::path(dir) / "latency_cdf.dat");
    for (auto& [m, v] : ttft) {
      auto& e = e2e[m];
      std::sort(v.begin(), v.end());
      std::sort(e.begin(), e.end());
      dat << "# " << m << "\n";
      for (size_t i = 0; i < v.size(); ++i) {
        dat << v[i] << " " << e[i] << " " << static_cast<double>(i + 1) / v.size() << "\n";
      }
      dat << "\n\n";
      const std::string sep = block ? ", " : "";
      plot_ttft += absl::StrCat(sep, "'latency_cdf.dat' index ", block,
                                " using 1:3 with steps lw 2 title ", Quote(m));
      plot_e2e += absl::StrCat(sep, "'latency_cdf.dat' index ", block,
                               " using 2:3 with steps lw 2 title ", Quote(m));
      ++block;
    }
  }
  if (block > 0) {
    *script +=
        absl::StrCat("set output ", Quote((fs::path(dir) / "latency_cdf.png").string()), "\n",
                     "set multiplot layout 1,2 title ",
                     Quote(absl::StrFormat("latency CDFs (rate scale %g)", run.rate_scale)), "\n",
                     "set logscale x\nset title 'TTFT'\nset xlabel 'TTFT (ms)'\nset ylabel "
                     "'fraction of requests'\n",
                     "set yrange [0:1]\nplot ", plot_ttft,
                     "\nset title 'end to end'\nset xlabel 'end-to-end latency (ms)'\nplot ",
                     plot_e2e, "\nunset multiplot\nunset logscale x\nset yrange [*:*]\n");
    pngs->push_back((fs::path(dir) / "latency_cdf.png").string());
  }
}

// Requests in flight per model over `run`: writes timeline.dat and, if
// any request was sent, adds its plot to `script` and its PNG to `pngs`.
void AddTimelinePlot(const std::string& dir, const ReplayResult& run, std::string* script,
                     std::vector<std::string>* pngs) {
  namespace fs = std::filesystem;
  // Timeline: in-flight requests per model, sampled every 0.1 s.
  std::map<std::string, std::vector<std::pair<double, double>>> spans;
  double end = 0;
  for (const auto& r : run.requests) {
    if (r.send_s < 0) continue;
    spans[r.model].push_back({r.send_s, r.end_s});
    end = std::max(end, r.end_s);
  }
  if (spans.empty()) return;
  std::ofstream dat(fs::path(dir) / "timeline.dat");
  dat << "# t";
  for (const auto& [m, s] : spans) dat << " " << m;
  dat << "\n";
  for (double t = 0; t <= end + 0.1; t += 0.1) {
    dat << absl::StrFormat("%.1f", t);
    for (const auto& [m, s] : spans) {
      int n = 0;
      for (const auto& [a, b] : s) n += a <= t && t < b;
      dat << " " << n;
    }
    dat << "\n";
  }
  *script += absl::StrCat(
      "set output ", Quote((fs::path(dir) / "timeline.png").string()), "\n", "set title ",
      Quote(absl::StrFormat("requests in flight per model (rate scale %g)", run.rate_scale)),
      "\nset xlabel 'time (s)'\nset ylabel 'requests in flight'\nplot ");
  int col = 2;
  for (const auto& [m, s] : spans) {
    *script += absl::StrCat(col > 2 ? ", " : "", "'timeline.dat' using 1:", col,
                            " with steps lw 2 title ", Quote(m));
    ++col;
  }
  *script += "\n";
  pngs->push_back((fs::path(dir) / "timeline.png").string());
}

}  // namespace

absl::StatusOr<std::vector<std::string>> RenderPlots(const std::string& out_dir,
                                                     const std::vector<ReplayResult>& runs,
                                                     const std::vector<Report>& reports,
                                                     size_t detail_run) {
  namespace fs = std::filesystem;
  // Absolute: gnuplot runs in `dir` and writes the PNGs by these paths.
  const std::string dir = fs::absolute(out_dir).string();
  fs::create_directories(dir);
  std::vector<std::string> pngs;
  std::string script =
      "set terminal pngcairo size 960,540 font ',10'\nset grid\nset key outside right\n";
  // 1. Attainment vs rate scale.
  if (!reports.empty()) AddAttainmentPlot(dir, reports, &script, &pngs);
  // 2. Latency CDFs and 3. timeline, from one run.
  if (detail_run < runs.size()) {
    AddLatencyCdfPlot(dir, runs[detail_run], &script, &pngs);
    AddTimelinePlot(dir, runs[detail_run], &script, &pngs);
  }
  if (auto st = RunGnuplot(dir, script, "plots.gp"); !st.ok()) return st;
  return pngs;
}

absl::StatusOr<std::string> RenderComparePlot(const std::string& out_dir,
                                              const std::vector<std::string>& names,
                                              const std::vector<std::vector<Report>>& reports) {
  namespace fs = std::filesystem;
  // Absolute: gnuplot runs in `dir` and writes the PNGs by these paths.
  const std::string dir = fs::absolute(out_dir).string();
  fs::create_directories(dir);
  std::string plot;
  {
    // One data block per config: rate_scale, TTFT %, valid (1/0).
    std::ofstream dat(fs::path(dir) / "compare.dat");
    for (size_t c = 0; c < reports.size() && c < names.size(); ++c) {
      std::vector<const Report*> sorted;
      for (const auto& r : reports[c]) sorted.push_back(&r);
      std::sort(sorted.begin(), sorted.end(),
                [](const Report* a, const Report* b) { return a->rate_scale < b->rate_scale; });
      dat << "# " << names[c] << "\n";
      for (const Report* r : sorted) {
        dat << absl::StrFormat("%g %g %d\n", r->rate_scale, 100 * r->total.ttft_attainment,
                               r->valid ? 1 : 0);
      }
      dat << "\n\n";
      plot += absl::StrCat(
          c ? ", " : "", "'compare.dat' index ", c, " using 1:2 with linespoints lw 2 pt 7 lc ",
          c + 1, " title ", Quote(names[c]), ", '' index ", c,
          " using 1:($3 == 0 ? $2 : 1/0) with points pt 6 ps 2 lc ", c + 1, " notitle");
    }
  }
  if (plot.empty()) return absl::FailedPreconditionError("no runs to plot");
  const std::string png = (fs::path(dir) / "compare.png").string();
  const std::string script = absl::StrCat(
      "set terminal pngcairo size 960,540 font ',10'\nset grid\nset key outside right\n",
      "set output ", Quote(png), "\n",
      "set title 'TTFT attainment vs rate scale (open circles: invalid, client lagged)'\n",
      "set xlabel 'rate scale'\nset ylabel 'TTFT attainment (%)'\nset yrange [0:105]\n",
      "set logscale x 2\nplot ", plot, ", 99 with lines dt 3 lc rgb 'red' title '99%'\n");
  if (auto st = RunGnuplot(dir, script, "compare.gp"); !st.ok()) return st;
  return png;
}

absl::StatusOr<std::string> RenderSweepPlot(const std::string& out_dir, const SweepTable& table,
                                            double target) {
  namespace fs = std::filesystem;
  const std::string dir = fs::absolute(out_dir).string();
  fs::create_directories(dir);
  std::string plot;
  {
    // One data block per policy: GPUs, TTFT %, TPOT %.
    std::ofstream dat(fs::path(dir) / "sweep.dat");
    for (size_t p = 0; p < table.attainment.size() && p < table.policies.size(); ++p) {
      dat << "# " << table.policies[p] << "\n";
      for (size_t g = 0; g < table.attainment[p].size() && g < table.gpus.size(); ++g) {
        dat << absl::StrFormat("%d %g %g\n", table.gpus[g], 100 * table.attainment[p][g].first,
                               100 * table.attainment[p][g].second);
      }
      dat << "\n\n";
      plot += absl::StrCat(p ? ", " : "", "'sweep.dat' index ", p,
                           " using 1:2 with linespoints lw 2 pt 7 lc ", p + 1, " title ",
                           Quote(table.policies[p] + " TTFT"), ", '' index ", p,
                           " using 1:3 with linespoints dt 2 pt 6 lc ", p + 1, " title ",
                           Quote(table.policies[p] + " TPOT"));
    }
  }
  if (plot.empty()) return absl::FailedPreconditionError("no runs to plot");
  const std::string png = (fs::path(dir) / "sweep.png").string();
  const std::string script = absl::StrCat(
      "set terminal pngcairo size 960,540 font ',10'\nset grid\nset key outside right\n",
      "set output ", Quote(png), "\n", "set title 'SLO attainment vs GPUs (simulated)'\n",
      "set xlabel 'GPUs'\nset ylabel 'attainment (%)'\nset yrange [0:105]\n",
      "set logscale x 2\nplot ", plot, ", ", 100 * target,
      " with lines dt 3 lc rgb 'red' title 'target'\n");
  if (auto st = RunGnuplot(dir, script, "sweep.gp"); !st.ok()) return st;
  return png;
}

}  // namespace ballast::bench
