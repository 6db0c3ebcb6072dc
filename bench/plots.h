// PNG plots of replay results, drawn by gnuplot (Debian's gnuplot-nox):
//   attainment.png  TTFT/TPOT attainment (total and per model) vs rate scale
//   latency_cdf.png TTFT and end-to-end latency CDFs per model
//   timeline.png    requests in flight per model over the replay
//   compare.png     (bench compare) TTFT attainment vs rate scale per config
// Attainment plots carry a dashed line at 99%.
// Data files (*.dat) and the gnuplot script stay beside the PNGs, so a plot
// can be restyled without re-running. Not thread-safe (writes files).
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/replay.h"
#include "bench/report.h"

namespace ballast::bench {

// `runs[i]` and `reports[i]` belong together; CDFs and the timeline use
// runs[detail_run]. Returns the PNG files written; UNAVAILABLE if gnuplot
// is missing or fails.
absl::StatusOr<std::vector<std::string>> RenderPlots(const std::string& dir,
                                                     const std::vector<ReplayResult>& runs,
                                                     const std::vector<Report>& reports,
                                                     size_t detail_run);

// compare.png in `dir`: TTFT attainment vs rate scale, one line per config
// (`reports[c]` belongs to `names[c]`), with the 99% line; invalid runs
// (client lag) are drawn as open points. Returns the PNG path; UNAVAILABLE
// if gnuplot is missing or fails.
absl::StatusOr<std::string> RenderComparePlot(const std::string& dir,
                                              const std::vector<std::string>& names,
                                              const std::vector<std::vector<Report>>& reports);

// A sweep's results (`ballast simulate sweep`): attainment[p][g] =
// {TTFT, TPOT} attainment of policy p at gpus[g].
struct SweepTable {
  std::vector<std::string> policies;
  std::vector<int> gpus;
  std::vector<std::vector<std::pair<double, double>>> attainment;
};

// sweep.png in `dir`: TTFT (solid) and TPOT (dashed) attainment vs GPUs,
// one colour per policy, with the target line. Returns the PNG path;
// UNAVAILABLE if gnuplot is missing or fails.
absl::StatusOr<std::string> RenderSweepPlot(const std::string& dir, const SweepTable& table,
                                            double target);

}  // namespace ballast::bench
