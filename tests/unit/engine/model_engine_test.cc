// ModelEngine: continuous batching, chunked prefill, preemption, session KV
// reuse and request validation, checked against plain greedy decoding.
#include "engine/model_engine.h"

#include <algorithm>
#include <atomic>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "memory/kv_arena.h"
#include "memory/page_pool.h"
#include "tests/unit/engine/executor_harness.h"
#include "tests/unit/engine/test_util.h"

namespace ballast::engine {
namespace {

using testing::TempDir;

class Collect : public GenerationSink {
 public:
  void OnToken(int id, const std::string& text, const TokenLogprobs*) override {
    ids.push_back(id);
    streamed += text;
  }
  void OnDone(absl::StatusOr<GenerationResult> r) override {
    result = std::move(r);
    done = true;
  }
  std::vector<int> ids;
  std::string streamed;
  bool done = false;
  absl::StatusOr<GenerationResult> result = absl::UnknownError("not done");
};

void RunUntilIdle(ModelEngine& e) {
  for (int i = 0; i < 100000 && e.HasWork(); ++i) e.Step();
  ASSERT_FALSE(e.HasWork());
}

std::vector<int> Prompt(int n, int salt) {
  std::vector<int> t = {ByteTokenizer::kBos};
  for (int i = 1; i < n; ++i) t.push_back((i * 31 + salt * 17) % 256);
  return t;
}

GenerationRequest Req(const std::string& id, std::vector<int> prompt, int max_tokens) {
  GenerationRequest r;
  r.id = id;
  r.prompt = std::move(prompt);
  r.params.max_tokens = max_tokens;
  r.params.ignore_eos = true;
  return r;
}

// Plain greedy decoding that recomputes the whole prefix every token.
std::vector<int> ReferenceGreedy(const std::string& model, std::vector<int> tokens, int n) {
  testing::ExecutorHarness h(model, 16);
  std::vector<int> out;
  for (int i = 0; i < n; ++i) {
    auto logits = h.PromptLogits(tokens);
    const int V = h.config.vocab_size;
    const float* last = logits.data() + logits.size() - V;
    const int id = static_cast<int>(std::max_element(last, last + V) - last);
    out.push_back(id);
    tokens.push_back(id);
  }
  return out;
}

class ModelEngineTest : public ::testing::Test {
 protected:
  void SetUp() override { model_ = testing::WriteTinyModel(dir_, "m"); }
  std::unique_ptr<ModelEngine> Make(int64_t kv_bytes = 8 << 20, int batch_tokens = 64,
                                    int block_tokens = 4) {
    ModelEngineOptions o;
    o.name = "tiny";
    o.path = model_;
    o.kv_cache_bytes = kv_bytes;
    o.max_batch_tokens = batch_tokens;
    o.block_tokens = block_tokens;
    auto e = ModelEngine::Create(o);
    EXPECT_TRUE(e.ok()) << e.status();
    return std::move(*e);
  }
  // A second model of another shape (Qwen2, 1 KV head of 16).
  std::string OtherModel() {
    SyntheticModelSpec other;
    other.architecture = "qwen2";
    other.hidden = 48;
    other.heads = 3;
    other.kv_heads = 1;
    other.seed = 9;
    return testing::WriteTinyModel(dir_, "m2", other);
  }
  // An elastic KV arena over `pages` host pages of 64 KiB (slab = page).
  static constexpr int64_t kPage = 64 << 10;
  struct Arena {
    std::shared_ptr<memory::HostPagePool> pool;
    std::shared_ptr<memory::KvArena> arena;
  };
  static Arena SmallArena(int pages) {
    Arena a;
    a.pool =
        std::shared_ptr<memory::HostPagePool>(*memory::HostPagePool::Create(kPage, pages * kPage));
    memory::KvArenaOptions ao;
    ao.slab_bytes = kPage;
    ao.reserve_bytes = 16 * kPage;
    a.arena = std::shared_ptr<memory::KvArena>(*memory::KvArena::Create(a.pool, ao));
    return a;
  }
  TempDir dir_;
  std::string model_;
};

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

namespace ballast::engine {
namespace {

const KvHolding* FindHolding(const std::vector<KvHolding>& hs, const std::string& id) {
  for (const auto& h : hs) {
    if (h.id == id) return &h;
  }
  return nullptr;
}

// Close: every queued, inbox and running request fails with the reason, and
// any later Submit is refused (the device worker closes an evicted engine).
TEST_F(ModelEngineTest, CloseFailsEverythingAndRefusesLaterSubmits) {
  Collect running, waiting, inbox, late;
  auto e = Make();
  ASSERT_TRUE(e->Submit(Req("r", Prompt(6, 1), 50), &running).ok());
  e->Step();
  ASSERT_TRUE(e->Submit(Req("w", Prompt(6, 2), 50), &waiting).ok());
  ASSERT_EQ(e->Queued().size(), 1u);  // drained into the waiting queue
  ASSERT_TRUE(e->Submit(Req("i", Prompt(6, 3), 50), &inbox).ok());
  e->Close(absl::UnavailableError("model tiny was evicted"));
  for (Collect* c : {&running, &waiting, &inbox}) {
    ASSERT_TRUE(c->done);
    EXPECT_EQ(c->result.status().code(), absl::StatusCode::kUnavailable);
    EXPECT_NE(c->result.status().message().find("evicted"), std::string::npos);
  }
  const absl::Status st = e->Submit(Req("late", Prompt(6, 4), 4), &late);
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(st.message().find("tiny"), std::string::npos) << st;
  EXPECT_NE(st.message().find("evicted"), std::string::npos) << st;
  EXPECT_FALSE(late.done);
  EXPECT_FALSE(e->HasWork());
  EXPECT_FALSE(e->Step());
  EXPECT_EQ(e->stats().running + e->stats().waiting, 0);
  EXPECT_EQ(e->stats().kv_blocks_free, e->stats().kv_blocks_total);
}

// AbortAll (a failed forward) fails everything now but keeps serving.
TEST_F(ModelEngineTest, AbortAllDoesNotClose) {
  Collect a, b;
  auto e = Make();
  ASSERT_TRUE(e->Submit(Req("a", Prompt(6, 1), 50), &a).ok());
  e->Step();
  e->AbortAll(absl::InternalError("forward failed"));
  EXPECT_EQ(a.result.status().code(), absl::StatusCode::kInternal);
  ASSERT_TRUE(e->Submit(Req("b", Prompt(6, 2), 4), &b).ok());
  RunUntilIdle(*e);
  ASSERT_TRUE(b.result.ok()) << b.result.status();
  EXPECT_EQ(b.result->output_tokens, ReferenceGreedy(model_, Prompt(6, 2), 4));
}

class CountingSink : public GenerationSink {
 public:
  void OnToken(int, const std::string&, const TokenLogprobs*) override {}
  void OnDone(absl::StatusOr<GenerationResult>) override { done.fetch_add(1); }
  std::atomic<int> done{0};
};

// Submit racing Close from other threads: every request is either refused
// by Submit or gets exactly one OnDone, never neither (no request hangs).
TEST_F(ModelEngineTest, SubmitRacingCloseNeverLeavesARequestHanging) {
  constexpr int kThreads = 4, kPerThread = 30, kRounds = 15;
  int accepted = 0, refused = 0;
  for (int round = 0; round < kRounds; ++round) {
    std::vector<CountingSink> sinks(kThreads * kPerThread);
    std::vector<absl::Status> results(sinks.size());
    auto e = Make();
    std::atomic<int> submitted{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        for (int i = 0; i < kPerThread; ++i) {
          const int k = t * kPerThread + i;
          results[k] = e->Submit(Req(absl::StrCat("r", k), Prompt(4, k), 2), &sinks[k]);
          submitted.fetch_add(1);
        }
      });
    }
    // This thread steps the engine (as the device worker would) and closes
    // it part-way through the submissions.
    const int close_after = (round % 3 + 1) * kThreads * kPerThread / 4;
    while (submitted.load() < close_after) e->Step();
    e->Close(absl::UnavailableError("model tiny was evicted"));
    for (auto& t : threads) t.join();
    for (size_t k = 0; k < sinks.size(); ++k) {
      if (results[k].ok()) {
        ++accepted;
        EXPECT_EQ(sinks[k].done.load(), 1) << "request " << k << " accepted but never finished";
      } else {
        ++refused;
        EXPECT_EQ(results[k].code(), absl::StatusCode::kUnavailable) << results[k];
        EXPECT_EQ(sinks[k].done.load(), 0) << "request " << k;
      }
    }
    EXPECT_FALSE(e->HasWork());
    CountingSink after;
    EXPECT_EQ(e->Submit(Req("after", Prompt(4, 0), 2), &after).code(),
              absl::StatusCode::kUnavailable);
  }
  EXPECT_GT(accepted, 0);
  EXPECT_GT(refused, 0);
}

// Device-wide shedding: the engine lists what holds KV (cached sessions and
// running requests) and gives back exactly the one named; a preempted
// request recomputes later with the same output.
TEST_F(ModelEngineTest, KvHoldingsAndShedGiveBackSessionsAndRunningRequests) {
  Collect first, lo, hi;
  auto e = Make();
  auto r = Req("t1", Prompt(12, 3), 4);
  r.session_id = "s";
  r.priority = 2;
  ASSERT_TRUE(e->Submit(r, &first).ok());
  RunUntilIdle(*e);
  auto rl = Req("lo", Prompt(10, 1), 8);
  rl.priority = -1;
  auto rh = Req("hi", Prompt(10, 2), 8);
  rh.priority = 3;
  ASSERT_TRUE(e->Submit(rl, &lo).ok());
  ASSERT_TRUE(e->Submit(rh, &hi).ok());
  e->Step();  // both admitted
  const std::vector<KvHolding> hs = e->KvHoldings();
  ASSERT_EQ(hs.size(), 3u);
  const KvHolding* cached = FindHolding(hs, "s");
  const KvHolding* l = FindHolding(hs, "lo");
  const KvHolding* h = FindHolding(hs, "hi");
  ASSERT_TRUE(cached && l && h);
  EXPECT_EQ(cached->kind, KvHolding::Kind::kCachedSession);
  EXPECT_EQ(cached->priority, 2);
  EXPECT_EQ(l->kind, KvHolding::Kind::kRunning);
  EXPECT_EQ(l->priority, -1);
  EXPECT_EQ(h->priority, 3);
  EXPECT_LT(cached->recency, l->recency);
  EXPECT_LT(l->recency, h->recency);  // admission order
  for (const KvHolding* x : {cached, l, h}) EXPECT_GT(x->bytes, 0);
  // With slabs: each holding's blocks by slab add up to its bytes.
  for (const KvHolding& x : e->KvHoldings(/*with_slabs=*/true)) {
    int64_t blocks = 0;
    for (const memory::SlabBlocks& s : x.slabs) blocks += s.blocks;
    EXPECT_FALSE(x.slabs.empty()) << x.id;
    EXPECT_EQ(blocks * static_cast<int64_t>(e->kv_block_bytes()), x.bytes) << x.id;
  }

  const int64_t free_before = e->stats().kv_blocks_free;
  EXPECT_EQ(e->Shed(*l), l->bytes);
  EXPECT_EQ(e->stats().kv_blocks_free - free_before,
            l->bytes / static_cast<int64_t>(e->kv_block_bytes()));
  EXPECT_EQ(e->stats().running, 1);
  EXPECT_EQ(e->stats().preemptions, 1);
  EXPECT_EQ(e->Shed(*l), 0);  // no longer running
  EXPECT_EQ(e->Shed(*cached), cached->bytes);
  EXPECT_EQ(e->stats().cached_sessions, 0);
  EXPECT_EQ(e->Shed(*cached), 0);
  RunUntilIdle(*e);
  ASSERT_TRUE(lo.result.ok() && hi.result.ok());
  EXPECT_EQ(lo.result->preemptions, 1);
  EXPECT_EQ(lo.result->output_tokens, ReferenceGreedy(model_, Prompt(10, 1), 8));
  EXPECT_EQ(hi.result->output_tokens, ReferenceGreedy(model_, Prompt(10, 2), 8));
  EXPECT_EQ(e->stats().kv_blocks_free, e->stats().kv_blocks_total);
}

// Recency is steady-clock time, so holdings of two models on one device
// compare: a session kept on `a` earlier is older than one kept on `b` later.
TEST_F(ModelEngineTest, KvHoldingRecencyComparesAcrossEngines) {
  Collect ca, cb, run;
  auto a = Make(), b = Make();
  auto ra = Req("ta", Prompt(8, 1), 2);
  ra.session_id = "sa";
  ASSERT_TRUE(a->Submit(ra, &ca).ok());
  RunUntilIdle(*a);
  auto rb = Req("tb", Prompt(8, 2), 2);
  rb.session_id = "sb";
  ASSERT_TRUE(b->Submit(rb, &cb).ok());
  RunUntilIdle(*b);
  ASSERT_TRUE(a->Submit(Req("late", Prompt(8, 3), 50), &run).ok());
  a->Step();
  const auto ha = a->KvHoldings(), hb = b->KvHoldings();
  ASSERT_TRUE(FindHolding(ha, "sa") && FindHolding(hb, "sb") && FindHolding(ha, "late"));
  EXPECT_LT(FindHolding(ha, "sa")->recency, FindHolding(hb, "sb")->recency);
  EXPECT_LT(FindHolding(hb, "sb")->recency, FindHolding(ha, "late")->recency);
  a->Cancel("late");
  RunUntilIdle(*a);
}

// ShedKv keeps its rule: cached sessions first, then running requests,
// lowest priority first, newest first among equals.
TEST_F(ModelEngineTest, ShedKvTakesCachedSessionsThenLowestPriorityNewestFirst) {
  Collect s, p0, p1, q;
  auto e = Make();
  auto rs = Req("t", Prompt(8, 1), 2);
  rs.session_id = "s";
  ASSERT_TRUE(e->Submit(rs, &s).ok());
  RunUntilIdle(*e);
  auto rq = Req("q", Prompt(8, 4), 6);
  rq.priority = 5;
  ASSERT_TRUE(e->Submit(Req("p0", Prompt(8, 2), 6), &p0).ok());
  ASSERT_TRUE(e->Submit(Req("p1", Prompt(8, 3), 6), &p1).ok());
  ASSERT_TRUE(e->Submit(rq, &q).ok());
  e->Step();
  EXPECT_GT(e->ShedKv(1), 0);
  EXPECT_EQ(e->stats().cached_sessions, 0);
  EXPECT_EQ(e->stats().running, 3);
  std::vector<std::string> order;
  for (int i = 0; i < 3; ++i) {
    EXPECT_GT(e->ShedKv(1), 0);
    order.push_back(e->Queued().front().id);  // the last preempted waits first
  }
  EXPECT_EQ(order, (std::vector<std::string>{"p1", "p0", "q"}));
  EXPECT_EQ(e->ShedKv(1), 0);  // nothing left to give
  RunUntilIdle(*e);
  for (Collect* c : {&p0, &p1, &q}) ASSERT_TRUE(c->result.ok()) << c->result.status();
  EXPECT_EQ(p1.result->output_tokens, ReferenceGreedy(model_, Prompt(8, 3), 6));
}

// Regression: cached session KV that fills the pool must not keep a new
// request waiting forever (admission counted it as used; nothing evicted it).
TEST_F(ModelEngineTest, CachedSessionKvDoesNotBlockNewRequests) {
  const size_t block_bytes = 2 * 4 * 2 * 16 * 4;
  Collect c1, c2;
  auto e = Make(static_cast<int64_t>(block_bytes) * 24, 64, 4);
  auto r1 = Req("s1", Prompt(30, 1), 6);  // keeps 35 tokens: 18 of 24 blocks
  r1.session_id = "s";
  ASSERT_TRUE(e->Submit(r1, &c1).ok());
  RunUntilIdle(*e);
  ASSERT_EQ(e->stats().cached_sessions, 1);
  ASSERT_TRUE(e->Submit(Req("n", Prompt(20, 2), 4), &c2).ok());
  for (int i = 0; i < 1000 && e->HasWork(); ++i) e->Step();
  ASSERT_TRUE(c2.done) << "request waits forever behind cached session KV";
  ASSERT_TRUE(c2.result.ok()) << c2.result.status();
  EXPECT_EQ(c2.result->output_tokens, ReferenceGreedy(model_, Prompt(20, 2), 4));
}

}  // namespace
}  // namespace ballast::engine
