#include "memory/remap_plan.h"

#include <algorithm>
#include <numeric>
#include <queue>
#include <tuple>

namespace ballast::memory {

std::vector<int> StreamingPlan::Lent() const {
  if (slots <= 0 || static_cast<int>(streamed.size()) <= slots) return {};
  return std::vector<int>(streamed.begin() + slots, streamed.end());
}

std::vector<int> LendOrder(int n) {
  std::vector<int> out;
  if (n <= 0) return out;
  out.reserve(static_cast<size_t>(n));
  out.push_back(0);
  // Gaps (lo, hi) between layers taken, widest first; a gap's middle is
  // the layer farthest from both ends. Among equally wide gaps, the van
  // der Corput order: `key` is the gap's path of halvings (bit d set: the
  // upper half at depth d) read backwards, so each round of halvings
  // spreads over the whole pass rather than filling it from layer 0 up.
  struct Gap {
    int lo, hi;
    uint64_t key;
    int depth;
    int Reach() const { return (hi - lo) / 2; }
    int Mid() const { return lo + Reach(); }
  };
  auto after = [](const Gap& a, const Gap& b) {
    return a.Reach() != b.Reach() ? a.Reach() < b.Reach() : a.key > b.key;
  };
  std::priority_queue<Gap, std::vector<Gap>, decltype(after)> gaps(after);
  gaps.push({0, n, 0, 0});
  while (!gaps.empty()) {
    const Gap g = gaps.top();
    gaps.pop();
    if (g.hi - g.lo < 2) continue;  // no layer inside
    const int mid = g.Mid();
    out.push_back(mid);
    gaps.push({g.lo, mid, g.key, g.depth + 1});
    gaps.push({mid, g.hi, g.key | (uint64_t{1} << g.depth), g.depth + 1});
  }
  return out;
}

namespace {

// The first m of `order` (a LendOrder), ascending.
std::vector<int> FirstOf(const std::vector<int>& order, int m) {
  std::vector<int> out(order.begin(), order.begin() + m);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

std::vector<int> StreamedLayers(int n, int m) {
  if (m <= 0 || n <= 0 || m > n) return {};
  return FirstOf(LendOrder(n), m);
}

namespace {

// Whether a pass over the n layers streaming `l` through `slots` slots
// takes no longer than its compute. The executors' pipeline
// (engine/executor.h): streamed layer k uses slot k % slots; the copy of
// the slot's next layer (k + slots, or past the last streamed layers the
// slot's home layer, for the next pass) starts once layer k is computed
// and the copy before it is done (one copy engine); a layer computes once
// the one before it is done and its weights are in; the pass ends once the
// slots hold their home layers again (a step joins its copies: the CUDA
// backend's graphs capture them). Every pass starts the same way, so one
// pass decides. (Checking each copy against the layers between its slot's
// readers alone misses copies queued behind each other: n = 40, T_T =
// 4 T_c, layers 0, 2, 5, 10, 15, 20, 22, 25, 30, 35 through two slots.)
bool EveryCopyHides(int n, const std::vector<int>& l, int slots, double t_transfer,
                    double t_compute) {
  const int m = static_cast<int>(l.size());
  std::vector<double> loaded(static_cast<size_t>(m), 0.0);
  double t = 0, engine = 0;
  int k = 0;  // the next streamed layer
  for (int layer = 0; layer < n; ++layer) {
    const bool streamed = k < m && l[static_cast<size_t>(k)] == layer;
    if (streamed) t = std::max(t, loaded[static_cast<size_t>(k)]);
    t += t_compute;
    if (!streamed) continue;
    const int next = k + slots < m ? k + slots : k % slots;
    engine = std::max(t, engine) + t_transfer;
    loaded[static_cast<size_t>(next)] = engine;
    ++k;
  }
  for (int s = 0; s < std::min(slots, m); ++s) t = std::max(t, loaded[static_cast<size_t>(s)]);
  return t <= n * t_compute * (1 + 1e-12);
}

// SlotsFor with LendOrder(n) given: MaxAlpha asks for every α.
int SlotsIn(int n, const std::vector<int>& order, int alpha, double t_transfer, double t_compute) {
  if (alpha <= 0 || n <= 0) return 0;
  for (int slots = 1; slots <= 2; ++slots) {
    const int m = alpha + slots;
    if (m > n) return 0;
    // Mirage eq. 4 (one slot) and eq. 5 (two), then the pass itself: the
    // equations average the gaps, but the streamed layers are not evenly
    // spaced, and the copies share one engine.
    const bool mirage =
        slots == 1 ? t_transfer * m <= t_compute * (n - m) : t_transfer * m <= t_compute * n;
    if (mirage && EveryCopyHides(n, FirstOf(order, m), slots, t_transfer, t_compute)) {
      return slots;
    }
  }
  return 0;
}

}  // namespace

int SlotsFor(int n, int alpha, double t_transfer, double t_compute) {
  if (alpha <= 0 || n <= 0) return 0;
  return SlotsIn(n, LendOrder(n), alpha, t_transfer, t_compute);
}

int MaxAlpha(int n, double t_transfer, double t_compute, int cap) {
  // Scanned down from the cap: the largest α whose plan hides its copies.
  const std::vector<int> order = LendOrder(n);
  for (int a = std::min(cap, n); a > 0; --a) {
    if (SlotsIn(n, order, a, t_transfer, t_compute) > 0) return a;
  }
  return 0;
}

StreamingPlan PlanStreaming(int n, int alpha, double t_transfer, double t_compute) {
  StreamingPlan p;
  const int slots = SlotsFor(n, alpha, t_transfer, t_compute);
  if (slots == 0) return p;
  p.alpha = alpha;
  p.slots = slots;
  p.streamed = StreamedLayers(n, alpha + slots);
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
