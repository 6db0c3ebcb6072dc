// ScaleSearch: finds, in few runs, the highest rate scale at which a
// configuration still meets its target (`bench compare --search`: 99% TTFT
// attainment). A fixed grid either wastes runs far from the limit or leaves
// it coarse (a [4x, 16x) bracket says little about a ratio); each run on a
// GPU costs a server start and a warm-up, so the search bisects the bracket
// geometrically instead.
//
// The search assumes attainment falls as the rate rises (a run that meets
// the target at scale k would meet it below k). It starts at the geometric
// middle of [lo, hi], halves the bracket [highest met, lowest missed] in
// log space after each run, and probes lo or hi themselves only when every
// run so far landed on one side. It stops after `max_runs` runs, when the
// bracket is narrower than `precision` (hi/lo), or when lo is missed or hi
// met (the limit lies outside the range). Scales are rounded to two
// significant digits, so result files get readable names.
//
// Thread safety: none; one search per configuration, driven by one thread.
#pragma once

#include <limits>
#include <optional>

#include "absl/status/statusor.h"

namespace ballast::bench {

struct ScaleSearchOptions {
  double lo = 1;     // lowest scale to consider (> 0)
  double hi = 64;    // highest scale to consider (> lo)
  int max_runs = 6;  // runs at most (>= 1)
  // Stop once lowest missed / highest met <= precision (> 1). Default 1.1:
  // the limit known to within 10%.
  double precision = 1.1;
};

class ScaleSearch {
 public:
  static absl::StatusOr<ScaleSearch> Create(const ScaleSearchOptions& o);

  // The next scale to run, or nullopt when the search is done.
  std::optional<double> Next() const;
  // Records the outcome of a run at `scale` (normally the last Next()).
  void Record(double scale, bool met);

  // Highest scale that met the target (0: none did).
  double highest_met() const { return met_; }
  // Lowest scale above highest_met() that missed it (+inf: none did).
  double lowest_missed() const { return missed_; }
  int runs() const { return runs_; }

 private:
  explicit ScaleSearch(const ScaleSearchOptions& o) : o_(o) {}

  ScaleSearchOptions o_;
  double met_ = 0;
  double missed_ = std::numeric_limits<double>::infinity();
  bool lo_run_ = false, hi_run_ = false;
  int runs_ = 0;
};

// `x` rounded to `digits` significant digits.
double RoundSignificant(double x, int digits);

}  // namespace ballast::bench
