// The GPU sampler (engine/cuda/sampling_kernels.cu) against the CPU
// reference (engine/sampler.h): greedy with penalties picks exactly the
// CPU's token, log-probabilities match ComputeLogprobs, draws stay in the
// CPU's min-p / top-k / top-p kept set with the CPU's frequencies; and
// through the CudaExecutor, penalties and log-probabilities survive CUDA
// graph replay (and the penalty buffer's growth). Skips without a GPU.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <vector>

#include "engine/cuda/cuda_executor.h"
#include "engine/cuda/kernels.h"
#include "engine/sampler.h"
#include "gtest/gtest.h"
#include "tests/gpu/device_copies.h"
#include "tests/gpu/gpu_harness.h"
#include "tests/unit/engine/test_util.h"

namespace ballast::engine {
namespace {

using cuda::SampleLogprobs;
using cuda::SampleParams;
using cuda::SamplePenalty;

std::vector<float> RandomLogits(int vocab, uint64_t seed, float scale) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> n(0.0f, scale);
  std::vector<float> l(vocab);
  for (float& x : l) x = n(g);
  return l;
}

SampleParams Params(const SamplingOptions& o, uint64_t seed, uint64_t counter) {
  SampleParams p;
  p.temperature = o.temperature;
  p.top_p = o.top_p;
  p.top_k = o.top_k;
  p.min_p = o.min_p;
  p.presence_penalty = o.presence_penalty;
  p.frequency_penalty = o.frequency_penalty;
  p.repetition_penalty = o.repetition_penalty;
  p.top_logprobs = o.top_logprobs;
  p.seed = seed;
  p.counter = counter;
  return p;
}

// One row of a LaunchSample call.
struct Row {
  const std::vector<float>* logits;
  SamplingOptions opts;
  std::vector<PenaltyEntry> penalties;
  uint64_t seed = 1, counter = 0;
};

using testing::ToDevice;
using testing::ToHost;

// Runs LaunchSample over `rows`; returns the tokens and the rows' logprobs.
std::vector<int> Sample(const std::vector<Row>& rows, int vocab,
                        std::vector<SampleLogprobs>* logprobs = nullptr) {
  std::vector<float> logits;
  std::vector<SampleParams> params;
  std::vector<SamplePenalty> pen;
  for (const Row& r : rows) {
    logits.insert(logits.end(), r.logits->begin(), r.logits->end());
    SampleParams p = Params(r.opts, r.seed, r.counter);
    p.penalty_begin = static_cast<int>(pen.size());
    p.penalty_count = static_cast<int>(r.penalties.size());
    for (const PenaltyEntry& e : r.penalties) pen.push_back({e.token, e.output_count, e.in_prompt});
    params.push_back(p);
  }
  const int n = static_cast<int>(rows.size());
  float* d_logits = ToDevice(logits);
  SampleParams* d_params = ToDevice(params);
  SamplePenalty* d_pen = ToDevice(pen);
  int* d_tokens = ToDevice(std::vector<int>(n, -1));
  SampleLogprobs* d_lp = ToDevice(std::vector<SampleLogprobs>(n));
  EXPECT_EQ(cuda::LaunchSample(d_logits, n, vocab, d_params, d_pen, d_tokens, d_lp, nullptr),
            cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<int> tokens = ToHost(d_tokens, n);
  if (logprobs) *logprobs = ToHost(d_lp, n);
  for (void* p :
       {static_cast<void*>(d_logits), static_cast<void*>(d_params), static_cast<void*>(d_pen),
        static_cast<void*>(d_tokens), static_cast<void*>(d_lp)}) {
    cudaFree(p);
  }
  return tokens;
}

// Entries penalising the row's `n` likeliest tokens (each generated at
// least once), and a spread of others with counts and prompt flags that
// vary (some untouched by any penalty); ascending by token.
std::vector<PenaltyEntry> TopPenalties(const std::vector<float>& l, int n, int salt) {
  std::vector<int> order(l.size());
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + n, order.end(),
                    [&](int a, int b) { return l[a] > l[b]; });
  std::map<int, PenaltyEntry> by_token;
  for (int j = salt; j < static_cast<int>(l.size()); j += 97) {
    by_token[j] = {j, (j + salt) % 4, (j + salt) % 3 == 0};
  }
  for (int k = 0; k < n; ++k) by_token[order[k]] = {order[k], 1 + k % 3, k % 2};
  std::vector<PenaltyEntry> out;
  for (const auto& [t, e] : by_token) out.push_back(e);
  return out;
}

// The CPU rule's probabilities (ApplyPenalties, then rules 3-6 written
// plainly); zero outside the kept set.
std::vector<double> CpuProbs(std::vector<float> l, const SamplingOptions& o,
                             const std::vector<PenaltyEntry>& pen) {
  const int V = static_cast<int>(l.size());
  ApplyPenalties(l.data(), V, o, pen);
  std::vector<int> order(V);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return l[a] > l[b]; });
  const int keep = o.top_k > 0 && o.top_k < V ? o.top_k : V;
  const double zmax = l[order[0]] / static_cast<double>(o.temperature);
  std::vector<int> kept;
  std::vector<double> w;
  double sum = 0;
  for (int j = 0; j < keep; ++j) {
    const double e = std::exp(l[order[j]] / static_cast<double>(o.temperature) - zmax);
    if (o.min_p > 0 && e < o.min_p) continue;
    kept.push_back(order[j]);
    w.push_back(e);
    sum += e;
  }
  if (o.top_p > 0 && o.top_p < 1) {
    double mass = 0;
    size_t n = 0;
    while (n < kept.size()) {
      mass += w[n++];
      if (mass >= o.top_p * sum) break;
    }
    kept.resize(n);
    w.resize(n);
    sum = std::accumulate(w.begin(), w.end(), 0.0);
  }
  std::vector<double> p(V, 0.0);
  for (size_t j = 0; j < kept.size(); ++j) p[kept[j]] = w[j] / sum;
  return p;
}

TEST(CudaSampling, GreedyWithPenaltiesEqualsTheCpuReference) {
  BALLAST_SKIP_WITHOUT_GPU();
  constexpr int kVocab = 152064;
  std::vector<std::vector<float>> logits;
  for (int r = 0; r < 12; ++r) logits.push_back(RandomLogits(kVocab, 100 + r, 2.0f + r % 3));
  std::vector<Row> rows;
  int changed = 0;
  for (int r = 0; r < 12; ++r) {
    SamplingOptions o;  // greedy
    o.repetition_penalty = r % 3 == 0 ? 1.0f : 1.1f + 0.2f * (r % 4);
    o.frequency_penalty = r % 2 ? 0.0f : 0.3f * (r % 5);
    o.presence_penalty = r % 4 == 1 ? -0.5f : 0.4f;
    rows.push_back({&logits[r], o, TopPenalties(logits[r], 2 + r, r)});
  }
  const std::vector<int> got = Sample(rows, kVocab);
  for (int r = 0; r < 12; ++r) {
    std::mt19937_64 rng(1);
    const int want =
        SampleToken(logits[r].data(), kVocab, rows[r].opts, rows[r].penalties, rng, nullptr);
    EXPECT_EQ(got[r], want) << "row " << r;
    changed += want != SampleToken(logits[r].data(), kVocab, rows[r].opts, rng);
  }
  EXPECT_GE(changed, 4) << "the penalties should move many rows' argmax";
}

TEST(CudaSampling, LogprobsMatchComputeLogprobs) {
  BALLAST_SKIP_WITHOUT_GPU();
  constexpr int kVocab = 152064;
  std::vector<float> a = RandomLogits(kVocab, 7, 3.0f);
  a[500] = a[40] = a[90000] = 25.0f;  // a tie at the top: ids ascend
  const std::vector<float> b = RandomLogits(kVocab, 8, 1.0f);
  auto opts = [](float t, int top, float rep) {
    SamplingOptions o;
    o.temperature = t;
    o.top_logprobs = top;
    o.repetition_penalty = rep;
    o.frequency_penalty = rep != 1.0f ? 0.5f : 0.0f;
    return o;
  };
  std::vector<Row> rows = {
      {&a, opts(0.0f, 20, 1.0f), {}},
      // 25 / 1.5 - 0.5 c for c = 2, 1, 3: greedy picks 500, off the tie.
      {&a, opts(0.0f, 5, 1.5f), {{40, 2, 1}, {500, 1, 0}, {90000, 3, 1}}},
      {&b, opts(0.9f, 3, 1.2f), TopPenalties(b, 10, 2), 5, 9},
      {&b, opts(1.0f, 0, 1.0f), {}, 6, 1},
      {&b, opts(1.0f, -1, 1.0f), {}, 6, 2},
  };
  std::vector<SampleLogprobs> lp;
  const std::vector<int> got = Sample(rows, kVocab, &lp);
  for (size_t r = 0; r < rows.size(); ++r) {
    SCOPED_TRACE(::testing::Message() << "row " << r);
    if (rows[r].opts.top_logprobs < 0) continue;
    TokenLogprobs want;
    ComputeLogprobs(rows[r].logits->data(), kVocab, got[r], rows[r].opts.top_logprobs, &want);
    EXPECT_NEAR(lp[r].chosen, want.logprob, 1e-4);
    ASSERT_EQ(lp[r].count, static_cast<int>(want.top.size()));
    for (int k = 0; k < lp[r].count; ++k) {
      EXPECT_EQ(lp[r].ids[k], want.top[k].id) << k;
      EXPECT_NEAR(lp[r].logprobs[k], want.top[k].logprob, 1e-4) << k;
    }
  }
  EXPECT_EQ(lp[0].ids[0], 40);
  EXPECT_EQ(lp[0].ids[1], 500);
  EXPECT_EQ(lp[0].ids[2], 90000);
  EXPECT_EQ(got[0], 40);
  EXPECT_EQ(got[1], 500);  // penalised; its logprob is still the raw one
  EXPECT_NEAR(lp[1].chosen, lp[0].logprobs[0], 1e-6);
}

// Draws many tokens from one row (as many identical rows with successive
// counters) and compares with the CPU rule's probabilities.
void ExpectCpuDistribution(const std::vector<float>& l, const SamplingOptions& o,
                           const std::vector<PenaltyEntry>& pen) {
  constexpr int kRows = 4096, kLaunches = 3;
  const int V = static_cast<int>(l.size());
  const std::vector<double> p = CpuProbs(l, o, pen);
  std::vector<int> count(V, 0);
  for (int launch = 0; launch < kLaunches; ++launch) {
    std::vector<Row> rows;
    for (int r = 0; r < kRows; ++r) rows.push_back({&l, o, pen, 77, uint64_t(launch) * kRows + r});
    for (int t : Sample(rows, V)) {
      ASSERT_GE(t, 0);
      ASSERT_LT(t, V);
      ++count[t];
    }
  }
  const int n = kRows * kLaunches;
  double rest_p = 1, rest_f = 1;
  for (int t = 0; t < V; ++t) {
    EXPECT_TRUE(p[t] > 0 || count[t] == 0) << "token " << t << " is outside the CPU kept set";
    if (p[t] < 0.01) continue;
    const double f = count[t] / static_cast<double>(n);
    rest_p -= p[t];
    rest_f -= f;
    EXPECT_NEAR(f, p[t], 5 * std::sqrt(p[t] * (1 - p[t]) / n) + 1.0 / n) << "token " << t;
  }
  rest_p = std::clamp(rest_p, 0.0, 1.0);  // rounding: all mass may sit in the tokens above
  EXPECT_NEAR(rest_f, rest_p, 5 * std::sqrt(rest_p * (1 - rest_p) / n) + 1.0 / n);
}

TEST(CudaSampling, KeptSetsAndFrequenciesFollowTheCpuRule) {
  BALLAST_SKIP_WITHOUT_GPU();
  const std::vector<float> l = RandomLogits(1000, 31, 2.0f);
  auto opts = [](float t, float top_p, int top_k, float min_p) {
    SamplingOptions o;
    o.temperature = t;
    o.top_p = top_p;
    o.top_k = top_k;
    o.min_p = min_p;
    return o;
  };
  SamplingOptions pen = opts(1.0f, 0.9f, 50, 0.01f);
  pen.repetition_penalty = 1.3f;
  pen.frequency_penalty = 0.6f;
  pen.presence_penalty = 0.2f;
  const struct {
    SamplingOptions o;
    std::vector<PenaltyEntry> pen;
  } cases[] = {
      {opts(1.0f, 1.0f, 0, 0.05f), {}}, {opts(0.8f, 1.0f, 20, 0.02f), {}},
      {opts(1.2f, 0.7f, 0, 0.0f), {}},  {opts(0.7f, 1.0f, 5, 0.0f), {}},
      {pen, TopPenalties(l, 8, 3)},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(::testing::Message()
                 << "T " << c.o.temperature << " top_p " << c.o.top_p << " top_k " << c.o.top_k
                 << " min_p " << c.o.min_p << " penalties " << c.pen.size());
    ExpectCpuDistribution(l, c.o, c.pen);
  }
}

// A decode run for the graph test: kSeqs greedy sequences, prefilled at
// step 0, then one token per step; penalties change every step and, from
// step 4, list every token of the vocabulary ("in the prompt"): 40 x 512
// entries outgrow the executor's initial 16384.
constexpr int kSeqs = 40, kSteps = 9, kPromptLen = 6;
struct DecodeRun {
  std::vector<std::vector<int>> toks;           // per sequence
  std::vector<std::vector<int>> out;            // per step
  std::vector<std::vector<TokenLogprobs>> lps;  // per step
};
DecodeRun Decode(testing::GpuHarness& h, const SamplingOptions& o) {
  const int V = h.config.vocab_size;
  std::vector<SequenceKv> seqs(kSeqs);
  std::vector<PenaltyState> pen;
  DecodeRun r;
  for (int s = 0; s < kSeqs; ++s) {
    EXPECT_TRUE(h.kv->Reserve(&seqs[s], kPromptLen + kSteps + 1).ok());
    r.toks.push_back({1 + s, 7, 30 + s, 200, 5 * s, 11});
    pen.emplace_back(r.toks.back(), true);
  }
  for (int step = 0; step <= kSteps; ++step) {
    std::vector<SequenceChunk> batch;
    std::vector<DeviceSampling> sampling;
    std::vector<std::vector<PenaltyEntry>> all(kSeqs);
    for (int s = 0; s < kSeqs; ++s) {
      const int start = step == 0 ? 0 : static_cast<int>(r.toks[s].size()) - 1;
      batch.push_back(
          {&seqs[s], start, absl::MakeConstSpan(r.toks[s]).subspan(start), LogitsMode::kLast});
      absl::Span<const PenaltyEntry> entries = pen[s].entries();
      if (step >= 4) {
        for (int t = 0; t < V; ++t) all[s].push_back({t, 0, 1});
        for (const PenaltyEntry& e : entries) all[s][e.token].output_count = e.output_count;
        entries = all[s];
      }
      sampling.push_back({o, 3, static_cast<uint64_t>(step), entries});
    }
    std::vector<int> out;
    std::vector<TokenLogprobs> lps;
    EXPECT_TRUE(h.executor->ForwardSample(batch, sampling, &out, &lps).ok());
    for (int s = 0; s < kSeqs; ++s) {
      r.toks[s].push_back(out[s]);
      pen[s].AddOutput(out[s]);
    }
    r.out.push_back(out);
    r.lps.push_back(lps);
  }
  for (auto& s : seqs) h.kv->Release(&s);
  return r;
}

// The same decode through two executors, one replaying CUDA graphs (whose
// sampling kernel reads each step's penalties from device memory).
TEST(CudaSampling, GraphReplayWithPenaltiesMatchesEager) {
  BALLAST_SKIP_WITHOUT_GPU();
  testing::TempDir dir;
  const std::string model = testing::WriteTinyModel(dir, "m", testing::GpuTestModelSpec());
  testing::GpuHarness eager(model, 16, "auto", /*graphs=*/false);
  testing::GpuHarness graphs(model, 16, "auto", /*graphs=*/true);
  SamplingOptions o;  // greedy
  o.frequency_penalty = 2.0f;
  o.presence_penalty = 2.0f;
  o.repetition_penalty = 1.2f;
  o.top_logprobs = 4;
  const DecodeRun a = Decode(eager, o), b = Decode(graphs, o);
  const auto* ge = dynamic_cast<const cuda::CudaExecutor*>(graphs.executor.get());
  ASSERT_NE(ge, nullptr);
  EXPECT_GE(ge->graph_replays(), 6);  // steps 2-3 and 5-9 (1 and 4 capture)
  for (int step = 0; step <= kSteps; ++step) {
    EXPECT_EQ(b.out[step], a.out[step]) << "step " << step;
    for (int s = 0; s < kSeqs; ++s) {
      ASSERT_EQ(b.lps[step][s].top.size(), 4u);
      EXPECT_NEAR(b.lps[step][s].logprob, a.lps[step][s].logprob, 0.02) << step << "/" << s;
    }
  }
  // Penalties bite: no sequence repeats a generated token.
  for (int s = 0; s < kSeqs; ++s) {
    std::vector<int> gen(a.toks[s].begin() + kPromptLen, a.toks[s].end());
    std::sort(gen.begin(), gen.end());
    EXPECT_EQ(std::unique(gen.begin(), gen.end()), gen.end()) << "sequence " << s;
  }
}

}  // namespace
}  // namespace ballast::engine
