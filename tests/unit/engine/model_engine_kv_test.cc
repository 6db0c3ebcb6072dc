// ModelEngine's lifecycle (Close, AbortAll, Submit racing Close) and its KV
// as the device sees it: holdings and shedding (device-wide shedding's
// inputs), recency across engines, cached sessions, and compaction (blocks
// moved out of draining slabs, outputs unchanged).
#include <algorithm>
#include <atomic>

#include "absl/strings/str_cat.h"
#include "engine/model_engine.h"
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
  // A static pool has no slabs to give back.
  for (const KvHolding& x : e->KvHoldings(/*with_slabs=*/true)) EXPECT_TRUE(x.slabs.empty());

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

// Planning who sheds does not wait for the device: PeekKvHoldings lists
// the running requests with a step in flight and leaves it in flight
// (KvHoldings ends it first). A request that step finishes is still
// listed by the peek, and gone once the step ends.
TEST_F(ModelEngineTest, PeekKvHoldingsLeavesTheStepInFlight) {
  Collect shortr, longr;
  auto e = Make();
  ASSERT_TRUE(e->Submit(Req("short", Prompt(10, 1), 1), &shortr).ok());
  ASSERT_TRUE(e->Submit(Req("long", Prompt(10, 2), 8), &longr).ok());
  ASSERT_TRUE(e->BeginStep());  // the prefills: "short" ends with this step
  ASSERT_TRUE(e->step_in_flight());
  const std::vector<KvHolding> peek = e->PeekKvHoldings();
  EXPECT_TRUE(e->step_in_flight());
  ASSERT_TRUE(FindHolding(peek, "short") && FindHolding(peek, "long"));
  for (const KvHolding& h : peek) EXPECT_GT(h.bytes, 0) << h.id;
  const std::vector<KvHolding> now = e->KvHoldings();
  EXPECT_FALSE(e->step_in_flight());
  EXPECT_EQ(FindHolding(now, "short"), nullptr);
  ASSERT_NE(FindHolding(now, "long"), nullptr);
  EXPECT_EQ(FindHolding(now, "long")->recency, FindHolding(peek, "long")->recency);
  // Nothing is in flight now: the peek is what KvHoldings gives.
  const std::vector<KvHolding> again = e->PeekKvHoldings();
  ASSERT_EQ(again.size(), now.size());
  EXPECT_EQ(again[0].id, now[0].id);
  EXPECT_EQ(again[0].bytes, now[0].bytes);
  RunUntilIdle(*e);
  ASSERT_TRUE(shortr.result.ok() && longr.result.ok());
  EXPECT_EQ(longr.result->output_tokens, ReferenceGreedy(model_, Prompt(10, 2), 8));
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

// Compaction: with sequences running and a session kept, the slabs the
// arena drains are emptied by moving the engine's blocks (nobody is
// preempted), the holdings no longer name them, and every output, the
// session's next turn included, is what plain greedy decoding gives.
TEST_F(ModelEngineTest, MoveKvOutOfDrainingSlabsKeepsOutputsExact) {
  Arena a = SmallArena(16);
  ModelEngineOptions o;
  o.name = "tiny";
  o.path = model_;
  o.block_tokens = 4;
  o.kv_arena = a.arena;
  auto e = std::move(*ModelEngine::Create(o));
  Collect turn1;
  auto r1 = Req("t1", Prompt(40, 9), 6);
  r1.session_id = "s";
  ASSERT_TRUE(e->Submit(r1, &turn1).ok());
  RunUntilIdle(*e);
  ASSERT_TRUE(turn1.result.ok()) << turn1.result.status();
  // Long and short requests share slabs; the short ones finish first and
  // leave holes in every slab.
  std::vector<Collect> out(8);
  auto length = [](int i) { return i % 2 == 0 ? 40 : 2; };
  for (int i = 0; i < 8; ++i) {
    ASSERT_TRUE(e->Submit(Req(absl::StrCat("r", i), Prompt(100, i), length(i)), &out[i]).ok());
  }
  for (int i = 0; i < 12; ++i) e->Step();
  for (int i = 1; i < 8; i += 2) ASSERT_TRUE(out[i].done) << i;
  ASSERT_FALSE(out[0].done);
  // Each holding's blocks by slab add up to its bytes.
  for (const KvHolding& x : e->KvHoldings(/*with_slabs=*/true)) {
    int64_t blocks = 0;
    for (const memory::SlabBlocks& s : x.slabs) blocks += s.blocks;
    EXPECT_EQ(blocks * static_cast<int64_t>(e->kv_block_bytes()), x.bytes) << x.id;
  }
  const memory::KvArenaStats before = a.arena->stats();
  const std::vector<memory::SlabBlocks> in_use = a.arena->SlabsInUse();
  const std::vector<int64_t> slabs = a.arena->BeginDrain(3);
  ASSERT_FALSE(slabs.empty());
  int64_t blocks = 0;
  for (const memory::SlabBlocks& u : in_use) {
    if (std::binary_search(slabs.begin(), slabs.end(), u.slab)) blocks += u.blocks;
  }
  auto moved = e->MoveKvOutOf(slabs);
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_EQ(*moved, blocks * static_cast<int64_t>(e->kv_block_bytes()));
  EXPECT_TRUE(a.arena->draining().empty());  // all emptied
  a.arena->EndDrain();
  a.arena->ReclaimFreeSlabs();
  EXPECT_EQ(a.arena->stats().slabs_formatted,
            before.slabs_formatted - static_cast<int64_t>(slabs.size()));
  EXPECT_EQ(a.arena->stats().blocks_used, before.blocks_used);
  for (const KvHolding& x : e->KvHoldings(/*with_slabs=*/true)) {
    for (const memory::SlabBlocks& s : x.slabs) {
      EXPECT_FALSE(std::binary_search(slabs.begin(), slabs.end(), s.slab)) << x.id;
    }
  }
  RunUntilIdle(*e);
  for (int i = 0; i < 8; ++i) {
    ASSERT_TRUE(out[i].result.ok()) << i << " " << out[i].result.status();
    EXPECT_EQ(out[i].result->preemptions, 0) << i;
    EXPECT_EQ(out[i].result->output_tokens, ReferenceGreedy(model_, Prompt(100, i), length(i)))
        << i;
  }
  // The session's next turn reads its moved KV.
  std::vector<int> next = Prompt(40, 9);
  next.insert(next.end(), turn1.result->output_tokens.begin(), turn1.result->output_tokens.end());
  next.push_back(7);
  Collect turn2;
  auto r2 = Req("t2", next, 5);
  r2.session_id = r1.session_id;
  ASSERT_TRUE(e->Submit(r2, &turn2).ok());
  RunUntilIdle(*e);
  ASSERT_TRUE(turn2.result.ok()) << turn2.result.status();
  EXPECT_GT(turn2.result->cached_tokens, 0);
  EXPECT_EQ(turn2.result->output_tokens, ReferenceGreedy(model_, next, 5));
}

}  // namespace
}  // namespace ballast::engine
