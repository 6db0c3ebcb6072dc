// The sampler (engine/sampler.h) against hand-computed values and against
// an independent, brute-force statement of its rule: penalties (HF's
// RepetitionPenaltyLogitsProcessor, OpenAI's frequency/presence formula),
// min-p, top-k, top-p, the draw's distribution, log-probabilities and the
// PenaltyState bookkeeping.
#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace ballast::engine {
namespace {

SamplingOptions Opts(float temperature, float top_p = 1.0f, int top_k = 0, float min_p = 0.0f) {
  SamplingOptions o;
  o.temperature = temperature;
  o.top_p = top_p;
  o.top_k = top_k;
  o.min_p = min_p;
  return o;
}

std::vector<float> RandomLogits(int vocab, uint64_t seed, float scale = 3.0f) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> n(0.0f, scale);
  std::vector<float> l(vocab);
  for (float& x : l) x = n(g);
  return l;
}

// The rule written plainly, for a small vocabulary: the probability of
// every token (one-hot for greedy).
std::vector<double> ReferenceProbs(std::vector<float> l, const SamplingOptions& o,
                                   const std::vector<PenaltyEntry>& pen) {
  const int V = static_cast<int>(l.size());
  for (const PenaltyEntry& e : pen) {  // HF: score < 0 ? score * r : score / r
    float& x = l[e.token];
    const float r = o.repetition_penalty;
    if (e.in_prompt || e.output_count > 0) x = x < 0 ? x * r : x / r;
    if (e.output_count > 0) {  // OpenAI: mu - c * alpha_frequency - (c > 0) * alpha_presence
      const float f = o.frequency_penalty * static_cast<float>(e.output_count);
      x -= f + o.presence_penalty;
    }
  }
  std::vector<double> p(V, 0.0);
  std::vector<int> order(V);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return l[a] > l[b]; });
  if (o.temperature <= 0) {
    p[order[0]] = 1.0;
    return p;
  }
  int keep = (o.top_k > 0 && o.top_k < V) ? o.top_k : V;
  std::vector<double> z(V);
  for (int i = 0; i < V; ++i) z[i] = l[i] / static_cast<double>(o.temperature);
  const double zmax = z[order[0]];
  std::vector<int> kept;
  for (int j = 0; j < keep; ++j) {
    const int id = order[j];
    if (o.min_p > 0 && std::exp(z[id] - zmax) < o.min_p) continue;
    kept.push_back(id);
  }
  double sum = 0;
  for (int id : kept) sum += std::exp(z[id] - zmax);
  if (o.top_p > 0 && o.top_p < 1) {
    double mass = 0;
    size_t n = 0;
    while (n < kept.size()) {
      mass += std::exp(z[kept[n++]] - zmax) / sum;
      if (mass >= o.top_p) break;
    }
    kept.resize(n);
    sum = 0;
    for (int id : kept) sum += std::exp(z[id] - zmax);
  }
  for (int id : kept) p[id] = std::exp(z[id] - zmax) / sum;
  return p;
}

// Draws `n` tokens and checks every token's frequency against `want`
// (zero-probability tokens must never come).
void ExpectFrequencies(const std::vector<float>& l, const SamplingOptions& o,
                       const std::vector<PenaltyEntry>& pen, int n, uint64_t seed) {
  const std::vector<double> want = ReferenceProbs(l, o, pen);
  std::vector<int> count(l.size(), 0);
  std::mt19937_64 rng(seed);
  for (int i = 0; i < n; ++i) {
    ++count[SampleToken(l.data(), static_cast<int>(l.size()), o, pen, rng, nullptr)];
  }
  for (size_t t = 0; t < l.size(); ++t) {
    const double p = want[t], f = count[t] / static_cast<double>(n);
    if (p == 0.0) {
      EXPECT_EQ(count[t], 0) << "token " << t << " is outside the kept set";
    } else {
      EXPECT_NEAR(f, p, 5 * std::sqrt(p * (1 - p) / n) + 1.0 / n) << "token " << t;
    }
  }
}

TEST(PenaltyState, KeepsDistinctSortedTokensAndOutputCounts) {
  const std::vector<int> prompt = {5, 3, 5, 9};
  EXPECT_TRUE(PenaltyState(prompt, /*track_prompt=*/false).entries().empty());
  PenaltyState s(prompt, /*track_prompt=*/true);
  for (int t : {5, 7, 7, 1}) s.AddOutput(t);
  const std::vector<std::vector<int>> want = {
      {1, 1, 0}, {3, 0, 1}, {5, 1, 1}, {7, 2, 0}, {9, 0, 1}};
  ASSERT_EQ(s.entries().size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    const PenaltyEntry& e = s.entries()[i];
    EXPECT_EQ((std::vector<int>{e.token, e.output_count, e.in_prompt}), want[i]) << i;
  }
}

TEST(PenaltyState, MatchesAMapOverRandomOutputs) {
  std::mt19937_64 g(7);
  std::vector<int> prompt(50);
  for (int& t : prompt) t = static_cast<int>(g() % 300);
  PenaltyState s(prompt, true);
  std::map<int, std::pair<int, int>> ref;  // token -> (count, in prompt)
  for (int t : prompt) ref[t] = {0, 1};
  for (int i = 0; i < 2000; ++i) {
    const int t = static_cast<int>(g() % 300);
    s.AddOutput(t);
    ++ref[t].first;
  }
  ASSERT_EQ(s.entries().size(), ref.size());
  size_t i = 0;
  for (const auto& [tok, v] : ref) {
    const PenaltyEntry& e = s.entries()[i++];
    EXPECT_EQ(e.token, tok);
    EXPECT_EQ(e.output_count, v.first);
    EXPECT_EQ(e.in_prompt, v.second);
  }
}

TEST(Penalties, MatchHandComputedValues) {
  // Repetition 2 (HF), frequency 0.5, presence 0.25 (OpenAI).
  SamplingOptions o;
  o.repetition_penalty = 2.0f;
  o.frequency_penalty = 0.5f;
  o.presence_penalty = 0.25f;
  float l[] = {2.0f, -1.0f, 0.5f, 3.0f, -2.0f, 1.0f};
  const std::vector<PenaltyEntry> pen = {
      {0, 0, 1},   // prompt only: 2 / 2
      {1, 2, 0},   // generated twice: -1 * 2 - (0.5 * 2 + 0.25)
      {3, 1, 1},   // both: 3 / 2 - (0.5 + 0.25)
      {4, 0, 1},   // prompt only, negative: -2 * 2
      {99, 3, 1},  // outside the vocabulary: ignored
  };
  ApplyPenalties(l, 6, o, pen);
  const float want[] = {1.0f, -3.25f, 0.5f, 0.75f, -4.0f, 1.0f};
  for (int i = 0; i < 6; ++i) EXPECT_FLOAT_EQ(l[i], want[i]) << i;

  // OpenAI alone: prompt tokens are untouched, negative penalties reward.
  SamplingOptions f;
  f.frequency_penalty = -1.0f;
  f.presence_penalty = 0.5f;
  float m[] = {1.0f, 1.0f, 1.0f};
  ApplyPenalties(m, 3, f, std::vector<PenaltyEntry>{{0, 0, 1}, {2, 3, 0}});
  EXPECT_FLOAT_EQ(m[0], 1.0f);
  EXPECT_FLOAT_EQ(m[1], 1.0f);
  EXPECT_FLOAT_EQ(m[2], 1.0f + 3.0f - 0.5f);
}

TEST(Penalties, GreedyPicksTheArgmaxOfPenalisedLogits) {
  const float l[] = {1.0f, 3.0f, 2.9f, 2.0f};
  std::mt19937_64 rng(1);
  SamplingOptions o;
  EXPECT_EQ(SampleToken(l, 4, o, {}, rng, nullptr), 1);
  o.frequency_penalty = 0.5f;  // 3 - 0.5 < 2.9
  EXPECT_EQ(SampleToken(l, 4, o, std::vector<PenaltyEntry>{{1, 1, 0}}, rng, nullptr), 2);
  o = {};
  o.repetition_penalty = 1.2f;  // 3 / 1.2 = 2.5 < 2.9; the prompt counts
  EXPECT_EQ(SampleToken(l, 4, o, std::vector<PenaltyEntry>{{1, 0, 1}}, rng, nullptr), 2);
  o = {};
  o.presence_penalty = 1.0f;  // {1, 2, 0.9, 2}: tokens 1 and 3 tie, 1 wins
  EXPECT_EQ(SampleToken(l, 4, o, std::vector<PenaltyEntry>{{1, 1, 0}, {2, 5, 0}}, rng, nullptr), 1);
  // Ties after penalties go to the lowest id.
  const float t[] = {2.0f, 3.0f};
  o = {};
  o.presence_penalty = 1.0f;
  EXPECT_EQ(SampleToken(t, 2, o, std::vector<PenaltyEntry>{{1, 1, 0}}, rng, nullptr), 0);
}

TEST(Sampler, MinPKeepsTokensWithinTheRatioOfTheLikeliest) {
  // p proportional to 8:4:2:1:0.5; min_p 0.2 keeps ratios 1, 0.5 and 0.25.
  std::vector<float> l;
  for (double w : {8.0, 4.0, 2.0, 1.0, 0.5}) l.push_back(static_cast<float>(std::log(w)));
  const std::vector<double> p = ReferenceProbs(l, Opts(1.0f, 1.0f, 0, 0.2f), {});
  EXPECT_NEAR(p[0], 8.0 / 14, 1e-6);
  EXPECT_NEAR(p[2], 2.0 / 14, 1e-6);
  EXPECT_EQ(p[3], 0.0);
  ExpectFrequencies(l, Opts(1.0f, 1.0f, 0, 0.2f), {}, 20000, 5);
  // Temperature 0.5 squares the ratios: 1, 0.25, 1/16 ...: two are kept.
  EXPECT_EQ(ReferenceProbs(l, Opts(0.5f, 1.0f, 0, 0.2f), {})[2], 0.0);
  ExpectFrequencies(l, Opts(0.5f, 1.0f, 0, 0.2f), {}, 20000, 6);
}

TEST(Sampler, DistributionFollowsTheRuleForEveryOptionMix) {
  const std::vector<float> l = RandomLogits(40, 11, 1.5f);
  const std::vector<PenaltyEntry> pen = {{2, 0, 1}, {5, 3, 0}, {17, 1, 1}, {30, 2, 1}};
  SamplingOptions penalised = Opts(0.8f, 0.9f, 25, 0.02f);
  penalised.repetition_penalty = 1.3f;
  penalised.frequency_penalty = 0.4f;
  penalised.presence_penalty = 0.3f;
  const SamplingOptions cases[] = {
      Opts(1.0f),
      Opts(0.7f, 1.0f, 8),
      Opts(1.3f, 0.8f),
      Opts(1.0f, 1.0f, 0, 0.1f),
      Opts(0.9f, 0.6f, 12, 0.05f),
      penalised,
  };
  uint64_t seed = 100;
  for (const SamplingOptions& o : cases) {
    SCOPED_TRACE(::testing::Message() << "T " << o.temperature << " top_p " << o.top_p << " top_k "
                                      << o.top_k << " min_p " << o.min_p);
    ExpectFrequencies(l, o, pen, 30000, ++seed);
  }
}

TEST(Sampler, LargeVocabularyKeptSetsMatchTheReference) {
  // A 152k-entry row (Qwen2's vocabulary): top-p alone and top-k + min-p.
  const std::vector<float> l = RandomLogits(152064, 3, 2.5f);
  for (const SamplingOptions& o : {Opts(1.0f, 0.5f), Opts(0.7f, 1.0f, 50, 0.1f)}) {
    const std::vector<double> p = ReferenceProbs(l, o, {});
    std::mt19937_64 rng(9);
    for (int i = 0; i < 200; ++i) {
      const int t = SampleToken(l.data(), static_cast<int>(l.size()), o, rng);
      ASSERT_GT(p[t], 0.0) << "token " << t;
    }
  }
}

TEST(Sampler, SixArgumentFormWithoutPenaltiesDrawsAsTheFourArgumentForm) {
  const std::vector<float> l = RandomLogits(64, 2);
  const SamplingOptions o = Opts(0.9f, 0.95f, 30, 0.01f);
  std::mt19937_64 a(77), b(77);
  for (int i = 0; i < 500; ++i) {
    EXPECT_EQ(SampleToken(l.data(), 64, o, {}, a, nullptr), SampleToken(l.data(), 64, o, b));
  }
}

// log_softmax in long double, straight from the definition.
std::vector<double> LogSoftmax(const std::vector<float>& l) {
  long double sum = 0;
  for (float x : l) sum += std::exp(static_cast<long double>(x));
  std::vector<double> out;
  for (float x : l) out.push_back(static_cast<double>(x - std::log(sum)));
  return out;
}

TEST(Logprobs, MatchLogSoftmaxOfTheRawLogitsWithSortedAlternatives) {
  std::vector<float> l = RandomLogits(1000, 21);
  l[10] = l[20] = l[30] = 20.0f;  // a three-way tie at the top: ids ascend
  const std::vector<double> ls = LogSoftmax(l);
  TokenLogprobs out;
  ComputeLogprobs(l.data(), 1000, 123, 5, &out);
  EXPECT_NEAR(out.logprob, ls[123], 1e-5);
  std::vector<int> order(1000);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return l[a] > l[b]; });
  ASSERT_EQ(out.top.size(), 5u);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(out.top[i].id, order[i]) << i;
    EXPECT_NEAR(out.top[i].logprob, ls[order[i]], 1e-5) << i;
  }
  EXPECT_EQ(out.top[0].id, 10);
  EXPECT_EQ(out.top[2].id, 30);
  ComputeLogprobs(l.data(), 1000, 0, 0, &out);
  EXPECT_TRUE(out.top.empty());
  ComputeLogprobs(l.data(), 1000, 0, 50, &out);  // capped at kMaxTopLogprobs
  EXPECT_EQ(out.top.size(), static_cast<size_t>(kMaxTopLogprobs));
  ComputeLogprobs(l.data(), 3, 0, 20, &out);  // and at the vocabulary
  EXPECT_EQ(out.top.size(), 3u);
}

TEST(Logprobs, AreOfTheRawDistributionNotThePenalisedOne) {
  const std::vector<float> l = RandomLogits(200, 4);
  const std::vector<double> ls = LogSoftmax(l);
  SamplingOptions o = Opts(0.7f, 0.9f);
  o.frequency_penalty = 1.0f;
  o.repetition_penalty = 1.5f;
  o.top_logprobs = 3;
  const std::vector<PenaltyEntry> pen = {{3, 1, 1}, {8, 2, 0}};
  std::mt19937_64 rng(5);
  for (int i = 0; i < 50; ++i) {
    TokenLogprobs out;
    const int id = SampleToken(l.data(), 200, o, pen, rng, &out);
    EXPECT_NEAR(out.logprob, ls[id], 1e-5);
    ASSERT_EQ(out.top.size(), 3u);
    EXPECT_NEAR(out.top[0].logprob, *std::max_element(ls.begin(), ls.end()), 1e-5);
  }
  o.top_logprobs = -1;  // not asked: left alone
  TokenLogprobs untouched;
  untouched.logprob = 42.0f;
  SampleToken(l.data(), 200, o, pen, rng, &untouched);
  EXPECT_EQ(untouched.logprob, 42.0f);
}

}  // namespace
}  // namespace ballast::engine
