// ModelEngine: continuous batching, chunked prefill, preemption, session KV
// reuse and request validation, checked against plain greedy decoding.
#include "engine/model_engine.h"

#include <algorithm>
#include <atomic>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/unit/engine/model_engine_fixture.h"

namespace ballast::engine {
namespace {

using testing::Collect;
using testing::ModelEngineTest;
using testing::Prompt;
using testing::ReferenceGreedy;
using testing::Req;
using testing::RunUntilIdle;

TEST_F(ModelEngineTest, GreedyMatchesReferenceDecoding) {
  auto e = Make();
  Collect c;
  ASSERT_TRUE(e->Submit(Req("a", Prompt(10, 1), 12), &c).ok());
  RunUntilIdle(*e);
  ASSERT_TRUE(c.result.ok()) << c.result.status();
  EXPECT_EQ(c.result->output_tokens, ReferenceGreedy(model_, Prompt(10, 1), 12));
  EXPECT_EQ(c.ids, c.result->output_tokens);
  EXPECT_EQ(c.result->reason, FinishReason::kLength);
  EXPECT_EQ(c.streamed, c.result->text);
  EXPECT_GE(c.result->ttft_ms, c.result->queue_ms);
}

TEST_F(ModelEngineTest, ConcurrentChunkedRequestsMatchSoloRuns) {
  // Budget 8 tokens per step: prompts of 30 prefill in chunks beside decodes.
  auto e = Make(8 << 20, /*batch_tokens=*/8);
  std::vector<Collect> sinks(5);
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(e->Submit(Req(absl::StrCat("r", i), Prompt(6 + 6 * i, i), 8), &sinks[i]).ok());
  }
  RunUntilIdle(*e);
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(sinks[i].result.ok());
    EXPECT_EQ(sinks[i].result->output_tokens, ReferenceGreedy(model_, Prompt(6 + 6 * i, i), 8))
        << "request " << i;
  }
  EXPECT_GT(e->stats().steps, 10);
}

TEST_F(ModelEngineTest, PreemptionUnderMemoryPressureKeepsOutputsExact) {
  // 2 layers x 4-token blocks; 24 blocks hold 48 token-positions in all.
  ModelEngineOptions probe;
  const size_t block_bytes = 2 * 4 * 2 * 16 * 4;  // K+V, 4 tokens, 2 kv heads, head 16, f32
  auto e = Make(static_cast<int64_t>(block_bytes) * 24, 64, 4);
  std::vector<Collect> sinks(4);
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(e->Submit(Req(absl::StrCat("p", i), Prompt(8, i), 12), &sinks[i]).ok());
  }
  RunUntilIdle(*e);
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(sinks[i].result.ok()) << sinks[i].result.status();
    EXPECT_EQ(sinks[i].result->output_tokens, ReferenceGreedy(model_, Prompt(8, i), 12));
  }
  EXPECT_GT(e->stats().preemptions, 0);
  EXPECT_EQ(e->stats().kv_blocks_free, e->stats().kv_blocks_total);  // nothing leaked
}

TEST_F(ModelEngineTest, RequestLargerThanThePoolFailsClearly) {
  const size_t block_bytes = 2 * 4 * 2 * 16 * 4;
  auto e = Make(static_cast<int64_t>(block_bytes) * 4, 64, 4);  // 8 positions
  Collect c;
  auto st = e->Submit(Req("big", Prompt(20, 0), 4), &c);
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(st.message().find("KV blocks"), std::string::npos);
  // 6 + 3 - 1 = 8 positions fit exactly; one more token does not.
  EXPECT_TRUE(e->Submit(Req("fits", Prompt(6, 0), 3), &c).ok());
  EXPECT_FALSE(e->Submit(Req("over", Prompt(6, 0), 4), &c).ok());
  RunUntilIdle(*e);
  ASSERT_TRUE(c.result.ok()) << c.result.status();
}

TEST_F(ModelEngineTest, SessionTurnReusesKeptKv) {
  auto e = Make();
  Collect t1;
  auto r1 = Req("t1", Prompt(12, 3), 6);
  r1.session_id = "s";
  ASSERT_TRUE(e->Submit(r1, &t1).ok());
  RunUntilIdle(*e);
  ASSERT_TRUE(t1.result.ok());
  EXPECT_EQ(t1.result->kv_source, KvSource::kNone);
  EXPECT_EQ(e->stats().cached_sessions, 1);

  std::vector<int> history = r1.prompt;
  history.insert(history.end(), t1.result->output_tokens.begin(), t1.result->output_tokens.end());
  std::vector<int> prompt2 = history;
  for (int t : {'h', 'i', '!'}) prompt2.push_back(t);
  Collect t2;
  auto r2 = Req("t2", prompt2, 6);
  r2.session_id = "s";
  r2.history_tokens = static_cast<int>(history.size());
  ASSERT_TRUE(e->Submit(r2, &t2).ok());
  RunUntilIdle(*e);
  ASSERT_TRUE(t2.result.ok());
  EXPECT_EQ(t2.result->kv_source, KvSource::kDevice);
  EXPECT_EQ(t2.result->cached_tokens, static_cast<int>(history.size()) - 1);
  EXPECT_EQ(t2.result->output_tokens, ReferenceGreedy(model_, prompt2, 6));

  // Without kept KV the same turn is recomputed, with the same tokens.
  auto fresh = Make();
  Collect t3;
  ASSERT_TRUE(fresh->Submit(r2, &t3).ok());
  RunUntilIdle(*fresh);
  ASSERT_TRUE(t3.result.ok());
  EXPECT_EQ(t3.result->kv_source, KvSource::kRecomputed);
  EXPECT_EQ(t3.result->output_tokens, t2.result->output_tokens);

  e->DropSession("s");
  RunUntilIdle(*e);
  EXPECT_EQ(e->stats().cached_sessions, 0);
  EXPECT_EQ(e->stats().kv_blocks_free, e->stats().kv_blocks_total);
}

TEST_F(ModelEngineTest, ValidationErrors) {
  auto e = Make();
  Collect c;
  EXPECT_EQ(e->Submit(Req("x", {}, 4), &c).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(e->Submit(Req("x", {1, 2}, 0), &c).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(e->Submit(Req("x", {1, 2}, 1023), &c).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(e->Submit(Req("x", std::vector<int>(1024, 5), 1), &c).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(e->Submit(Req("x", {99999}, 1), &c).code(), absl::StatusCode::kInvalidArgument);
  auto bad = Req("x", {1, 2}, 4);
  bad.params.sampling.top_p = 2.0f;
  EXPECT_EQ(e->Submit(bad, &c).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(e->HasWork());
}

TEST_F(ModelEngineTest, CancelStopsARequestAndFreesItsBlocks) {
  auto e = Make();
  Collect c;
  ASSERT_TRUE(e->Submit(Req("c", Prompt(10, 2), 500), &c).ok());
  e->Step();
  e->Step();
  EXPECT_FALSE(c.done);
  e->Cancel("c");
  RunUntilIdle(*e);
  EXPECT_EQ(c.result.status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(e->stats().kv_blocks_free, e->stats().kv_blocks_total);
}

// The device worker's arbitration drains cancellations (Queued) and then
// skips an engine with no work left: its stats must already be current.
TEST_F(ModelEngineTest, StatsAreCurrentAfterACancelWithoutAStep) {
  auto e = Make();
  Collect c;
  ASSERT_TRUE(e->Submit(Req("c", Prompt(10, 2), 500), &c).ok());
  e->Step();
  e->Step();
  EXPECT_EQ(e->stats().running, 1);
  e->Cancel("c");
  e->Queued();  // what arbitration calls
  EXPECT_FALSE(e->HasWork());
  EXPECT_EQ(e->stats().running, 0);
  EXPECT_EQ(e->stats().waiting, 0);
  EXPECT_EQ(e->stats().kv_blocks_free, e->stats().kv_blocks_total);
}

TEST_F(ModelEngineTest, SeededSamplingIsReproducibleAndStopStringsCut) {
  auto e = Make();
  auto r = Req("s1", Prompt(5, 9), 40);
  r.params.sampling = {1.0f, 0.9f, 20};
  r.params.seed = 1234;
  Collect a, b;
  ASSERT_TRUE(e->Submit(r, &a).ok());
  r.id = "s2";
  ASSERT_TRUE(e->Submit(r, &b).ok());
  RunUntilIdle(*e);
  ASSERT_TRUE(a.result.ok() && b.result.ok());
  EXPECT_EQ(a.result->output_tokens, b.result->output_tokens);
  // Use a piece of the produced text as a stop string: output ends before it.
  const std::string text = a.result->text;
  ASSERT_GT(text.size(), 6u);
  const std::string stop = text.substr(3, 2);
  r.id = "s3";
  r.params.stop = {stop};
  Collect s;
  ASSERT_TRUE(e->Submit(r, &s).ok());
  RunUntilIdle(*e);
  ASSERT_TRUE(s.result.ok());
  EXPECT_EQ(s.result->reason, FinishReason::kStop);
  EXPECT_EQ(s.result->text, text.substr(0, text.find(stop)));
  EXPECT_EQ(s.streamed, s.result->text);
}

// A model's floor keeps arena room for it; another model's request that
// needs that room waits (it is not rejected) and runs, with exact output,
// once the floor is lowered at runtime.
TEST_F(ModelEngineTest, KvFloorHoldsRoomUntilLoweredAtRuntime) {
  const std::string model2 = OtherModel();
  // Not a structured binding: clang 14 cannot capture one in the lambda.
  Arena small = SmallArena(4);
  auto& arena = small.arena;
  auto make = [&](const std::string& name, const std::string& path, memory::TenantLimits l) {
    ModelEngineOptions o;
    o.name = name;
    o.path = path;
    o.block_tokens = 4;
    o.kv_arena = arena;
    o.kv_limits = l;
    return std::move(*ModelEngine::Create(o));
  };
  memory::TenantLimits floor3;
  floor3.floor_bytes = 3 * kPage;
  auto a = make("a", model_, floor3);
  auto b = make("b", model2, {});
  // b's request needs 2 of the 4 pages (160 blocks of 512 bytes); a's floor
  // leaves it 1.
  Collect cb;
  ASSERT_TRUE(b->Submit(Req("b1", Prompt(300, 4), 20), &cb).ok());
  for (int i = 0; i < 50; ++i) b->Step();
  EXPECT_FALSE(cb.done);
  EXPECT_TRUE(b->HasWork());
  ASSERT_TRUE(a->SetKvLimits({}).ok());
  RunUntilIdle(*b);
  ASSERT_TRUE(cb.result.ok()) << cb.result.status();
  EXPECT_EQ(cb.result->output_tokens, ReferenceGreedy(model2, Prompt(300, 4), 20));
  // Static pools have no tenant limits to move.
  EXPECT_EQ(Make()->SetKvLimits({}).code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace ballast::engine

namespace ballast::engine {
namespace {

// Elastic mode: two models of different shapes share one KV arena; each
// can use the memory the other leaves, and outputs stay exact.
TEST_F(ModelEngineTest, ModelsShareOneKvArena) {
  const std::string model2 = OtherModel();
  Arena small = SmallArena(4);  // 4 pages of KV in all (not a structured
  auto& pool = small.pool;      // binding: clang 14 cannot capture one)
  auto& arena = small.arena;
  auto make = [&](const std::string& name, const std::string& path) {
    ModelEngineOptions o;
    o.name = name;
    o.path = path;
    o.block_tokens = 4;
    o.kv_arena = arena;
    return std::move(*ModelEngine::Create(o));
  };
  auto a = make("a", model_), b = make("b", model2);
  // a: 2 layers x (K+V) x 4 tokens x 2 heads x 16 x f32 = 1 KiB blocks; 64 per page.
  EXPECT_EQ(a->stats().kv_blocks_total, 4 * 64);
  Collect ca, cb;
  ASSERT_TRUE(a->Submit(Req("a1", Prompt(300, 1), 20), &ca).ok());  // ~160 blocks of a
  a->Step();  // a 256-token prefill chunk: 128 of a's blocks, 2 of the 4 pages
  b->Step();  // idle step: refreshes b's view of the arena
  // b (512-byte blocks) now sees only the 2 pages a left.
  EXPECT_EQ(b->stats().kv_blocks_total, 2 * (64 << 10) / 512);
  ASSERT_TRUE(b->Submit(Req("b1", Prompt(40, 2), 10), &cb).ok());
  for (int i = 0; i < 10000 && (a->HasWork() || b->HasWork()); ++i) {
    a->Step();
    b->Step();
  }
  ASSERT_TRUE(ca.result.ok()) << ca.result.status();
  ASSERT_TRUE(cb.result.ok()) << cb.result.status();
  EXPECT_EQ(ca.result->output_tokens, ReferenceGreedy(model_, Prompt(300, 1), 20));
  EXPECT_EQ(cb.result->output_tokens, ReferenceGreedy(model2, Prompt(40, 2), 10));
  // Everything freed; the arena keeps at most its free-slab buffer mapped.
  EXPECT_EQ(arena->stats().blocks_used, 0);
  EXPECT_LE(pool->stats().mapped_bytes, 2 * (64 << 10));
  // A request larger than the whole arena is refused up front.
  EXPECT_EQ(a->Submit(Req("huge", Prompt(900, 3), 100), &ca).code(),
            absl::StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace ballast::engine
