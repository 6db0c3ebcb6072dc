#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace ballast::engine {

int SampleToken(const float* logits, int vocab, const SamplingOptions& opts, std::mt19937_64& rng) {
  if (opts.temperature <= 0.0f) {
    return static_cast<int>(std::max_element(logits, logits + vocab) - logits);
  }
  std::vector<int> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  int keep = vocab;
  if (opts.top_k > 0 && opts.top_k < vocab) keep = opts.top_k;
  // Sort the kept candidates by descending logit (stable: lower id first).
  auto by_logit = [&](int a, int b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  std::partial_sort(order.begin(), order.begin() + keep, order.end(), by_logit);
  order.resize(keep);
  std::vector<double> p(keep);
  const double inv_t = 1.0 / opts.temperature;
  const double max_l = logits[order[0]] * inv_t;
  double sum = 0.0;
  for (int i = 0; i < keep; ++i) {
    p[i] = std::exp(logits[order[i]] * inv_t - max_l);
    sum += p[i];
  }
  for (double& x : p) x /= sum;
  if (opts.top_p > 0.0f && opts.top_p < 1.0f) {
    double mass = 0.0;
    int n = 0;
    while (n < keep) {
      mass += p[n++];
      if (mass >= opts.top_p) break;
    }
    keep = n;
    p.resize(keep);
  }
  const double total = std::accumulate(p.begin(), p.end(), 0.0);
  std::uniform_real_distribution<double> u(0.0, total);
  double r = u(rng);
  for (int i = 0; i < keep; ++i) {
    r -= p[i];
    if (r < 0.0) return order[i];
  }
  return order[keep - 1];
}

}  // namespace ballast::engine
