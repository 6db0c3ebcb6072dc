#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace ballast::engine {
namespace {

// Lowest id among the largest values.
int Argmax(const float* x, int n) { return static_cast<int>(std::max_element(x, x + n) - x); }

// The kept candidates of rules 3-5 with their unnormalised weights
// exp(z - z_max), in the order the draw scans them.
struct Kept {
  std::vector<int> ids;
  std::vector<double> w;
  double total = 0.0;
};

// Rule 3 and 4 on the candidate ids: the top-k largest z (lower id first
// on ties), then those with z >= z_floor.
std::vector<int> TopKMinP(const float* logits, int vocab, int top_k, double inv_t, double z_floor) {
  std::vector<int> ids;
  if (top_k > 0 && top_k < vocab) {
    ids.resize(vocab);
    for (int i = 0; i < vocab; ++i) ids[i] = i;
    auto by_logit = [&](int a, int b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    };
    std::nth_element(ids.begin(), ids.begin() + (top_k - 1), ids.end(), by_logit);
    ids.resize(top_k);
    ids.erase(
        std::remove_if(ids.begin(), ids.end(), [&](int i) { return logits[i] * inv_t < z_floor; }),
        ids.end());
    std::sort(ids.begin(), ids.end());
    return ids;
  }
  ids.reserve(vocab);
  for (int i = 0; i < vocab; ++i) {
    if (logits[i] * inv_t >= z_floor) ids.push_back(i);
  }
  return ids;
}

// Rule 5's top-p cut on `k` (ids ascending). The kept prefix is found by
// quickselect on the mass (expected linear time): halves of the remaining
// range are split by weight, the heavier half taken whole while it falls
// short of the mass still wanted; only the last small range is sorted.
void CutTopP(double top_p, Kept* k) {
  const size_t n = k->ids.size();
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  // Ids ascend with the index, so the index breaks ties as the id does.
  auto by_weight = [&](size_t a, size_t b) {
    return k->w[a] > k->w[b] || (k->w[a] == k->w[b] && a < b);
  };
  auto mass = [&](size_t from, size_t to) {
    double m = 0.0;
    for (size_t j = from; j < to; ++j) m += k->w[order[j]];
    return m;
  };
  // order[0, lo) is kept (each heavier than all of order[lo, n)); the cut
  // lies in (lo, hi].
  double need = top_p * k->total;
  size_t lo = 0, hi = n;
  while (hi - lo > 64) {
    const size_t mid = lo + (hi - lo) / 2;
    std::nth_element(order.begin() + lo, order.begin() + mid, order.begin() + hi, by_weight);
    const double m = mass(lo, mid);
    if (m >= need) {
      hi = mid;
    } else {
      need -= m;
      lo = mid;
    }
  }
  std::sort(order.begin() + lo, order.begin() + hi, by_weight);
  size_t keep = hi;
  for (size_t j = lo; j < hi; ++j) {
    need -= k->w[order[j]];
    if (need <= 0.0) {
      keep = j + 1;
      break;
    }
  }
  Kept out;
  out.ids.reserve(keep);
  out.w.reserve(keep);
  for (size_t j = 0; j < keep; ++j) {
    out.ids.push_back(k->ids[order[j]]);
    out.w.push_back(k->w[order[j]]);
    out.total += k->w[order[j]];
  }
  *k = std::move(out);
}

}  // namespace

PenaltyState::PenaltyState(absl::Span<const int> prompt, bool track_prompt) {
  if (!track_prompt) return;
  std::vector<int> ids(prompt.begin(), prompt.end());
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  entries_.reserve(ids.size());
  for (int id : ids) entries_.push_back({id, 0, 1});
}

void PenaltyState::AddOutput(int token) {
  auto it = std::lower_bound(entries_.begin(), entries_.end(), token,
                             [](const PenaltyEntry& e, int t) { return e.token < t; });
  if (it != entries_.end() && it->token == token) {
    ++it->output_count;
  } else {
    entries_.insert(it, {token, 1, 0});
  }
}

void ApplyPenalties(float* logits, int vocab, const SamplingOptions& opts,
                    absl::Span<const PenaltyEntry> penalties) {
  const float r = opts.repetition_penalty;
  for (const PenaltyEntry& e : penalties) {
    if (e.token < 0 || e.token >= vocab) continue;
    float l = logits[e.token];
    if (r != 1.0f && (e.in_prompt != 0 || e.output_count > 0)) l = l > 0.0f ? l / r : l * r;
    if (e.output_count > 0) {
      // Two roundings, as the CUDA kernel does them (no fused multiply-add).
      const float pen = opts.frequency_penalty * static_cast<float>(e.output_count);
      l -= pen + opts.presence_penalty;
    }
    logits[e.token] = l;
  }
}

void ComputeLogprobs(const float* raw_logits, int vocab, int chosen, int top_logprobs,
                     TokenLogprobs* out) {
  const double mx = raw_logits[Argmax(raw_logits, vocab)];
  double sum = 0.0;
  for (int i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(raw_logits[i]) - mx);
  const double lse = mx + std::log(sum);
  out->logprob = static_cast<float>(raw_logits[chosen] - lse);
  const int n = std::clamp(std::min(top_logprobs, kMaxTopLogprobs), 0, vocab);
  // One pass keeping the n best (descending value, then ascending id).
  std::vector<int> best;
  best.reserve(n + 1);
  auto better = [&](int a, int b) {
    return raw_logits[a] > raw_logits[b] || (raw_logits[a] == raw_logits[b] && a < b);
  };
  for (int i = 0; i < vocab && n > 0; ++i) {
    if (static_cast<int>(best.size()) == n && !better(i, best.back())) continue;
    best.insert(std::upper_bound(best.begin(), best.end(), i, better), i);
    if (static_cast<int>(best.size()) > n) best.pop_back();
  }
  out->top.clear();
  for (int id : best) out->top.push_back({id, static_cast<float>(raw_logits[id] - lse)});
}

int SampleToken(const float* logits, int vocab, const SamplingOptions& opts, std::mt19937_64& rng) {
  const int argmax = Argmax(logits, vocab);
  if (opts.temperature <= 0.0f) return argmax;
  const double inv_t = 1.0 / opts.temperature;
  const double z_max = logits[argmax] * inv_t;
  const double z_floor = opts.min_p > 0.0f ? z_max + std::log(static_cast<double>(opts.min_p))
                                           : -std::numeric_limits<double>::infinity();
  Kept k;
  k.ids = TopKMinP(logits, vocab, opts.top_k, inv_t, z_floor);
  k.w.resize(k.ids.size());
  for (size_t j = 0; j < k.ids.size(); ++j) {
    k.w[j] = std::exp(logits[k.ids[j]] * inv_t - z_max);
    k.total += k.w[j];
  }
  if (opts.top_p > 0.0f && opts.top_p < 1.0f) CutTopP(opts.top_p, &k);
  if (k.ids.empty()) return argmax;  // not reached: the argmax is always kept
  std::uniform_real_distribution<double> u(0.0, k.total);
  double r = u(rng);
  for (size_t j = 0; j < k.ids.size(); ++j) {
    r -= k.w[j];
    if (r < 0.0) return k.ids[j];
  }
  return k.ids.back();
}

int SampleToken(const float* logits, int vocab, const SamplingOptions& opts,
                absl::Span<const PenaltyEntry> penalties, std::mt19937_64& rng,
                TokenLogprobs* logprobs) {
  int id;
  if (opts.has_penalties() && !penalties.empty()) {
    std::vector<float> row(logits, logits + vocab);
    ApplyPenalties(row.data(), vocab, opts, penalties);
    id = SampleToken(row.data(), vocab, opts, rng);
  } else {
    id = SampleToken(logits, vocab, opts, rng);
  }
  if (logprobs != nullptr && opts.top_logprobs >= 0) {
    ComputeLogprobs(logits, vocab, id, opts.top_logprobs, logprobs);
  }
  return id;
}

}  // namespace ballast::engine
