// bench-engine's prefill runs and first steps (engine_bench_prefill.h).
#include "engine/cuda/engine_bench_prefill.h"

#include <algorithm>
#include <vector>

#include "engine/cuda/engine_bench_util.h"

namespace ballast::engine {

using bench_internal::Clock;
using bench_internal::PromptFor;
using bench_internal::Seconds;

absl::StatusOr<PrefillTimes> TimePrefill(cuda::CudaExecutor* e, KvCache* kv,
                                         const std::vector<std::vector<int>>& prompts, int runs) {
  std::vector<SequenceKv> seqs(prompts.size());
  absl::Status st;
  size_t reserved = 0;
  for (; reserved < prompts.size() && st.ok(); ++reserved) {
    st = kv->Reserve(&seqs[reserved], static_cast<int>(prompts[reserved].size()));
  }
  std::vector<SequenceChunk> chunks;
  for (size_t i = 0; i < prompts.size(); ++i) {
    chunks.push_back({&seqs[i], 0, absl::MakeConstSpan(prompts[i]), LogitsMode::kLast});
  }
  const std::vector<DeviceSampling> greedy(prompts.size());
  std::vector<int> sampled;
  double total = 0, best = 1e30;
  for (int r = 0; r < 1 + runs && st.ok(); ++r) {
    const auto t0 = Clock::now();
    st = e->ForwardSample(chunks, greedy, &sampled, nullptr);
    const double s = Seconds(t0, Clock::now());
    if (r > 0) {
      total += s;
      best = std::min(best, s);
    }
  }
  for (size_t i = 0; i < reserved; ++i) kv->Release(&seqs[i]);
  if (!st.ok()) return st;
  return PrefillTimes{total / runs, best};
}
absl::StatusOr<PrefillTimes> TimePrefill(cuda::CudaExecutor* e, KvCache* kv,
                                         const std::vector<int>& prompt, int runs) {
  return TimePrefill(e, kv, std::vector<std::vector<int>>{prompt}, runs);
}

absl::StatusOr<nlohmann::json> TimeFirstSteps(cuda::CudaExecutor* e, KvCache* kv,
                                              const ModelConfig& c, int tokens) {
  const std::vector<int> prompt = PromptFor(tokens, c);
  const std::vector<DeviceSampling> greedy(1);
  nlohmann::json ms = nlohmann::json::array();
  for (int r = 0; r < 3; ++r) {
    SequenceKv seq;
    if (auto st = kv->Reserve(&seq, static_cast<int>(prompt.size())); !st.ok()) return st;
    const std::vector<SequenceChunk> chunk = {
        {&seq, 0, absl::MakeConstSpan(prompt), LogitsMode::kLast}};
    std::vector<int> sampled;
    const auto t0 = Clock::now();
    absl::Status st = e->ForwardSample(chunk, greedy, &sampled, nullptr);
    ms.push_back(Seconds(t0, Clock::now()) * 1e3);
    kv->Release(&seq);
    if (!st.ok()) return st;
  }
  return ms;
}

absl::StatusOr<nlohmann::json> MeasurePrefill(const GpuEngineBenchOptions& o, const ModelConfig& c,
                                              KvCache* kv, cuda::CudaExecutor* e,
                                              const nlohmann::json& out) {
  const int n = std::min(std::max(o.prefill_prompts, 1), o.prefill_tokens);
  std::vector<std::vector<int>> prompts;
  double pairs = 0;
  for (int i = 0; i < n; ++i) {
    const int len = o.prefill_tokens / n + (i < o.prefill_tokens % n ? 1 : 0);
    std::vector<int> p = PromptFor(len, c);
    for (int& t : p) t = static_cast<int>((t + 104729LL * i) % c.vocab_size);  // distinct prompts
    pairs += 0.5 * len * (len + 1.0);
    prompts.push_back(std::move(p));
  }
  auto times = TimePrefill(e, kv, prompts, o.prefill_runs);
  if (!times.ok()) return times.status();
  const double mean = times->mean, best = times->best;
  const double T = o.prefill_tokens;
  const double L = c.num_hidden_layers, H = c.hidden_size, Q = c.q_dim(), KVd = c.kv_dim(),
               I = c.intermediate_size;
  const double linear = L * (H * (Q + 2 * KVd) + Q * H + 3 * H * I);
  const double flops = 2 * linear * T + 2.0 * c.vocab_size * H * n +
                       L * 4.0 * c.num_attention_heads * c.head_dim * pairs;
  nlohmann::json p = {{"tokens", o.prefill_tokens},   {"prompts", n},
                      {"attention_pairs", pairs},     {"ms", mean * 1e3},
                      {"best_ms", best * 1e3},        {"tokens_per_s", T / mean},
                      {"tflops", flops / mean / 1e12}};
  if (out.contains("gemm_peak_tflops")) {
    p["fraction_of_gemm_peak"] = flops / mean / 1e12 / out["gemm_peak_tflops"].get<double>();
    p["fraction_of_gemm_peak_random"] =
        flops / mean / 1e12 / out["gemm_peak_random_tflops"].get<double>();
  }
  return p;
}

}  // namespace ballast::engine
