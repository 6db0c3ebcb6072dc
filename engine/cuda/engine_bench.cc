// RunGpuEngineBench (engine/gpu_bench.h): times the CUDA executor on a
// checkpoint. Decode: `batch` sequences at `context` tokens each, one token
// per sequence per step, greedy sampling on the GPU, CUDA graphs as in
// serving; the KV read is real (zeroed blocks), the prefix is not computed.
// Prefill: prefill_tokens in one step, as one prompt or prefill_prompts
// (one chunk each). Reported against
//   decode roofline  = (weight bytes read + KV bytes read) / HBM bandwidth
//   prefill fraction = achieved FLOP/s / cuBLASLt 8192^3 BF16 GEMM FLOP/s
// measured in the same process, on zeros (gemm_peak_tflops, the figure of
// earlier runs) and on uniform random values (gemm_peak_random_tflops,
// lower: data draws more power), its algorithm timed as the engine's
// (gemm_tune_candidates).
//
// JSON: {device, model, decode: [{batch, mean_context, ms_per_step, tokens_per_s,
// bytes_per_step, roofline_ms, roofline_fraction}], prefill: {tokens,
// ms, tokens_per_s, tflops, fraction_of_gemm_peak,
// fraction_of_gemm_peak_random}, gemm_peak_tflops, gemm_peak_random_tflops,
// gemm_tune_candidates, first_steps_ms (the first three prefills of 8 tokens or fewer
// after activation),
// concurrent: {models, decode: [{batch, ms_per_step, tokens_per_s}]},
// mixed: [...] (engine_bench_mixed.h),
// interference: {...}}
// The device figures (copy rate, GEMM peak) are engine_bench_device.cc's.
#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/cuda/cuda_executor.h"
#include "engine/cuda/cuda_status.h"
#include "engine/cuda/engine_bench_device.h"
#include "engine/cuda/engine_bench_mixed.h"
#include "engine/cuda/engine_bench_prefill.h"
#include "engine/cuda/engine_bench_util.h"
#include "engine/gpu_backend.h"
#include "engine/gpu_bench.h"
#include "memory/gpu_page_pool.h"
#include "memory/kv_arena.h"
#include "nlohmann/json.hpp"

namespace ballast::engine {
namespace {

using bench_internal::AddGemmPeaks;
using bench_internal::Clock;
using bench_internal::DescribeDevice;
using bench_internal::PromptFor;
using bench_internal::Seconds;

// Mean milliseconds of `steps` batch-1 decode steps on `e` at `context`
// tokens (after three untimed ones: plans and the graph capture).
absl::StatusOr<double> DecodeStepMs(cuda::CudaExecutor* e, KvCache* kv, int context, int steps) {
  SequenceKv seq;
  if (auto st = kv->Reserve(&seq, context + 1); !st.ok()) return st;
  const int tok = 1;
  const SequenceChunk ch{&seq, context, absl::MakeConstSpan(&tok, 1), LogitsMode::kLast};
  const DeviceSampling greedy;
  std::vector<int> sampled;
  absl::Status st;
  Clock::time_point t0;
  for (int i = 0; i < 3 + steps && st.ok(); ++i) {
    if (i == 3) t0 = Clock::now();
    st = e->ForwardSample({ch}, {greedy}, &sampled, nullptr);
  }
  const double ms = Seconds(t0, Clock::now()) * 1e3 / steps;
  kv->Release(&seq);
  if (!st.ok()) return st;
  return ms;
}

// Two executors of one model (each its own weights) on the device: a
// background one steps without pause on its own thread while the
// foreground's work is timed, with the foreground's stream at the default
// and then at the greatest priority (Executor::SetUrgent).
//   foreground "prefill": the background decodes o.interference_batch
//     sequences; the foreground prefills `prompt` (ms per prefill);
//   foreground "decode": the background prefills `prompt` over and over;
//   the foreground decodes one sequence (ms per step).
// Also the background's step rate alone and during each.
absl::StatusOr<nlohmann::json> MeasureInterference(const GpuEngineBenchOptions& o,
                                                   const ModelConfig& c,
                                                   const GpuExecutorOptions& eo, KvCache* kv,
                                                   cuda::CudaExecutor* e,
                                                   const std::vector<int>& prompt) {
  const bool fg_prefill = o.interference_foreground == "prefill";
  if (!fg_prefill && o.interference_foreground != "decode") {
    return absl::InvalidArgumentError(absl::StrCat("interference foreground \"",
                                                   o.interference_foreground,
                                                   "\" (expected prefill or decode)"));
  }
  // With an SM split, the foreground's own executor on its partition.
  GpuExecutorOptions fg_options = eo, bg_options = eo;
  std::unique_ptr<cuda::CudaExecutor> own_fg;
  if (o.interference_sms > 0) {
    fg_options.sm_partition = bg_options.sm_partition = o.interference_sms;
    bg_options.sm_partition_rest = true;
    auto fg = cuda::CudaExecutor::Create(c, o.model_dir, kv, fg_options);
    if (!fg.ok()) return fg.status();
    own_fg = std::move(*fg);
    e = own_fg.get();
  }
  auto bg = cuda::CudaExecutor::Create(c, o.model_dir, kv, bg_options);
  if (!bg.ok()) return bg.status();
  const int B = fg_prefill ? o.interference_batch : 1;
  std::vector<SequenceKv> seqs(static_cast<size_t>(B));
  const int reserve = fg_prefill ? o.context + 1 : static_cast<int>(prompt.size());
  for (auto& s : seqs) {
    if (auto st = kv->Reserve(&s, reserve); !st.ok()) return st;
  }
  const int tok = 1;
  std::vector<SequenceChunk> chunks;
  for (auto& s : seqs) {
    chunks.push_back(fg_prefill ? SequenceChunk{&s, o.context, absl::MakeConstSpan(&tok, 1)}
                                : SequenceChunk{&s, 0, absl::MakeConstSpan(prompt)});
  }
  const std::vector<DeviceSampling> sampling(static_cast<size_t>(B));
  std::vector<int> warm;
  for (int i = 0; i < 3; ++i) {  // plans and the graph capture, untimed
    if (auto st = (*bg)->ForwardSample(chunks, sampling, &warm, nullptr); !st.ok()) return st;
  }
  std::atomic<bool> stop{false};
  std::atomic<int64_t> steps{0};
  absl::Status bg_status;
  std::thread background([&] {
    std::vector<int> sampled;
    while (!stop.load() && bg_status.ok()) {  // the same positions each step: timing only
      bg_status = (*bg)->ForwardSample(chunks, sampling, &sampled, nullptr);
      steps.fetch_add(1);
    }
  });
  auto rate = [&](auto&& during) -> absl::StatusOr<std::pair<double, double>> {
    const int64_t s0 = steps.load();
    const auto t0 = Clock::now();
    absl::StatusOr<double> r = during();
    const double span = Seconds(t0, Clock::now());
    if (!r.ok()) return r.status();
    return std::make_pair(*r, static_cast<double>(steps.load() - s0) / span);
  };
  auto foreground = [&]() -> absl::StatusOr<double> {
    if (fg_prefill) {
      auto t = TimePrefill(e, kv, prompt, o.prefill_runs);
      if (!t.ok()) return t.status();
      return t->mean * 1e3;
    }
    return DecodeStepMs(e, kv, o.context, o.steps);
  };
  absl::StatusOr<std::pair<double, double>> plain = absl::UnknownError("not run"),
                                            urgent = absl::UnknownError("not run");
  auto alone = rate([] {  // the background by itself, half a second
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    return absl::StatusOr<double>(0.0);
  });
  absl::Status st = alone.status();
  if (st.ok()) {
    plain = rate(foreground);
    st = plain.status();
  }
  if (st.ok()) st = e->SetUrgent(true);
  if (st.ok()) {
    urgent = rate(foreground);
    st = urgent.status();
  }
  stop = true;
  background.join();
  for (auto& s : seqs) kv->Release(&s);
  const absl::Status reset = e->SetUrgent(false);
  if (!bg_status.ok()) return bg_status;
  if (!st.ok()) return st;
  if (!reset.ok()) return reset;
  nlohmann::json j = {{"foreground", o.interference_foreground}};
  if (o.interference_sms > 0) {
    j["foreground_sms"] = e->num_sms();
    j["background_sms"] = (*bg)->num_sms();
  }
  if (fg_prefill) j["background_batch"] = B;
  j["foreground_ms"] = {{"default_priority", plain->first}, {"urgent", urgent->first}};
  j["background_steps_per_s"] = {
      {"alone", alone->second}, {"default_priority", plain->second}, {"urgent", urgent->second}};
  return j;
}

// The most a drawn context may exceed o.context (context_sigma).
constexpr int kMaxSpread = 4;

// The decoding sequences' contexts (GpuEngineBenchOptions::context_sigma):
// all o.context, or log-normal draws with that mean; a batch of b takes
// the first b draws, so every batch size sees the same sequences.
std::vector<int> BenchContexts(const GpuEngineBenchOptions& o, int batch) {
  std::vector<int> ctx(static_cast<size_t>(batch), o.context);
  if (o.context_sigma <= 0) return ctx;
  std::mt19937_64 rng(1);
  const double sigma = o.context_sigma;
  std::lognormal_distribution<double> draw(std::log(o.context) - sigma * sigma / 2, sigma);
  const double most = static_cast<double>(kMaxSpread) * o.context;
  for (int& c : ctx) c = static_cast<int>(std::lround(std::clamp(draw(rng), 1.0, most)));
  return ctx;
}

// The longest context BenchContexts draws.
int MaxBenchContext(const GpuEngineBenchOptions& o) {
  return (o.context_sigma > 0 ? kMaxSpread : 1) * o.context;
}

// The tokens a decoding sequence at `context` reserves.
int DecodeTokens(const GpuEngineBenchOptions& o, int context) {
  return context + o.warmup + o.steps + 1;
}

// Reserves each of `seqs` for its context's decode (`contexts`).
// (GpuEngineBenchOptions::interleave_kv: one block of each in turn.)
absl::Status ReserveDecode(const GpuEngineBenchOptions& o, const std::vector<int>& contexts,
                           KvCache* kv, std::vector<SequenceKv>* seqs) {
  int most = 0;
  for (int c : contexts) most = std::max(most, DecodeTokens(o, c));
  const int step = o.interleave_kv ? o.block_tokens : most;
  for (int upto = step;; upto += step) {
    for (size_t s = 0; s < seqs->size(); ++s) {
      const int tokens = std::min(upto, DecodeTokens(o, contexts[s]));
      if (auto st = kv->Reserve(&(*seqs)[s], tokens); !st.ok()) return st;
    }
    if (upto >= most) return absl::OkStatus();
  }
}

// Decodes `seqs` (reserved by ReserveDecode) one token each per step from
// position contexts[s]: o.warmup untimed steps (plans, graph capture),
// then, after `start` (if any) lets every caller go, o.steps timed ones.
// Returns when the timed steps began and ended.
absl::StatusOr<std::pair<Clock::time_point, Clock::time_point>> TimeDecode(
    cuda::CudaExecutor* e, std::vector<SequenceKv>* seqs, const std::vector<int>& contexts,
    const GpuEngineBenchOptions& o, int vocab, std::barrier<>* start) {
  const int batch = static_cast<int>(seqs->size());
  std::vector<int> toks = bench_internal::DistinctTokens(batch, vocab);  // then the sampled ones
  const std::vector<DeviceSampling> sampling(batch);
  std::vector<int> sampled;
  Clock::time_point t0;
  absl::Status st;
  for (int i = 0; i < o.warmup + o.steps; ++i) {
    if (i == o.warmup) {
      if (start != nullptr) start->arrive_and_wait();
      t0 = Clock::now();
    }
    if (!st.ok()) continue;  // still reach the barrier: the others wait on it
    std::vector<SequenceChunk> chunks;
    for (int s = 0; s < batch; ++s) {
      chunks.push_back(
          {&(*seqs)[s], contexts[s] + i, absl::MakeConstSpan(&toks[s], 1), LogitsMode::kLast});
    }
    st = e->ForwardSample(chunks, sampling, &sampled, nullptr);
    for (int s = 0; s < batch && st.ok(); ++s) toks[s] = sampled[s] % vocab;
  }
  if (!st.ok()) return st;
  return std::make_pair(t0, Clock::now());
}

// N copies of the model (e and o.concurrent_models - 1 more, each its own
// weights and streams), each decoding `batch` sequences on its own host
// thread at once: the device's own aggregate rate for N models, which the
// serving path is held to (issue 13, item 5). Per batch: the aggregate
// tokens/s over the span from the first timed step's start to the last's
// end, and the mean ms per step of one copy.
absl::StatusOr<nlohmann::json> MeasureConcurrent(const GpuEngineBenchOptions& o,
                                                 const ModelConfig& c, const GpuExecutorOptions& eo,
                                                 KvCache* kv, cuda::CudaExecutor* e) {
  const int n = o.concurrent_models;
  std::vector<std::unique_ptr<cuda::CudaExecutor>> more;
  std::vector<cuda::CudaExecutor*> copies = {e};
  for (int i = 1; i < n; ++i) {
    auto x = cuda::CudaExecutor::Create(c, o.model_dir, kv, eo);
    if (!x.ok()) return x.status();
    more.push_back(std::move(*x));
    copies.push_back(more.back().get());
  }
  nlohmann::json out = {{"models", n}};
  for (int batch : o.batches) {
    std::vector<std::vector<SequenceKv>> seqs(n, std::vector<SequenceKv>(batch));
    const std::vector<int> contexts = BenchContexts(o, batch);
    absl::Status st;
    for (auto& per : seqs) {
      if (st.ok()) st = ReserveDecode(o, contexts, kv, &per);
    }
    std::vector<absl::StatusOr<std::pair<Clock::time_point, Clock::time_point>>> spans(
        n, absl::UnknownError("not run"));
    if (st.ok()) {
      std::barrier<> start(n);
      std::vector<std::thread> threads;
      for (int i = 0; i < n; ++i) {
        threads.emplace_back([&, i] {
          spans[i] = TimeDecode(copies[i], &seqs[i], contexts, o, c.vocab_size, &start);
        });
      }
      for (auto& t : threads) t.join();
    }
    for (auto& per : seqs) {
      for (auto& s : per) kv->Release(&s);
    }
    if (!st.ok()) return st;
    Clock::time_point first = Clock::time_point::max(), last = Clock::time_point::min();
    double step_s = 0;
    for (const auto& sp : spans) {
      if (!sp.ok()) return sp.status();
      first = std::min(first, sp->first);
      last = std::max(last, sp->second);
      step_s += Seconds(sp->first, sp->second) / o.steps / n;
    }
    const double wall = Seconds(first, last);
    out["decode"].push_back({{"batch", batch},
                             {"ms_per_step", step_s * 1e3},
                             {"tokens_per_s", static_cast<double>(n) * batch * o.steps / wall}});
  }
  return out;
}

// The KV layout: the model's, in o.kv_dtype ("auto": the engine's choice).
absl::StatusOr<KvLayout> BenchKvLayout(const GpuEngineBenchOptions& o, const ModelConfig& c) {
  KvLayout layout{c.num_hidden_layers, c.num_key_value_heads, c.head_dim, o.block_tokens,
                  GpuAutoKvDType(c)};
  if (o.kv_dtype != "auto") {
    auto dt = DTypeFromConfig(o.kv_dtype);
    if (!dt.ok()) return dt.status();
    layout.dtype = *dt;
  }
  return layout;
}

// KV blocks, all layers: the largest decode batch of every concurrent copy
// (or the prompt, if more), the interference executor's sequences and the
// mixed steps'.
int64_t BenchKvBlocks(const GpuEngineBenchOptions& o, const ModelConfig& c, int max_batch,
                      int decode_len) {
  const int64_t per_seq = (decode_len + o.block_tokens - 1) / o.block_tokens;
  // One block more per prompt where the prompts' lengths do not fill theirs
  // (MeasurePrefill's prompt count: at most one a token).
  const int64_t prompts =
      o.prefill_tokens > 0 ? std::min(std::max(o.prefill_prompts, 1), o.prefill_tokens) : 0;
  const int64_t prefill_blocks = (o.prefill_tokens + o.block_tokens - 1) / o.block_tokens + prompts;
  const int64_t second =
      o.interference_batch > 0 ? per_seq * std::max(1, o.interference_batch) + prefill_blocks : 0;
  const int64_t copies = std::max(1, o.concurrent_models);
  // The largest batch's (ReserveDecode), and at least its blocks at equal
  // contexts (the mixed steps reserve those).
  int64_t decode_blocks = 0;
  for (int ctx : BenchContexts(o, max_batch)) {
    decode_blocks += (DecodeTokens(o, ctx) + o.block_tokens - 1) / o.block_tokens;
  }
  decode_blocks = std::max(decode_blocks, per_seq * max_batch);
  return (std::max<int64_t>(decode_blocks * copies, prefill_blocks) + second +
          (o.mixed_chunks.empty() ? 0 : MixedChunkBlocks(o))) *
         c.num_hidden_layers;
}

// The KV block pool of o.kv_pool: a static pool, or an elastic arena that
// `*arena` keeps (it must outlive the allocator).
absl::StatusOr<std::unique_ptr<memory::BlockAllocator>> CreateBenchPool(
    const GpuEngineBenchOptions& o, const KvLayout& layout, int64_t blocks,
    std::shared_ptr<memory::KvArena>* arena) {
  if (o.kv_pool == "static") return CreateGpuBlockPool(o.device, layout.block_bytes(), blocks);
  if (o.kv_pool != "arena") {
    return absl::InvalidArgumentError(
        absl::StrCat("kv_pool \"", o.kv_pool, "\" (expected static or arena)"));
  }
  constexpr size_t kSlab = 64u << 20;
  const size_t bytes = static_cast<size_t>(blocks) * layout.block_bytes();
  const size_t budget = (bytes / kSlab + 2) * kSlab;
  auto pages = memory::CreateGpuPagePool(o.device, kSlab, static_cast<int64_t>(budget));
  if (!pages.ok()) return pages.status();
  memory::KvArenaOptions ao;
  ao.slab_bytes = kSlab;
  ao.reserve_bytes = budget;
  auto a = memory::KvArena::Create(*pages, ao);
  if (!a.ok()) return a.status();
  *arena = std::move(*a);
  return (*arena)->CreateAllocator(layout.block_bytes());
}

// The executor's options: room for the largest batch plus the longest mixed
// chunk, or the prompt; the bench's graph, GEMM and determinism settings.
GpuExecutorOptions BenchExecutorOptions(const GpuEngineBenchOptions& o, int max_batch,
                                        int decode_len) {
  GpuExecutorOptions eo;
  eo.device = o.device;
  int longest_chunk = 0;
  for (int chunk : o.mixed_chunks) longest_chunk = std::max(longest_chunk, chunk);
  eo.max_batch_tokens = std::max(max_batch + longest_chunk, o.prefill_tokens);
  eo.max_context = std::max({decode_len, o.prefill_tokens, 2 * longest_chunk});
  eo.cuda_graphs = o.cuda_graphs;
  eo.skinny_gemm_max_m = o.skinny_gemm_max_m;
  eo.skinny_fp8_max_m = o.skinny_fp8_max_m;
  eo.skinny_mma_max_m = o.skinny_mma_max_m;
  eo.skinny_mma_2byte = o.skinny_mma_2byte;
  eo.fold_norms = o.fold_norms;
  eo.fold_rope = o.fold_rope;
  eo.gemm_tune_candidates = o.gemm_tune_candidates;
  eo.deterministic = o.deterministic;
  return eo;
}

// Decode at each of o.batches (every sequence at o.context tokens of KV):
// ms per step, tokens/s, and the bytes a step reads against the roofline
// at `hbm` bytes/s.
absl::StatusOr<nlohmann::json> MeasureDecode(const GpuEngineBenchOptions& o, const ModelConfig& c,
                                             double hbm, KvCache* kv, cuda::CudaExecutor* e) {
  const double weight_bytes = static_cast<double>(e->weight_bytes());
  // The embedding table is gathered, not streamed (unless tied to the head).
  const double embed_bytes = c.tie_word_embeddings ? 0.0 : 2.0 * c.vocab_size * c.hidden_size;
  nlohmann::json decode = nlohmann::json::array();
  for (int batch : o.batches) {
    std::vector<SequenceKv> seqs(batch);
    const std::vector<int> contexts = BenchContexts(o, batch);
    if (auto st = ReserveDecode(o, contexts, kv, &seqs); !st.ok()) return st;
    auto span = TimeDecode(e, &seqs, contexts, o, c.vocab_size, nullptr);
    if (!span.ok()) return span.status();
    const double ms = Seconds(span->first, span->second) * 1e3 / o.steps;
    double ctx = 0;  // mean over the timed steps
    for (int x : contexts) ctx += x + o.warmup + o.steps / 2.0;
    ctx /= batch;
    const double kv_bytes = static_cast<double>(batch) * ctx * c.num_hidden_layers *
                            static_cast<double>(kv->layout().token_bytes()) * 2;
    const double bytes = weight_bytes - embed_bytes + kv_bytes;
    const double roof_ms = bytes / hbm * 1e3;
    decode.push_back({{"batch", batch},
                      {"mean_context", ctx},
                      {"ms_per_step", ms},
                      {"tokens_per_s", batch * 1e3 / ms},
                      {"bytes_per_step", bytes},
                      {"roofline_ms", roof_ms},
                      {"roofline_fraction", roof_ms / ms}});
    for (auto& s : seqs) kv->Release(&s);
  }
  return decode;
}

}  // namespace

absl::StatusOr<std::string> RunGpuEngineBench(const GpuEngineBenchOptions& o) {
  auto cfg = ModelConfig::Load((std::filesystem::path(o.model_dir) / "config.json").string());
  if (!cfg.ok()) return cfg.status();
  if (auto st = ApplyServingQuant(o.quantization, &*cfg); !st.ok()) return st;
  const ModelConfig& c = *cfg;
  if (o.batches.empty() || o.context <= 0 || o.steps <= 0) {
    return absl::InvalidArgumentError("batches, context and steps must be positive");
  }
  nlohmann::json out;
  auto hbm = DescribeDevice(o, &out);
  if (!hbm.ok()) return hbm.status();
  out["model"] = o.model_dir;
  out["quantization"] = WeightQuantName(c.weight_quant);
  if (auto st = AddGemmPeaks(o, &out); !st.ok()) return st;

  auto layout = BenchKvLayout(o, c);
  if (!layout.ok()) return layout.status();
  const int max_batch = std::max(0, *std::max_element(o.batches.begin(), o.batches.end()));
  // A decoding sequence at o.context (the interference and mixed runs'),
  // and the longest any gets (the executor's max_context).
  const int decode_len = DecodeTokens(o, o.context);
  const int longest = DecodeTokens(o, MaxBenchContext(o));
  std::shared_ptr<memory::KvArena> arena;  // outlives the allocator
  auto pool = CreateBenchPool(o, *layout, BenchKvBlocks(o, c, max_batch, decode_len), &arena);
  if (!pool.ok()) return pool.status();
  KvCache kv(*layout, pool->get());
  out["kv_pool"] = o.kv_pool;
  out["interleave_kv"] = o.interleave_kv;
  const GpuExecutorOptions eo = BenchExecutorOptions(o, max_batch, longest);
  out["deterministic"] = o.deterministic;
  out["fold_norms"] = o.fold_norms;
  out["fold_rope"] = o.fold_rope;
  const auto t_load = Clock::now();
  auto ex = cuda::CudaExecutor::Create(c, o.model_dir, &kv, eo);
  if (!ex.ok()) return ex.status();
  out["load_s"] = Seconds(t_load, Clock::now());
  cuda::CudaExecutor& e = **ex;
  out["weight_bytes"] = static_cast<double>(e.weight_bytes());
  // 8 tokens, or fewer where the executor's steps hold fewer.
  auto first = TimeFirstSteps(&e, &kv, c, std::min(8, eo.max_batch_tokens));
  if (!first.ok()) return first.status();
  out["first_steps_ms"] = *first;

  out["context_sigma"] = o.context_sigma;
  auto decode = MeasureDecode(o, c, *hbm, &kv, &e);
  if (!decode.ok()) return decode.status();
  out["decode"] = *decode;
  out["graph_replays"] = e.graph_replays();
  if (!o.mixed_chunks.empty()) {
    auto mixed = MeasureMixed(o, c, &kv, &e);
    if (!mixed.ok()) return mixed.status();
    out["mixed"] = *mixed;
  }
  if (o.concurrent_models > 1) {
    auto con = MeasureConcurrent(o, c, eo, &kv, &e);
    if (!con.ok()) return con.status();
    out["concurrent"] = *con;
  }
  if (o.prefill_tokens > 0) {
    auto p = MeasurePrefill(o, c, &kv, &e, out);
    if (!p.ok()) return p.status();
    out["prefill"] = *p;
    if (o.interference_batch > 0) {
      auto in = MeasureInterference(o, c, eo, &kv, &e, PromptFor(o.prefill_tokens, c));
      if (!in.ok()) return in.status();
      out["interference"] = *in;
    }
  }
  return out.dump(2);
}

}  // namespace ballast::engine
