#include "memory/remap_plan.h"

#include <algorithm>
#include <numeric>
#include <tuple>

namespace ballast::memory {

std::vector<int> StreamingPlan::Lent() const {
  if (slots <= 0 || static_cast<int>(streamed.size()) <= slots) return {};
  return std::vector<int>(streamed.begin() + slots, streamed.end());
}

std::vector<int> UniformLayers(int n, int m) {
  std::vector<int> out;
  if (m <= 0 || n <= 0 || m > n) return out;
  out.reserve(static_cast<size_t>(m));
  for (int k = 0; k < m; ++k) {
    out.push_back(static_cast<int>(static_cast<int64_t>(k) * n / m));
  }
  return out;
}

namespace {

// Whether every copy into a slot fits in the compute between the slot's
// last reader and its next one: streamed layer k's slot next holds layer
// k + slots, and the copy runs while the layers strictly between them
// compute. Past the last streamed layers the slots reload their home
// layers for the next pass, and those copies must end within this pass:
// a step joins its copies before it ends (the CUDA backend's graphs
// capture them), so they have only the layers left in the pass.
bool EveryCopyHides(int n, int m, int slots, double t_transfer, double t_compute) {
  const std::vector<int> l = UniformLayers(n, m);
  for (int k = 0; k < m; ++k) {
    const int next = k + slots < m ? l[k + slots] : n;
    if (t_transfer > t_compute * (next - l[k] - 1)) return false;
  }
  return true;
}

}  // namespace

int SlotsFor(int n, int alpha, double t_transfer, double t_compute) {
  if (alpha <= 0 || n <= 0) return 0;
  for (int slots = 1; slots <= 2; ++slots) {
    const int m = alpha + slots;
    if (m > n) return 0;
    // Mirage eq. 4 (one slot) and eq. 5 (two), then the exact per-copy
    // check: the equations average the gaps, but m rarely divides n, and
    // the shortest gap is the one that stalls.
    const bool mirage =
        slots == 1 ? t_transfer * m <= t_compute * (n - m) : t_transfer * m <= t_compute * n;
    if (mirage && EveryCopyHides(n, m, slots, t_transfer, t_compute)) return slots;
  }
  return 0;
}

int MaxAlpha(int n, double t_transfer, double t_compute, int cap) {
  // Both constraints only tighten as α grows, so scan down from the cap.
  for (int a = std::min(cap, n); a > 0; --a) {
    if (SlotsFor(n, a, t_transfer, t_compute) > 0) return a;
  }
  return 0;
}

StreamingPlan PlanStreaming(int n, int alpha, double t_transfer, double t_compute) {
  StreamingPlan p;
  const int slots = SlotsFor(n, alpha, t_transfer, t_compute);
  if (slots == 0) return p;
  p.alpha = alpha;
  p.slots = slots;
  p.streamed = UniformLayers(n, alpha + slots);
  return p;
}

int CopiesPerStep(const StreamingPlan& plan) {
  return plan.alpha <= 0 ? 0 : plan.alpha + std::min(plan.alpha, plan.slots);
}

double LinkShare(int n, const StreamingPlan& plan, double t_transfer, double t_compute) {
  const int copies = CopiesPerStep(plan);
  if (copies == 0 || t_transfer <= 0) return 0;
  if (n <= 0 || t_compute <= 0) return 0;  // unknown compute: not estimated
  return copies * t_transfer / (n * t_compute);
}

double SharedTransfer(double t_transfer, double others) {
  if (others >= 1) return -1;
  return t_transfer / (1 - std::max(0.0, others));
}

std::vector<size_t> DonorOrder(const std::vector<RemapCandidate>& models) {
  std::vector<size_t> order(models.size());
  std::iota(order.begin(), order.end(), size_t{0});
  auto key = [&](size_t i) {
    const RemapCandidate& m = models[i];
    return std::make_tuple(m.active, m.priority, -m.last_active, m.owner);
  };
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return key(a) < key(b); });
  return order;
}

std::vector<int> PlanRemap(const std::vector<RemapCandidate>& models, int64_t shortfall_bytes) {
  std::vector<int> alpha(models.size());
  for (size_t i = 0; i < models.size(); ++i) alpha[i] = models[i].alpha;
  int64_t covered = 0;
  for (size_t i : DonorOrder(models)) {
    const RemapCandidate& m = models[i];
    if (m.layer_bytes <= 0) continue;
    while (covered < shortfall_bytes && alpha[i] < m.alpha_cap) {
      ++alpha[i];
      covered += m.layer_bytes;
    }
  }
  return alpha;
}

int RevertNext(const std::vector<RemapCandidate>& models) {
  const std::vector<size_t> order = DonorOrder(models);
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    if (models[*it].alpha > 0) return static_cast<int>(*it);
  }
  return -1;
}

bool StallCorrection::Observe(double stall_share) {
  shares += std::clamp(stall_share, 0.0, 1.0);
  if (++steps < kWindow) return false;
  const double mean = shares / steps;
  Restart();
  const double was = factor;
  if (mean > kHigh) {
    factor = std::max(kMin, factor * (1 - mean));
  } else if (mean < kLow) {
    factor = std::min(1.0, factor * kRecover);
  }
  return factor != was;
}

int64_t LendableBytes(const std::vector<RemapCandidate>& models) {
  int64_t bytes = 0;
  for (const RemapCandidate& m : models) {
    bytes += std::max(0, m.alpha_cap - m.alpha) * std::max<int64_t>(0, m.layer_bytes);
  }
  return bytes;
}

}  // namespace ballast::memory
