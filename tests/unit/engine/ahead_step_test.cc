// Ahead steps (ModelEngine::BeginStep while a step is in flight): the same
// tokens, texts, finish reasons and log-probabilities as one step at a
// time, whatever ends a request (length, a stop string, a cancel); a
// sequence a step in flight computes for keeps its blocks until that step
// ends; penalties make the engine wait for the step in flight. On the CPU
// backend sampling in the step (cpu_sample_in_step), which draws from
// (seed, counter) as a GPU does.
#include <map>

#include "engine/model_engine.h"
#include "gtest/gtest.h"
#include "memory/kv_arena.h"
#include "memory/page_pool.h"
#include "tests/unit/engine/ahead_steps.h"
#include "tests/unit/engine/test_util.h"

namespace ballast::engine {
namespace {

using testing::Collect;
using testing::ExpectAllBlocksFree;
using testing::ExpectSame;
using testing::Mix;
using testing::RunAhead;
using testing::RunPlain;
using testing::TempDir;

class AheadStepTest : public ::testing::Test {
 protected:
  void SetUp() override { model_ = testing::WriteTinyModel(dir_, "m"); }
  // `arena`: elastic KV (else a static pool).
  std::unique_ptr<ModelEngine> Make(std::shared_ptr<memory::KvArena> arena = nullptr) {
    ModelEngineOptions o;
    o.name = "tiny";
    o.path = model_;
    o.kv_cache_bytes = 8 << 20;
    o.kv_arena = std::move(arena);
    o.max_batch_tokens = 64;
    o.block_tokens = 4;
    o.cpu_sample_in_step = true;
    auto e = ModelEngine::Create(o);
    EXPECT_TRUE(e.ok()) << e.status();
    return std::move(*e);
  }
  TempDir dir_;
  std::string model_;
};

TEST_F(AheadStepTest, SameTokensTextsAndLogprobsAsOneStepAtATime) {
  std::map<std::string, Collect> plain, ahead;
  const std::vector<GenerationRequest> mix = Mix();
  // Half at once, half while the first are decoding.
  auto submit = [&](ModelEngine& e, std::map<std::string, Collect>& sinks, int from, int to) {
    for (int i = from; i < to; ++i) {
      ASSERT_TRUE(e.Submit(mix[i], &sinks[mix[i].id]).ok());
    }
  };
  auto p = Make();
  submit(*p, plain, 0, 4);
  RunPlain(*p, [&](int i) {
    if (i == 5) submit(*p, plain, 4, 8);
  });
  auto a = Make();
  submit(*a, ahead, 0, 4);
  const int64_t ahead_steps = RunAhead(*a, [&](int i) {
    if (i == 5) submit(*a, ahead, 4, 8);
  });
  EXPECT_GT(ahead_steps, 10);
  for (const GenerationRequest& r : mix) ExpectSame(plain[r.id], ahead[r.id], r.id);
  EXPECT_EQ(ahead["r4"].logprobs.size(), ahead["r4"].ids.size());
  ExpectAllBlocksFree(*p);
  ExpectAllBlocksFree(*a);
}

// A stop string ends a request on a token an ahead step already fed: the
// ahead step's row is dropped, the text is cut as without ahead steps.
TEST_F(AheadStepTest, AStopStringEndsTheRequestAsWithoutAheadSteps) {
  GenerationRequest r = Mix()[1];
  r.params.max_tokens = 40;
  Collect probe;
  auto e = Make();
  ASSERT_TRUE(e->Submit(r, &probe).ok());
  RunPlain(*e);
  ASSERT_TRUE(probe.result.ok());
  ASSERT_GT(probe.result->text.size(), 8u);
  r.params.stop = {probe.result->text.substr(5, 2)};
  r.session_id = "chat";  // the turn's KV is kept: as much of it as without ahead steps
  Collect plain, ahead;
  auto p = Make();
  ASSERT_TRUE(p->Submit(r, &plain).ok());
  RunPlain(*p);
  auto a = Make();
  ASSERT_TRUE(a->Submit(r, &ahead).ok());
  EXPECT_GT(RunAhead(*a), 0);
  ExpectSame(plain, ahead, r.id);
  EXPECT_EQ(ahead.result->reason, FinishReason::kStop);
  EXPECT_EQ(a->CachedSessionTokens("chat"), p->CachedSessionTokens("chat"));
  EXPECT_EQ(a->stats().kv_blocks_free, p->stats().kv_blocks_free);
}

// A request cancelled while two steps are in flight: it is failed only
// once the step computing for it has ended (its blocks are in use until
// then); the other request's tokens are unchanged.
TEST_F(AheadStepTest, ACancelWaitsForTheStepInFlight) {
  GenerationRequest keep = Mix()[2], drop = Mix()[3];
  keep.params.max_tokens = drop.params.max_tokens = 30;
  Collect plain;
  auto p = Make();
  ASSERT_TRUE(p->Submit(keep, &plain).ok());
  RunPlain(*p);

  auto e = Make();
  Collect kept, dropped;
  ASSERT_TRUE(e->Submit(keep, &kept).ok());
  ASSERT_TRUE(e->Submit(drop, &dropped).ok());
  // Prefill, then decode with a step always queued behind another.
  for (int i = 0; i < 4; ++i) {
    if (!e->step_in_flight()) {
      ASSERT_TRUE(e->BeginStep());
    }
    while (e->CanBeginAhead() && e->BeginStep()) {
    }
    e->FinishStep();
  }
  ASSERT_EQ(e->steps_in_flight(), 1);
  ASSERT_TRUE(e->CanBeginAhead());
  e->Cancel(drop.id);
  ASSERT_TRUE(e->BeginStep());  // drains the cancel: the step in flight computes for it
  EXPECT_FALSE(dropped.done);
  e->FinishStep();
  EXPECT_TRUE(dropped.done);
  EXPECT_EQ(dropped.result.status().code(), absl::StatusCode::kCancelled);
  RunAhead(*e);
  ExpectSame(plain, kept, keep.id);
  ExpectAllBlocksFree(*e);
}

// Penalties count the output so far on the host: while such a request
// runs, no step is queued behind another, and its tokens are unchanged.
TEST_F(AheadStepTest, PenaltiesWaitForTheStepInFlight) {
  GenerationRequest pen = Mix()[1];
  pen.params.max_tokens = 20;
  pen.params.sampling.frequency_penalty = 1.5f;
  GenerationRequest other = Mix()[2];
  other.params.max_tokens = 30;
  std::map<std::string, Collect> plain, ahead;
  auto p = Make();
  ASSERT_TRUE(p->Submit(pen, &plain[pen.id]).ok());
  ASSERT_TRUE(p->Submit(other, &plain[other.id]).ok());
  RunPlain(*p);
  auto a = Make();
  ASSERT_TRUE(a->Submit(pen, &ahead[pen.id]).ok());
  ASSERT_TRUE(a->Submit(other, &ahead[other.id]).ok());
  bool ahead_with_penalties = false;
  RunAhead(*a,
           [&](int) { ahead_with_penalties |= !ahead[pen.id].done && a->steps_in_flight() > 1; });
  EXPECT_FALSE(ahead_with_penalties);
  // Once the penalised request is done, the other one goes ahead.
  EXPECT_GT(a->ahead_steps(), 0);
  ExpectSame(plain[pen.id], ahead[pen.id], pen.id);
  ExpectSame(plain[other.id], ahead[other.id], other.id);
  ExpectAllBlocksFree(*a);
}

// A request an ahead plan leaves waiting (it has penalties) is still a new
// one to the device's arbitration, not a preempted one (which would skip
// its SLO checks and jump the order).
TEST_F(AheadStepTest, ARequestLeftWaitingByAnAheadPlanIsNotTakenForPreempted) {
  GenerationRequest a = Mix()[0], pen = Mix()[2];
  a.params.max_tokens = 30;
  pen.params.sampling.presence_penalty = 1.0f;
  auto e = Make();
  Collect ca, cp;
  ASSERT_TRUE(e->Submit(a, &ca).ok());
  for (int i = 0; i < 3; ++i) {  // prefill, then decoding with a step in flight
    if (!e->step_in_flight()) {
      ASSERT_TRUE(e->BeginStep());
    }
    while (e->CanBeginAhead() && e->BeginStep()) {
    }
    e->FinishStep();
  }
  ASSERT_TRUE(e->CanBeginAhead());
  ASSERT_TRUE(e->Submit(pen, &cp).ok());
  ASSERT_TRUE(e->BeginStep());  // ahead: drains the request, leaves it waiting
  EXPECT_FALSE(e->CanBeginAhead());
  const std::vector<QueuedRequest> q = e->Queued();
  ASSERT_EQ(q.size(), 1u);
  EXPECT_EQ(q[0].id, pen.id);
  EXPECT_FALSE(q[0].preempted);
  RunAhead(*e);
  EXPECT_TRUE(ca.result.ok() && cp.result.ok());
  ExpectAllBlocksFree(*e);
}

// KV compaction with two steps in flight: MoveKvOutOf finishes them before
// it moves anything, and the outputs are those of one step at a time.
TEST_F(AheadStepTest, MovingKvWithStepsInFlightKeepsEveryOutput) {
  constexpr size_t kPage = 16 << 10;  // 16 blocks of 1 KiB a slab
  auto pool = std::shared_ptr<memory::HostPagePool>(
      *memory::HostPagePool::Create(kPage, 256 * static_cast<int64_t>(kPage)));
  memory::KvArenaOptions ao;
  ao.slab_bytes = kPage;
  ao.reserve_bytes = 256 * kPage;
  std::shared_ptr<memory::KvArena> arena = *memory::KvArena::Create(pool, ao);
  std::map<std::string, Collect> plain, moved;
  const std::vector<GenerationRequest> mix = Mix();
  auto p = Make();
  for (const auto& r : mix) ASSERT_TRUE(p->Submit(r, &plain[r.id]).ok());
  RunPlain(*p);
  auto a = Make(arena);
  for (const auto& r : mix) ASSERT_TRUE(a->Submit(r, &moved[r.id]).ok());
  int64_t bytes = 0;
  int with_steps_in_flight = 0;
  RunAhead(*a, [&](int) {
    const std::vector<int64_t> slabs = arena->BeginDrain(4);
    if (!slabs.empty()) {
      with_steps_in_flight += a->steps_in_flight() > 0 ? 1 : 0;
      auto m = a->MoveKvOutOf(slabs);
      ASSERT_TRUE(m.ok()) << m.status();
      EXPECT_FALSE(a->step_in_flight());
      bytes += *m;
    }
    arena->EndDrain();
  });
  EXPECT_GT(bytes, 0);
  EXPECT_GT(with_steps_in_flight, 0);
  for (const GenerationRequest& r : mix) ExpectSame(plain[r.id], moved[r.id], r.id);
  ExpectAllBlocksFree(*a);
}

}  // namespace
}  // namespace ballast::engine
