#include "node_manager/prefill_cost_model.h"

#include <algorithm>

namespace ballast::node_manager {

void PrefillCostModel::Record(int tokens, double ms) {
  if (tokens <= 0 || ms < 0) return;
  if (warmup_left_ > 0) {
    --warmup_left_;
    return;
  }
  samples_.emplace_back(tokens, ms);
  while (static_cast<int>(samples_.size()) > window_) samples_.pop_front();
  Fit();
}

void PrefillCostModel::Fit() {
  const double n = static_cast<double>(samples_.size());
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (const auto& [x, y] : samples_) {
    sx += x;
    sy += y;
    sxx += static_cast<double>(x) * x;
    sxy += x * y;
  }
  const double var = n * sxx - sx * sx;
  if (samples_.size() < 4 || var <= 0) {  // too few, or one token count only
    a_ = 0;
    b_ = samples_.size() < 4 ? prior_ : std::max(0.0, sy / sx);
    return;
  }
  b_ = std::max(0.0, (n * sxy - sx * sy) / var);
  a_ = std::max(0.0, (sy - b_ * sx) / n);
}

double PrefillCostModel::PredictMs(int tokens) const { return a_ + b_ * std::max(0, tokens); }

}  // namespace ballast::node_manager
