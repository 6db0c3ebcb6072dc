#include "bench/scale_search.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace ballast::bench {

double RoundSignificant(double x, int digits) {
  if (x <= 0 || !std::isfinite(x)) return x;
  const double mag = std::pow(10.0, digits - 1 - static_cast<int>(std::floor(std::log10(x))));
  return std::round(x * mag) / mag;
}

absl::StatusOr<ScaleSearch> ScaleSearch::Create(const ScaleSearchOptions& o) {
  if (!(o.lo > 0) || !(o.hi > o.lo) || !std::isfinite(o.hi)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--search: expected 0 < LO < HI, got LO=", o.lo, " HI=", o.hi));
  }
  if (o.max_runs < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--search-runs: expected at least 1, got ", o.max_runs));
  }
  if (!(o.precision > 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("search precision: expected a ratio above 1, got ", o.precision));
  }
  return ScaleSearch(o);
}

std::optional<double> ScaleSearch::Next() const {
  if (runs_ >= o_.max_runs) return std::nullopt;
  if (lo_run_ && met_ == 0) return std::nullopt;      // lo missed: the limit is below the range
  if (hi_run_ && met_ >= o_.hi) return std::nullopt;  // hi met: the limit is above it
  const double a = met_ > 0 ? met_ : o_.lo;
  const double b = std::isfinite(missed_) ? missed_ : o_.hi;
  if (b / a > o_.precision) {
    // Two, then three significant digits; a bracket too narrow for either is done.
    for (int digits = 2; digits <= 3; ++digits) {
      const double x = RoundSignificant(std::sqrt(a * b), digits);
      if (x > a && x < b) return x;
    }
  }
  // The bracket is as narrow as it gets inside [lo, hi]: confirm an edge
  // every run so far fell beyond.
  if (met_ == 0 && !lo_run_) return o_.lo;
  if (!std::isfinite(missed_) && !hi_run_) return o_.hi;
  return std::nullopt;
}

void ScaleSearch::Record(double scale, bool met) {
  ++runs_;
  lo_run_ |= scale <= o_.lo;
  hi_run_ |= scale >= o_.hi;
  if (met) {
    if (scale > met_) met_ = scale;
    if (missed_ <= met_) missed_ = std::numeric_limits<double>::infinity();  // not monotone
  } else if (scale > met_ && scale < missed_) {
    missed_ = scale;
  }
}

}  // namespace ballast::bench
