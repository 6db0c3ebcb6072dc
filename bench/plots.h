// PNG plots of replay results, drawn by gnuplot (Debian's gnuplot-nox):
//   attainment.png  TTFT/TPOT attainment (total and per model) vs rate scale
//   latency_cdf.png TTFT and end-to-end latency CDFs per model
//   timeline.png    requests in flight per model over the replay
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

}  // namespace ballast::bench
