// EngineModel's fit and predictions (engine_model.h).
#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "sim/engine_model.h"

namespace ballast::sim {
namespace {

constexpr int kK = kFeatures;
// The ridges R the fit tries (engine_model.h): kRidgeStep, 2 kRidgeStep,
// ..., kRidgeMax tokens.
constexpr double kRidgeStep = 32, kRidgeMax = 512;

// Solves a (n x n, row-major) x = b by Gaussian elimination with partial
// pivoting; false if singular.
bool Solve(std::vector<double> a, std::vector<double> b, int n, std::vector<double>* x) {
  for (int c = 0; c < n; ++c) {
    int p = c;
    for (int r = c + 1; r < n; ++r) {
      if (std::fabs(a[r * n + c]) > std::fabs(a[p * n + c])) p = r;
    }
    if (std::fabs(a[p * n + c]) < 1e-12) return false;
    for (int k = 0; k < n; ++k) std::swap(a[c * n + k], a[p * n + k]);
    std::swap(b[c], b[p]);
    for (int r = c + 1; r < n; ++r) {
      const double f = a[r * n + c] / a[c * n + c];
      for (int k = c; k < n; ++k) a[r * n + k] -= f * a[c * n + k];
      b[r] -= f * b[c];
    }
  }
  x->assign(n, 0);
  for (int r = n - 1; r >= 0; --r) {
    double s = b[r];
    for (int k = r + 1; k < n; ++k) s -= a[r * n + k] * (*x)[k];
    (*x)[r] = s / a[r * n + r];
  }
  return true;
}

// Least squares over the columns in `active` of rows (features / t) with
// target 1: the relative error. Columns are scaled to max 1 first.
bool LeastSquares(const std::vector<std::array<double, kK>>& rows, const std::vector<int>& active,
                  std::array<double, kK>* k) {
  const int n = static_cast<int>(active.size());
  std::vector<double> scale(n, 0);
  for (const auto& r : rows) {
    for (int i = 0; i < n; ++i) scale[i] = std::max(scale[i], std::fabs(r[active[i]]));
  }
  std::vector<double> ata(n * n, 0), atb(n, 0);
  for (const auto& r : rows) {
    for (int i = 0; i < n; ++i) {
      const double xi = r[active[i]] / scale[i];
      atb[i] += xi;
      for (int j = 0; j < n; ++j) ata[i * n + j] += xi * r[active[j]] / scale[j];
    }
  }
  std::vector<double> x;
  if (!Solve(ata, atb, n, &x)) return false;
  k->fill(0);
  for (int i = 0; i < n; ++i) (*k)[active[i]] = x[i] / scale[i];
  return true;
}

// A step's HBM-read time (StreamSeconds): its k2 and k3 terms.
double Stream(const std::array<double, kK>& k, const ModelShape& shape, const StepWork& work,
              double ridge) {
  const std::array<double, kK> f = StepFeatures(shape, work, ridge);
  return k[2] * f[2] + k[3] * f[3];
}

// Of a step of t seconds, what steps at the same time overlap
// (OverlappedSeconds): k0 + overlap, at most t less the reads no step
// hides (`unhidden`), never below k0 nor above t.
double Overlapped(double t, double k0, double overlap, double unhidden) {
  return std::min({t, k0 + overlap, std::max(k0, t - unhidden)});
}

// What concurrent steps overlap (OverlapSeconds, OverlappedSeconds): the
// overlap per layer beyond k0, o, and the share s of a step's HBM-read
// time (StreamSeconds) that steps at the same time cannot hide. n copies
// at once take l + n (t - l) a step, t alone, l = min(t, k0 + o layers,
// max(k0, t - s stream)); o and s are the grid point (o by 0.25 us up to
// 200 us, s by 0.01 from 0 up to 1, the first best kept: a share no point
// determines stays 0, no bound) with the least squared relative error
// over the concurrent points. None: o = 0, s = 0.
struct OverlapFit {
  double per_layer_s = 0, stream_share = 0;
};
OverlapFit FitOverlap(const std::vector<ConcurrentPoint>& points, const std::array<double, kK>& k,
                      double ridge) {
  OverlapFit best;
  if (points.empty()) return best;
  std::vector<double> stream;
  for (const ConcurrentPoint& p : points) stream.push_back(Stream(k, p.shape, p.work, ridge));
  double best_error = -1;
  for (int si = 0; si <= 100; ++si) {
    for (int oi = 0; oi <= 800; ++oi) {
      const double share = si / 100.0, per_layer = oi * 0.25e-6;
      double error = 0;
      for (size_t i = 0; i < points.size(); ++i) {
        const ConcurrentPoint& p = points[i];
        const double t = p.alone_seconds;
        const double l = Overlapped(t, k[0], per_layer * p.shape.layers, share * stream[i]);
        const double e = (l + p.copies * (t - l) - p.seconds) / p.seconds;
        error += e * e;
      }
      if (best_error < 0 || error < best_error) {
        best_error = error;
        best = {per_layer, share};
      }
    }
  }
  return best;
}

// Non-negative least squares of `rows` by elimination: drop the most
// negative coefficient and refit until none is negative (a rate cannot be
// < 0). A feature no row has (FP8 KV in a BF16-only calibration) keeps
// its coefficient at 0. False if the rows do not determine the rest.
bool NonNegativeFit(const std::vector<std::array<double, kK>>& rows, std::array<double, kK>* k) {
  std::vector<int> active;
  for (int i = 0; i < kK; ++i) {
    if (std::any_of(rows.begin(), rows.end(), [&](const auto& r) { return r[i] != 0; })) {
      active.push_back(i);
    }
  }
  k->fill(0);
  while (!active.empty()) {
    if (!LeastSquares(rows, active, k)) return false;
    auto worst = std::min_element(active.begin(), active.end(),
                                  [&](int a, int b) { return (*k)[a] < (*k)[b]; });
    if ((*k)[*worst] >= 0) break;
    active.erase(worst);
  }
  return true;
}

// The rows (features / measured seconds) of every point for ridge R; k9's
// feature left out (0) when R < 0.
std::vector<std::array<double, kK>> Rows(const Calibration& c, double ridge) {
  std::vector<std::array<double, kK>> rows;
  for (const CalibrationPoint& p : c.points) {
    std::array<double, kK> f = StepFeatures(p.shape, p.work, std::max(ridge, 0.0));
    if (ridge < 0) f[kRidgeFeature] = 0;
    for (double& x : f) x /= p.seconds;
    rows.push_back(f);
  }
  return rows;
}

// The sum of squared relative errors of `k` over `rows`.
double SquaredError(const std::vector<std::array<double, kK>>& rows,
                    const std::array<double, kK>& k) {
  double sum = 0;
  for (const auto& r : rows) {
    double pred = 0;  // predicted / measured
    for (int i = 0; i < kK; ++i) pred += k[i] * r[i];
    sum += (pred - 1) * (pred - 1);
  }
  return sum;
}

}  // namespace

EngineModel::EngineModel(std::array<double, kFeatures> k, double h2d_bytes_per_s,
                         double activation_ratio, KvLinkRates kv_rates, double overlap_per_layer_s,
                         double ridge_tokens, double stream_share)
    : k_(k),
      h2d_bytes_per_s_(h2d_bytes_per_s),
      activation_ratio_(activation_ratio),
      overlap_per_layer_s_(overlap_per_layer_s),
      stream_share_(stream_share),
      ridge_tokens_(ridge_tokens),
      kv_rates_(kv_rates) {}

absl::StatusOr<EngineModel> EngineModel::Fit(const Calibration& c) {
  const bool prefill = std::any_of(c.points.begin(), c.points.end(), [](const CalibrationPoint& p) {
    return p.work.prefill_tokens > 0;
  });
  if (c.points.size() < kK || !prefill) {
    return absl::InvalidArgumentError(absl::StrCat("calibration of ", c.device, ": needs at least ",
                                                   kK, " measured steps including a prefill (has ",
                                                   c.points.size(), ")"));
  }
  // R on a grid (engine_model.h): the fit with the smallest error. Only
  // ridges below the largest decode-only step measured are tried (above
  // it, only prefills would place R); with none, k9's feature is left out.
  // A ridge at which the features are degenerate is skipped.
  int max_decode = 0;
  for (const CalibrationPoint& p : c.points) {
    if (p.work.prefill_tokens == 0) max_decode = std::max(max_decode, p.work.decode_tokens);
  }
  std::vector<double> ridges;
  for (double r = kRidgeStep; r <= kRidgeMax && r < max_decode; r += kRidgeStep) {
    ridges.push_back(r);
  }
  if (ridges.empty()) ridges.push_back(-1);
  std::array<double, kK> best_k{};
  double best_ridge = 0, best_error = -1;
  for (double ridge : ridges) {
    const auto rows = Rows(c, ridge);
    std::array<double, kK> k{};
    if (!NonNegativeFit(rows, &k)) continue;
    const double error = SquaredError(rows, k);
    if (best_error < 0 || error < best_error) {
      best_k = k;
      best_ridge = std::max(ridge, 0.0);
      best_error = error;
    }
  }
  if (best_error < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("calibration of ", c.device,
                     ": the measured steps do not determine the model "
                     "(vary batch, context and prefill length)"));
  }
  // A ridge term that moves no measured step by 0.1% is rounding: without
  // it R means nothing.
  double ridge_share = 0;
  for (const auto& r : Rows(c, best_ridge))
    ridge_share = std::max(ridge_share, best_k[kRidgeFeature] * r[kRidgeFeature]);
  if (ridge_share < 1e-3) {
    best_k[kRidgeFeature] = 0;
    best_ridge = 0;
  }
  const OverlapFit overlap = FitOverlap(c.concurrent, best_k, best_ridge);
  return EngineModel(best_k, c.h2d_bytes_per_s, c.activation_ratio, c.kv_rates, overlap.per_layer_s,
                     best_ridge, overlap.stream_share);
}

double EngineModel::StepSeconds(const ModelShape& shape, const StepWork& work) const {
  const std::array<double, kK> f = StepFeatures(shape, work, ridge_tokens_);
  double t = 0;
  for (int i = 0; i < kK; ++i) t += k_[i] * f[i];
  return t;
}

double EngineModel::LatencySeconds(const ModelShape& shape) const {
  (void)shape;
  return k_[0];
}

double EngineModel::OverlapSeconds(const ModelShape& shape) const {
  return overlap_per_layer_s_ * shape.layers;
}

double EngineModel::StreamSeconds(const ModelShape& shape, const StepWork& work) const {
  return Stream(k_, shape, work, ridge_tokens_);
}

double EngineModel::OverlappedSeconds(const ModelShape& shape, const StepWork& work, double share,
                                      double step_s) const {
  return Overlapped(step_s, LatencySeconds(shape), share * OverlapSeconds(shape),
                    stream_share_ * StreamSeconds(shape, work));
}

double EngineModel::PrefillSeconds(const ModelShape& shape, int tokens) const {
  return StepSeconds(shape, {0, 0, tokens, PrefillAttentionPairs(tokens, 0)});
}

double EngineModel::ActivationSeconds(const ModelShape& shape) const {
  return static_cast<double>(shape.weight_bytes()) / h2d_bytes_per_s_ * activation_ratio_;
}

double EngineModel::KvLoadSeconds(KvTier tier, int64_t bytes) const {
  const double rate = tier == KvTier::kDram  ? kv_rates_.dram_bytes_per_s
                      : tier == KvTier::kSsd ? kv_rates_.ssd_bytes_per_s
                                             : kv_rates_.peer_bytes_per_s;
  return static_cast<double>(bytes) / rate;
}

}  // namespace ballast::sim
