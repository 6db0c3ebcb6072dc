// Parameter remapping on the CUDA backend: streamed layers (copied from the
// pinned host image into their slots on a copy stream, ordered by events,
// captured into CUDA graphs) give bit-identical logits and tokens for
// α = 1 and several α, one and two slots, and a plan changed (remapped
// and reverted) between the steps of one generation; the copy stall is
// timed on the device.
#include <cuda_runtime.h>

#include "absl/time/clock.h"

#include "engine/cuda/cuda_executor.h"
#include "engine/gpu_backend.h"
#include "engine/model_engine.h"
#include "memory/balloon.h"
#include "memory/gpu_page_pool.h"
#include "tests/gpu/gpu_harness.h"
#include "tests/unit/engine/test_util.h"

namespace ballast::engine {
namespace {

SyntheticModelSpec EightLayers() {
  SyntheticModelSpec s = testing::GpuTestModelSpec();
  s.layers = 8;
  s.intermediate = 2048;  // a layer spans several 2 MiB pages
  return s;
}

std::vector<int> Prompt(int n) {
  std::vector<int> t = {ByteTokenizer::kBos};
  for (int i = 1; i < n; ++i) t.push_back((i * 37 + 11) % 256);
  return t;
}

TEST(CudaRemap, StreamedLayersGiveBitIdenticalLogits) {
  BALLAST_SKIP_WITHOUT_GPU();
  testing::TempDir dir;
  const std::string model = testing::WriteTinyModel(dir, "m", EightLayers());
  testing::GpuHarness h(model, 16);
  const std::vector<int> prompt = Prompt(300);
  const std::vector<float> want = h.PromptLogits(prompt, 128);
  for (int slots : {1, 2}) {
    for (int alpha : {1, 2, 3, 6 - slots}) {
      memory::StreamingPlan p;
      p.alpha = alpha;
      p.slots = slots;
      p.streamed = memory::StreamedLayers(8, alpha + slots);
      ASSERT_TRUE(h.executor->SetLayerStreaming(p).ok());
      EXPECT_EQ(h.PromptLogits(prompt, 128), want) << "alpha " << alpha << " slots " << slots;
    }
  }
  EXPECT_GT(h.executor->streaming_stats().streamed_bytes, 0);
  ASSERT_TRUE(h.executor->SetLayerStreaming({}).ok());
  EXPECT_EQ(h.PromptLogits(prompt, 128), want);
}

struct Sink : GenerationSink {
  void OnToken(int, const std::string&, const TokenLogprobs*) override {}
  void OnDone(absl::StatusOr<GenerationResult> r) override { result = std::move(r); }
  absl::StatusOr<GenerationResult> result = absl::UnknownError("not done");
};

// Greedy tokens of three requests decoding together (graph replays), with
// `schedule[i]` = {α, β} set before step i (the last entry repeats).
absl::StatusOr<std::vector<std::vector<int>>> Generate(
    const ModelEngineOptions& base, const std::vector<std::pair<int, int>>& schedule,
    int64_t* lent_max, LayerStreamingStats* stats = nullptr) {
  auto pool = memory::CreateGpuPagePool(0, 2u << 20, 1ll << 30);
  if (!pool.ok()) return pool.status();
  memory::BalloonOptions bo;
  bo.memory_bytes = 1ll << 30;
  bo.slab_bytes = 2u << 20;
  auto balloon = memory::Balloon::Create(std::move(*pool), bo);
  if (!balloon.ok()) return balloon.status();
  ModelEngineOptions o = base;
  auto need = ModelEngine::WeightBytesNeeded(o);
  if (!need.ok()) return need.status();
  auto pages = (*balloon)->MapWeights(static_cast<size_t>(*need));
  if (!pages.ok()) return pages.status();
  std::shared_ptr<memory::WeightPages> shared = std::move(*pages);
  o.weight_pages = shared;
  o.kv_arena = (*balloon)->arena();
  auto e = ModelEngine::Create(o);
  if (!e.ok()) return e.status();
  WeightRemapper* r = (*e)->remapper();
  if (r == nullptr) return absl::InternalError("no remapper");
  Sink sinks[3];
  for (int i = 0; i < 3; ++i) {
    GenerationRequest req;
    req.id = std::to_string(i);
    req.prompt = Prompt(40 + 17 * i);
    req.params.max_tokens = 40;
    req.params.ignore_eos = true;
    if (auto st = (*e)->Submit(req, &sinks[i]); !st.ok()) return st;
  }
  size_t step = 0;
  while ((*e)->HasWork()) {
    const auto [alpha, slots] = schedule[std::min(step, schedule.size() - 1)];
    auto got = r->SetAlpha(alpha, slots);
    if (!got.ok()) return got.status();
    *lent_max = std::max(*lent_max, shared->lent_bytes());
    (*e)->Step();
    ++step;
  }
  if (stats != nullptr) *stats = r->streaming_stats();
  std::vector<std::vector<int>> out;
  for (auto& s : sinks) {
    if (!s.result.ok()) return s.result.status();
    out.push_back(s.result->output_tokens);
  }
  return out;
}

// The engine both generation tests run: the eight-layer model, 64-token steps.
ModelEngineOptions EightLayerEngine(const testing::TempDir& dir) {
  ModelEngineOptions o;
  o.name = "m";
  o.backend = "cuda";
  o.path = testing::WriteTinyModel(dir, "m", EightLayers());
  o.max_batch_tokens = 64;
  return o;
}

TEST(CudaRemap, TokensStayExactWhileLayersAreLentStreamedAndTakenBack) {
  BALLAST_SKIP_WITHOUT_GPU();
  testing::TempDir dir;
  const ModelEngineOptions o = EightLayerEngine(dir);
  int64_t lent = 0;
  auto want = Generate(o, {{0, 0}}, &lent);
  ASSERT_TRUE(want.ok()) << want.status();
  EXPECT_EQ(lent, 0);
  for (int slots : {1, 2}) {
    auto whole = Generate(o, {{3, slots}}, &lent);  // lent throughout: graph replays stream
    ASSERT_TRUE(whole.ok()) << whole.status();
    EXPECT_EQ(*whole, *want) << "slots " << slots;
    EXPECT_GT(lent, 0);
  }
  // Remapped and reverted between steps, both slot counts.
  auto mixed = Generate(o,
                        {{1, 1},
                         {1, 1},
                         {1, 1},
                         {4, 2},
                         {4, 2},
                         {4, 2},
                         {2, 1},
                         {2, 1},
                         {0, 0},
                         {0, 0},
                         {5, 2},
                         {5, 2},
                         {5, 2},
                         {5, 2},
                         {1, 2},
                         {1, 2},
                         {3, 1},
                         {0, 0}},
                        &lent);
  ASSERT_TRUE(mixed.ok()) << mixed.status();
  EXPECT_EQ(*mixed, *want);
}

// The copy stall (compute waiting for a streamed layer) is timed on the
// device, in plain steps and in graph replays: a small model's layers
// compute in less time than one layer takes to copy from host memory, so
// streaming stalls; the stall never exceeds the wall time of the steps,
// and a step with nothing streamed adds none.
TEST(CudaRemap, CopyStallIsTimedOnTheDevice) {
  BALLAST_SKIP_WITHOUT_GPU();
  testing::TempDir dir;
  const std::string model = testing::WriteTinyModel(dir, "m", EightLayers());
  testing::GpuHarness h(model, 16);
  const std::vector<int> prompt = Prompt(300);
  memory::StreamingPlan p;
  p.alpha = 3;
  p.slots = 1;
  p.streamed = memory::StreamedLayers(8, 4);
  ASSERT_TRUE(h.executor->SetLayerStreaming(p).ok());
  const absl::Time t0 = absl::Now();
  for (int i = 0; i < 4; ++i) h.PromptLogits(prompt, 128);
  const double wall = absl::ToDoubleSeconds(absl::Now() - t0);
  ASSERT_TRUE(h.executor->SetLayerStreaming({}).ok());  // harvests the last step
  const double stall = h.executor->streaming_stats().stall_seconds;
  EXPECT_GT(stall, 0);
  EXPECT_LT(stall, wall);
  h.PromptLogits(prompt, 128);  // nothing streamed
  EXPECT_EQ(h.executor->streaming_stats().stall_seconds, stall);

  // Decode steps replayed from CUDA graphs.
  const ModelEngineOptions o = EightLayerEngine(dir);
  int64_t lent = 0;
  LayerStreamingStats graphs;
  const absl::Time t1 = absl::Now();
  auto got = Generate(o, {{3, 1}, {3, 1}, {3, 1}, {0, 0}}, &lent, &graphs);
  const double gen_wall = absl::ToDoubleSeconds(absl::Now() - t1);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_GT(graphs.stall_seconds, 0);
  EXPECT_LT(graphs.stall_seconds, gen_wall);
  LayerStreamingStats whole;
  ASSERT_TRUE(Generate(o, {{3, 1}}, &lent, &whole).ok());  // lent throughout: graph replays
  EXPECT_GT(whole.stall_seconds, graphs.stall_seconds);
}

// Graph replays alone raise the stall, and the step-end join is timed.
// With α = 1 and one slot homed at layer 3, layer 7 is copied in after
// layer 3 (three layers hide part of it) and layer 3's reload starts after
// layer 7, the last: nothing hides it, so the join waits about one whole
// copy a step. Decode steps of one sequence are captured once and then
// replayed; the replays' stall is the increase after the capture.
TEST(CudaRemap, GraphReplaysAloneAreTimed) {
  BALLAST_SKIP_WITHOUT_GPU();
  testing::TempDir dir;
  const std::string model = testing::WriteTinyModel(dir, "m", EightLayers());
  testing::GpuHarness h(model, 16);
  auto* cuda = dynamic_cast<cuda::CudaExecutor*>(h.executor.get());
  ASSERT_NE(cuda, nullptr);
  const std::vector<int> prompt = Prompt(64);
  const int steps = 24;
  SequenceKv seq;
  ASSERT_TRUE(h.kv->Reserve(&seq, static_cast<int>(prompt.size()) + steps + 2).ok());
  std::vector<float> out;
  auto step = [&](int start, absl::Span<const int> tokens) {
    SequenceChunk c;
    c.kv = &seq;
    c.start_pos = start;
    c.tokens = tokens;
    c.logits = LogitsMode::kLast;
    return h.executor->Forward({c}, &out);
  };
  memory::StreamingPlan p;
  p.alpha = 1;
  p.slots = 1;
  p.streamed = {3, 7};
  ASSERT_TRUE(h.executor->SetLayerStreaming(p).ok());
  ASSERT_TRUE(step(0, prompt).ok());
  int pos = static_cast<int>(prompt.size());
  const int tok = 65;
  ASSERT_TRUE(step(pos++, absl::MakeConstSpan(&tok, 1)).ok());  // warm-up run and capture
  const double before = h.executor->streaming_stats().stall_seconds;
  const int64_t replays = cuda->graph_replays();
  const absl::Time t0 = absl::Now();
  for (int i = 0; i < steps; ++i) ASSERT_TRUE(step(pos++, absl::MakeConstSpan(&tok, 1)).ok());
  const double wall = absl::ToDoubleSeconds(absl::Now() - t0);
  EXPECT_EQ(cuda->graph_replays() - replays, steps);
  const double replayed = h.executor->streaming_stats().stall_seconds - before;
  auto copy_s = h.executor->MeasureLayerTransferSeconds();  // the fastest of three copies
  ASSERT_TRUE(copy_s.ok()) << copy_s.status();
  // The join alone stalls about one copy a step (the fastest copy is the
  // bound), and layer 7 adds the part of its copy that layers 4-6 do not
  // hide. Without the join timed, the stall was that part alone.
  EXPECT_GT(replayed, steps * *copy_s) << "one copy " << *copy_s << " s, wall " << wall;
  EXPECT_LT(replayed, wall);
  h.kv->Release(&seq);
}

// FP8 weights: a layer's scales live inside its extent and stream with it.
TEST(CudaRemap, Fp8LayersStreamWithTheirScales) {
  BALLAST_SKIP_WITHOUT_GPU();
  testing::TempDir dir;
  ModelEngineOptions o = EightLayerEngine(dir);
  // Twice the intermediate size: an E4M3 layer still spans several pages.
  SyntheticModelSpec spec = EightLayers();
  spec.intermediate = 4096;
  o.path = testing::WriteTinyModel(dir, "fp8", spec);
  o.quantization = "fp8";
  int64_t lent = 0;
  auto want = Generate(o, {{0, 0}}, &lent);
  ASSERT_TRUE(want.ok()) << want.status();
  for (int slots : {1, 2}) {
    lent = 0;
    auto got = Generate(o, {{1, 1}, {3, slots}, {3, slots}, {0, 0}, {2, slots}}, &lent);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, *want) << "slots " << slots;
    EXPECT_GT(lent, 0);
  }
}

// The host image in a node's pinned arena, in chunks smaller than a layer
// (so layers straddle chunks and each layer copy is several pieces), and
// with its chunks lent from the arena's middle (not adjacent): streamed
// layers still give the same tokens, and the chunks go back with the engine.
TEST(CudaRemap, StreamsFromAHostImageScatteredOverArenaChunks) {
  BALLAST_SKIP_WITHOUT_GPU();
  testing::TempDir dir;
  ModelEngineOptions o = EightLayerEngine(dir);
  int64_t lent = 0;
  auto want = Generate(o, {{0, 0}}, &lent);
  ASSERT_TRUE(want.ok()) << want.status();
  auto arena = CreatePinnedHostArena(256ll << 20, 1u << 20);  // 1 MiB chunks
  ASSERT_TRUE(arena.ok()) << arena.status();
  // Every other chunk taken: the image's chunks are not adjacent.
  std::vector<HostChunks> held;
  for (int i = 0; i < 64; ++i) {
    auto c = (*arena)->Take(1);
    ASSERT_TRUE(c.ok());
    held.push_back(std::move(*c));
  }
  for (int i = 1; i < 64; i += 2) (*arena)->Give(held[static_cast<size_t>(i)]);
  for (int i = 1; i < 32; ++i) held[static_cast<size_t>(i)] = held[static_cast<size_t>(2 * i)];
  held.resize(32);
  const int64_t free_before = (*arena)->free_bytes();
  o.host_arena = *arena;
  auto streamed = Generate(o, {{3, 1}, {3, 1}, {5, 2}, {0, 0}, {2, 1}}, &lent);
  ASSERT_TRUE(streamed.ok()) << streamed.status();
  EXPECT_EQ(*streamed, *want);
  EXPECT_GT(lent, 0);
  EXPECT_EQ((*arena)->free_bytes(), free_before);  // the engine is gone, its image too
  for (const HostChunks& c : held) (*arena)->Give(c);
}

}  // namespace
}  // namespace ballast::engine
