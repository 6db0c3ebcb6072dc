// Parameter remapping on the CPU backend: outputs are bit-identical with
// any streaming plan (α = 1 and several α, one and two slots, a plan
// changed between the steps of one generation), lent layers' pages return
// to the balloon and come back on reversion, and the timing cap holds.
#include "engine/weight_remapper.h"

#include "gtest/gtest.h"
#include "memory/balloon.h"
#include "memory/page_pool.h"
#include "tests/unit/engine/executor_harness.h"
#include "tests/unit/engine/test_util.h"

namespace ballast::engine {
namespace {

using testing::TempDir;

SyntheticModelSpec EightLayers() {
  SyntheticModelSpec s;
  s.layers = 8;
  return s;
}

std::vector<int> Prompt(int n) {
  std::vector<int> t = {ByteTokenizer::kBos};
  for (int i = 1; i < n; ++i) t.push_back((i * 37 + 11) % 256);
  return t;
}

memory::StreamingPlan Plan(int n, int alpha, int slots) {
  memory::StreamingPlan p;
  p.alpha = alpha;
  p.slots = slots;
  p.streamed = memory::StreamedLayers(n, alpha + slots);
  return p;
}

TEST(WeightRemapper, StreamedLayersGiveBitIdenticalLogits) {
  TempDir dir;
  const std::string model = testing::WriteTinyModel(dir, "m", EightLayers());
  testing::ExecutorHarness h(model, 4);
  const std::vector<int> prompt = Prompt(19);
  const std::vector<float> want = h.PromptLogits(prompt, 5);
  for (int slots : {1, 2}) {
    for (int alpha : {1, 2, 3, 6 - slots}) {
      ASSERT_TRUE(h.executor->SetLayerStreaming(Plan(8, alpha, slots)).ok());
      EXPECT_EQ(h.PromptLogits(prompt, 5), want) << "alpha " << alpha << " slots " << slots;
    }
  }
  const LayerStreamingStats st = h.executor->streaming_stats();
  EXPECT_GT(st.streamed_bytes, 0);
  ASSERT_TRUE(h.executor->SetLayerStreaming({}).ok());
  EXPECT_EQ(h.PromptLogits(prompt, 5), want);
  memory::StreamingPlan bad = Plan(8, 2, 1);
  bad.streamed.push_back(9);
  EXPECT_EQ(h.executor->SetLayerStreaming(bad).code(), absl::StatusCode::kInvalidArgument);
}

// A balloon over host pages with the model's weight pages, as an elastic
// device maps them.
struct Device {
  std::shared_ptr<memory::Balloon> balloon;
  std::shared_ptr<memory::WeightPages> pages;
};

Device MakeDevice(const ModelEngineOptions& o, int64_t memory) {
  Device d;
  auto pool = memory::HostPagePool::Create(4096, memory);
  EXPECT_TRUE(pool.ok());
  memory::BalloonOptions bo;
  bo.memory_bytes = memory;
  bo.slab_bytes = 64 << 10;
  d.balloon = *memory::Balloon::Create(std::shared_ptr<memory::PagePool>(std::move(*pool)), bo);
  auto need = ModelEngine::WeightBytesNeeded(o);
  EXPECT_TRUE(need.ok());
  auto pages = d.balloon->MapWeights(static_cast<size_t>(*need));
  EXPECT_TRUE(pages.ok()) << pages.status();
  d.pages = std::move(*pages);
  return d;
}

class Sink : public GenerationSink {
 public:
  void OnToken(int, const std::string&, const TokenLogprobs*) override {}
  void OnDone(absl::StatusOr<GenerationResult> r) override { result = std::move(r); }
  absl::StatusOr<GenerationResult> result = absl::UnknownError("not done");
};

TEST(WeightRemapper, LendsPagesChangesPlanMidStreamAndRevertsWithSameTokens) {
  TempDir dir;
  ModelEngineOptions o;
  o.name = "m";
  o.path = testing::WriteTinyModel(dir, "m", EightLayers());
  o.block_tokens = 4;
  o.max_batch_tokens = 16;
  auto want = testing::GreedyTokens(o, Prompt(23), 24);
  ASSERT_TRUE(want.ok()) << want.status();

  Device d = MakeDevice(o, 64 << 20);
  o.weight_pages = d.pages;
  o.kv_arena = d.balloon->arena();
  auto e = ModelEngine::Create(o);
  ASSERT_TRUE(e.ok()) << e.status();
  WeightRemapper* r = (*e)->remapper();
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->num_layers(), 8);
  Sink sink;
  GenerationRequest req;
  req.id = "a";
  req.prompt = Prompt(23);
  req.params.max_tokens = 24;
  req.params.ignore_eos = true;
  ASSERT_TRUE((*e)->Submit(req, &sink).ok());
  const int64_t free0 = d.balloon->FreeBytes();
  const int64_t weights0 = d.balloon->stats().weight_bytes;
  // Between steps: lend 1, then 3, then revert to 2, then 0 layers.
  const int schedule[] = {1, 1, 3, 3, 3, 2, 2, 0, 0, 5, 5, 0};
  int step = 0;
  int64_t lent_max = 0;
  while ((*e)->HasWork()) {
    const int alpha = schedule[std::min<int>(step, std::size(schedule) - 1)];
    auto freed = r->SetAlpha(alpha, 1 + step % 2);  // slots forced: no timing in the test
    ASSERT_TRUE(freed.ok()) << freed.status();
    EXPECT_EQ(r->alpha(), alpha);
    EXPECT_EQ(d.pages->lent_bytes(), weights0 - d.balloon->stats().weight_bytes);
    lent_max = std::max(lent_max, d.pages->lent_bytes());
    if (alpha > 0) {
      EXPECT_GT(d.pages->lent_bytes(), 0) << "alpha " << alpha;
    }
    (*e)->Step();
    ++step;
  }
  ASSERT_TRUE(sink.result.ok()) << sink.result.status();
  EXPECT_EQ(sink.result->output_tokens, *want);
  EXPECT_GE(lent_max, 5 * (r->layer_bytes() - 2 * 4096));  // 5 layers' inner pages
  ASSERT_TRUE(r->SetAlpha(0).ok());
  EXPECT_EQ(d.pages->lent_bytes(), 0);
  EXPECT_EQ(d.balloon->stats().weight_bytes, weights0);
  EXPECT_GE(d.balloon->FreeBytes(), free0 - (64 << 10) * 8);  // KV slabs may stay mapped
  EXPECT_GT(r->remaps(), 0);
  EXPECT_GT(r->reverts(), 0);
  EXPECT_GT(r->t_compute(), 0);
  EXPECT_GT(r->t_transfer(), 0);
  EXPECT_EQ(r->SetAlpha(8).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(WeightRemapper, TakingLayersBackWithoutRoomChangesNothing) {
  TempDir dir;
  ModelEngineOptions o;
  o.name = "m";
  o.path = testing::WriteTinyModel(dir, "m", EightLayers());
  Device d = MakeDevice(o, 8 << 20);
  o.weight_pages = d.pages;
  o.kv_arena = d.balloon->arena();
  auto e = ModelEngine::Create(o);
  ASSERT_TRUE(e.ok()) << e.status();
  WeightRemapper* r = (*e)->remapper();
  ASSERT_TRUE(r->SetAlpha(4).ok());
  // KV takes every free page.
  auto kv = *d.balloon->arena()->CreateAllocator(4096);
  std::vector<int> blocks;
  while (true) {
    auto b = kv->Allocate(1);
    if (!b.ok()) break;
    blocks.push_back((*b)[0]);
  }
  ASSERT_FALSE(blocks.empty());
  const int64_t lent = d.pages->lent_bytes();
  EXPECT_EQ(r->SetAlpha(0).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(r->alpha(), 4);
  EXPECT_EQ(d.pages->lent_bytes(), lent);
  ASSERT_TRUE(kv->Free(blocks).ok());
  d.balloon->arena()->ReclaimFreeSlabs();
  EXPECT_TRUE(r->SetAlpha(0).ok());
  EXPECT_EQ(d.pages->lent_bytes(), 0);
}

}  // namespace
}  // namespace ballast::engine
