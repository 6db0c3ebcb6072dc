// bench-engine's mixed chunked-prefill steps (engine_bench_mixed.h).
#include "engine/cuda/engine_bench_mixed.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "engine/cuda/engine_bench_util.h"

namespace ballast::engine {
namespace {

using bench_internal::Clock;

// Mean ms of o.steps calls of `step` after o.warmup untimed ones (plans,
// the graph capture).
template <typename Step>
absl::StatusOr<double> MeanMs(const GpuEngineBenchOptions& o, Step step) {
  Clock::time_point t0;
  for (int i = 0; i < o.warmup + o.steps; ++i) {
    if (i == o.warmup) t0 = Clock::now();
    if (auto st = step(); !st.ok()) return st;
  }
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count() / o.steps;
}

struct MixedRow {
  double mixed_ms = 0, decode_ms = 0, chunk_ms = 0;
};

// One (batch, chunk) row: `decodes` at o.context, the chunk [C, 2C) of `p`.
absl::StatusOr<MixedRow> TimeRow(const GpuEngineBenchOptions& o, cuda::CudaExecutor* e,
                                 const std::vector<SequenceChunk>& decodes,
                                 const SequenceChunk& chunk) {
  std::vector<int> sampled;
  auto run = [&](const std::vector<SequenceChunk>& chunks) {
    const std::vector<DeviceSampling> greedy(chunks.size());
    return e->ForwardSample(chunks, greedy, &sampled, nullptr);
  };
  std::vector<SequenceChunk> mixed = decodes;
  mixed.push_back(chunk);
  MixedRow row;
  auto m = MeanMs(o, [&] { return run(mixed); });
  if (!m.ok()) return m.status();
  auto d = MeanMs(o, [&] { return run(decodes); });
  if (!d.ok()) return d.status();
  auto c = MeanMs(o, [&] { return run({chunk}); });
  if (!c.ok()) return c.status();
  return MixedRow{*m, *d, *c};
}

nlohmann::json RowJson(int batch, int chunk, const MixedRow& r) {
  const double marginal = r.mixed_ms - r.decode_ms;
  nlohmann::json j = {{"batch", batch},
                      {"chunk", chunk},
                      {"mixed_ms", r.mixed_ms},
                      {"decode_ms", r.decode_ms},
                      {"chunk_ms", r.chunk_ms},
                      {"marginal_ms", marginal},
                      {"chunk_tokens_per_s_alone", chunk * 1e3 / r.chunk_ms}};
  // A chunk that added nothing measurable (marginal <= 0, noise at small
  // chunks) has no rate: null, not 0 (which would read as "speed lost").
  j["chunk_tokens_per_s_mixed"] = marginal > 0 ? nlohmann::json(chunk * 1e3 / marginal) : nullptr;
  j["chunk_speed_kept"] = marginal > 0 ? nlohmann::json(r.chunk_ms / marginal) : nullptr;
  return j;
}

}  // namespace

int64_t MixedChunkBlocks(const GpuEngineBenchOptions& o) {
  int longest = 0;
  for (int c : o.mixed_chunks) longest = std::max(longest, c);
  return (2 * static_cast<int64_t>(longest) + o.block_tokens - 1) / o.block_tokens;
}

absl::StatusOr<nlohmann::json> MeasureMixed(const GpuEngineBenchOptions& o, const ModelConfig& c,
                                            KvCache* kv, cuda::CudaExecutor* e) {
  nlohmann::json out = nlohmann::json::array();
  int max_batch = 0;
  for (int b : o.batches) max_batch = std::max(max_batch, b);
  const std::vector<int> toks = bench_internal::DistinctTokens(max_batch, c.vocab_size);
  for (int chunk : o.mixed_chunks) {
    const std::vector<int> prompt = bench_internal::PromptFor(2 * chunk, c);
    SequenceKv p;
    if (auto st = kv->Reserve(&p, 2 * chunk); !st.ok()) return st;
    const auto ids = absl::MakeConstSpan(prompt);
    std::vector<int> sampled;
    absl::Status st = e->ForwardSample({{&p, 0, ids.subspan(0, chunk), LogitsMode::kLast}},
                                       {DeviceSampling{}}, &sampled, nullptr);
    const SequenceChunk second{&p, chunk, ids.subspan(chunk, chunk), LogitsMode::kLast};
    for (int batch : o.batches) {
      if (!st.ok()) break;
      std::vector<SequenceKv> seqs(static_cast<size_t>(batch));
      std::vector<SequenceChunk> decodes;
      for (size_t i = 0; i < seqs.size(); ++i) {
        if (st.ok()) st = kv->Reserve(&seqs[i], o.context + 1);
        decodes.push_back(
            {&seqs[i], o.context, absl::MakeConstSpan(&toks[i], 1), LogitsMode::kLast});
      }
      absl::StatusOr<MixedRow> row =
          st.ok() ? TimeRow(o, e, decodes, second) : absl::StatusOr<MixedRow>(st);
      for (auto& s : seqs) kv->Release(&s);
      if (!row.ok()) st = row.status();
      if (st.ok()) out.push_back(RowJson(batch, chunk, *row));
    }
    kv->Release(&p);
    if (!st.ok()) return st;
  }
  return out;
}

}  // namespace ballast::engine
