// policy.kv_paged (sim_device_kv.cc): KV held block by block as the
// daemon's engine holds it, the newest request preempted where growth does
// not fit, and its recompute; against outcomes computed by hand (an engine
// whose step takes a constant 10 ms), and conservation on a bursty trace.
#include <gtest/gtest.h>

#include <array>

#include "absl/strings/str_cat.h"
#include "bench/generators.h"
#include "bench/report.h"
#include "sim/simulator.h"
#include "tests/unit/sim/sim_test_util.h"

namespace ballast::sim {
namespace {

using testing::ConstantEngine;
using testing::Find;
using testing::Model;
using testing::Req;

// One GPU of `models`' weights and room for `kv_tokens` tokens of
// llama-1b KV (32 KiB a token: 93 blocks of 16 for 1,500 tokens).
SimConfig Paged(std::vector<SimModel> models, int kv_tokens) {
  const ModelShape s = *NamedShape("llama-1b");
  SimConfig c;
  c.cluster.gpu_memory_bytes =
      static_cast<int64_t>(models.size()) * s.weight_bytes() + kv_tokens * s.kv_bytes_per_token();
  c.models = std::move(models);
  c.policy.min_kv_fraction = 0;
  c.policy.kv_paged = true;
  return c;
}

TEST(PagedKvTest, BothRequestsStartAndTheNewestIsPreemptedWhenGrowthRunsOut) {
  // Whole reservations run these one after the other (the second's TTFT
  // 5,010 ms: SimulatorTest.KvThatDoesNotFitWaitsForRoom). Held block by
  // block, both run: the first prefills in the first step (its 32 blocks),
  // the second, arriving at the same instant, in the step after (the one
  // planned ahead; 32 blocks more fit). After step n the first has
  // generated n tokens and the second n - 1; at step 238 they need 47
  // blocks each (738 and 737 tokens), 94 of the 93: the older grows, and
  // the newer, the one then short, is preempted (736 tokens of KV given
  // back, 237 generated). It waits until the first ends (5,000 ms),
  // recomputes its 737 tokens in one step (its 238th token) and decodes
  // the last 262.
  auto r = Simulate(Paged({Model("a")}, 1500), ConstantEngine(),
                    {Req("1", "a", 0, 500, 500), Req("2", "a", 0, 500, 500)});
  ASSERT_TRUE(r.ok()) << r.status();
  const auto &one = Find(*r, "1"), &two = Find(*r, "2");
  EXPECT_EQ(two.status, "OK");
  EXPECT_NEAR(one.ttft_ms(), 10, 1e-6);
  EXPECT_NEAR(one.e2e_ms(), 5000, 1e-6);
  EXPECT_EQ(one.preemptions, 0);
  EXPECT_NEAR(two.ttft_ms(), 20, 1e-6);  // the first token's time stays
  EXPECT_EQ(two.preemptions, 1);
  EXPECT_EQ(two.output_tokens, 500);
  EXPECT_EQ(r->stats.preemptions, 1);
  EXPECT_EQ(r->stats.recomputed_tokens, 736);
  EXPECT_NEAR(two.e2e_ms(), 5000 + 10 + 262 * 10, 1e-6);
  const bench::Report rep = bench::Summarize(r->replay, 1.0, 1e9);
  EXPECT_EQ(rep.total.preemptions, 1);
  EXPECT_EQ(rep.total.preempted_requests, 1);
}

// Ahead steps: as a model begins a step, the node plans its next one at
// once, and the running requests' blocks for that step are taken then
// (ReserveAhead), before another model's admission can take them. Room for
// 3,200 tokens (200 blocks of 16), 2,048 tokens a step. At 0, A (3,000
// tokens, model a) prefills 2,048 in its first step and holds its second
// chunk's blocks (188 in all) from the start; C (model b) decodes beside
// it, so the GPU admits between their steps. B (500 tokens: 32 blocks, and
// a block for each running request's growth) arrives for model c at 5 ms:
// 222 blocks do not fit, so B waits for A to end. (When the blocks were
// taken only as A's second step began, B was admitted at 5 ms and then
// preempted for A's second chunk.)
TEST(PagedKvTest, AheadStepsHoldTheNextChunksBlocksBeforeOtherModelsAdmit) {
  SimConfig c = Paged({Model("a"), Model("b"), Model("c")}, 3200);
  c.policy.max_batch_tokens = 2048;
  ASSERT_TRUE(c.policy.rolling_steps && c.policy.ahead_steps);
  auto r =
      Simulate(c, ConstantEngine(),
               {Req("A", "a", 0, 3000, 2), Req("C", "b", 0, 16, 50), Req("B", "c", 0.005, 500, 2)});
  ASSERT_TRUE(r.ok()) << r.status();
  const auto &a = Find(*r, "A"), &b = Find(*r, "B");
  for (const char* id : {"A", "B", "C"}) EXPECT_EQ(Find(*r, id).status, "OK") << id;
  EXPECT_EQ(r->stats.preemptions, 0);
  EXPECT_EQ(b.preemptions, 0);
  EXPECT_EQ(r->stats.remap.kv_wait_requests, 1);
  // B's prefill begins once A has ended and given its blocks back.
  EXPECT_GE(b.ttft_ms() + 5, a.e2e_ms()) << b.ttft_ms() << " " << a.e2e_ms();
}

TEST(PagedKvTest, WholeReservationsNeverPreempt) {
  SimConfig c = Paged({Model("a")}, 1500);
  c.policy.kv_paged = false;
  auto r = Simulate(c, ConstantEngine(), {Req("1", "a", 0, 500, 500), Req("2", "a", 0, 500, 500)});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_NEAR(Find(*r, "2").ttft_ms(), 5010, 1e-6);
  EXPECT_EQ(r->stats.preemptions, 0);
}

TEST(PagedKvTest, ChargedWorkspaceTakesItsRoomFromKv) {
  // The engine's buffers beside the weights: with the memory grown by
  // them, the same run as above; without, no request fits at all.
  const SimModel a = Model("a");
  const int64_t ws = EngineWorkspaceBytes(a.shape, 8192, a.max_seqs);
  SimConfig c = Paged({a}, 1500);
  c.policy.charge_workspace = true;
  auto none = Simulate(c, ConstantEngine(), {Req("1", "a", 0, 500, 500)});
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_NE(Find(*none, "1").status, "OK");
  c.cluster.gpu_memory_bytes += ws;
  auto r = Simulate(c, ConstantEngine(), {Req("1", "a", 0, 500, 500), Req("2", "a", 0, 500, 500)});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_NEAR(Find(*r, "1").e2e_ms(), 5000, 1e-6);
  EXPECT_EQ(Find(*r, "2").preemptions, 1);
  EXPECT_EQ(r->stats.recomputed_tokens, 736);
}

// page_mib (the node's slab_mib): the weights take whole pages and the KV
// arena carves whole pages of the rest, so the KV room is rounded down;
// the room the first decision sees (the arbitration CSV's kv_free) is
// worked out here.
TEST(PagedKvTest, PagesRoundTheWeightsUpAndTheKvRoomDown) {
  const SimModel a = Model("a");
  const int64_t weights = a.shape.weight_bytes(), per_token = a.shape.kv_bytes_per_token();
  for (const int page_mib : {0, 2, 8}) {
    SCOPED_TRACE(page_mib);
    SimConfig c = Paged({a}, 1500);
    c.policy.page_mib = page_mib;
    auto r = Simulate(c, ConstantEngine(), {Req("1", "a", 0, 500, 10)}, 1.0, true);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_FALSE(r->arbitration.empty());
    const int64_t page = static_cast<int64_t>(page_mib) << 20;
    int64_t room = 1500 * per_token;
    if (page > 0) {
      const int64_t mapped = (weights + page - 1) / page * page;
      room = (weights + 1500 * per_token - mapped) / page * page;
    }
    EXPECT_EQ(r->arbitration[0].kv_free, room);
    EXPECT_EQ(Find(*r, "1").status, "OK");
  }
}

TEST(PagedKvTest, AnotherModelsNewerRequestGivesWayFirst) {
  // x (model a) is admitted first, y (model b) a step later, and both
  // grow alike: 94 blocks of room, so x's growth is the one that runs
  // short (95), and the device's newest request gives way: b's y, taken
  // as another model's newer request, never a's x.
  for (bool rolling : {false, true}) {
    SCOPED_TRACE(rolling ? "rolling" : "lockstep");
    SimConfig c = Paged({Model("a"), Model("b")}, 1510);
    c.policy.rolling_steps = rolling;
    auto r =
        Simulate(c, ConstantEngine(), {Req("x", "a", 0, 500, 600), Req("y", "b", 0.005, 500, 600)});
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(Find(*r, "x").preemptions, 0);
    EXPECT_EQ(Find(*r, "y").preemptions, 1);
    EXPECT_EQ(Find(*r, "y").status, "OK");
    EXPECT_NEAR(Find(*r, "x").ttft_ms(), 10, 1e-6);
    EXPECT_LT(Find(*r, "x").end_s, Find(*r, "y").end_s);
  }
}

// The scenario above, rolling, by hand: 94 blocks of room; x (model a) is
// admitted at 0 and y (model b, arriving at 5 ms while x steps alone) at
// x's first step's end, 10 ms; then both step every 10 ms, each planning
// its next step as one begins. At 2.53 s x has 253 tokens and its decode
// needs a 48th block (753 tokens of KV) while y holds 47: 95 of 94.
SimConfig VictimScenario(bool wait, bool ahead_asks_nobody, double host_s) {
  SimConfig c = Paged({Model("a"), Model("b")}, 1510);
  c.policy.growth_waits_for_victims = wait;
  c.policy.ahead_growth_asks_nobody = ahead_asks_nobody;
  c.policy.step_host_s = host_s;
  return c;
}
const std::vector<bench::TraceRecord> kVictimTrace = {Req("x", "a", 0, 500, 600),
                                                      Req("y", "b", 0.005, 500, 600)};

// x's step planned ahead for 2.53 s finds no room for its block: x sits
// out of it (nothing to step), and its next plan, made then with the whole
// ladder, must preempt y, whose step (2.53-2.54 s) is in flight. Waiting
// for it (the daemon's DrainVictims), x steps 2.54-2.55 s and y keeps that
// step's token (one token more to recompute: 752, not 751); y's next step
// has no room for its 48th block either, so nothing else was queued.
// Preempting at once, x steps 2.53-2.54 s and y loses that token.
TEST(PagedKvTest, GrowthWaitsForTheVictimsStepInFlight) {
  auto waited = Simulate(VictimScenario(true, true, 0), ConstantEngine(), kVictimTrace);
  auto at_once = Simulate(VictimScenario(false, true, 0), ConstantEngine(), kVictimTrace);
  ASSERT_TRUE(waited.ok() && at_once.ok());
  for (const SimResult* r : {&*waited, &*at_once}) {
    EXPECT_EQ(Find(*r, "x").preemptions, 0);
    EXPECT_EQ(Find(*r, "y").preemptions, 1);
    EXPECT_EQ(Find(*r, "y").status, "OK");
  }
  EXPECT_NEAR(Find(*waited, "x").e2e_ms(), 6010, 1e-6);
  EXPECT_NEAR(Find(*at_once, "x").e2e_ms(), 6000, 1e-6);
  EXPECT_EQ(waited->stats.recomputed_tokens, 752);
  EXPECT_EQ(at_once->stats.recomputed_tokens, 751);
  EXPECT_EQ(waited->stats.victim_drains, 1);
  EXPECT_NEAR(waited->stats.victim_drain_s, 0.010, 1e-9);
  EXPECT_EQ(at_once->stats.victim_drains, 0);
}

// With 2 ms of host time a step planned afresh takes 12 ms and one
// planned ahead 10 (its host time hidden), so x's and y's steps part: x's
// ahead step due at 2.532 s finds no room, and y's step (2.524-2.534 s)
// is in flight with its next one planned ahead and queued behind it.
// Waiting, the device plans nothing, but y's queued step begins (2.534-
// 2.544 s: on the GPU already in the daemon); x's growth waits 12 ms in
// all and its step, planned afresh, runs 2.544-2.556 s; y keeps two more
// tokens. Without the wait, x's plan preempts y at once and steps 2.532-
// 2.544 s.
TEST(PagedKvTest, AVictimsQueuedStepRunsBeforeTheGrowthGoesOn) {
  auto waited = Simulate(VictimScenario(true, true, 0.002), ConstantEngine(), kVictimTrace);
  auto at_once = Simulate(VictimScenario(false, true, 0.002), ConstantEngine(), kVictimTrace);
  ASSERT_TRUE(waited.ok() && at_once.ok());
  EXPECT_NEAR(waited->stats.victim_drain_s, 0.012, 1e-9);
  EXPECT_NEAR(Find(*waited, "x").e2e_ms(), 6016, 1e-6);
  EXPECT_NEAR(Find(*at_once, "x").e2e_ms(), 6004, 1e-6);
  EXPECT_EQ(waited->stats.recomputed_tokens, at_once->stats.recomputed_tokens + 2);
}

// The plan made ahead asks nobody (policy.ahead_growth_asks_nobody, the
// daemon's BatchPlanner): x's step due at 2.532 s, out of room, goes
// without x, so x plans again at once, afresh, and its 2 ms of host time
// are no longer hidden (x ends at 6,004 ms). Growing in the step planned
// ahead (the old rule) preempts y there and hides them (6,002 ms).
TEST(PagedKvTest, APlanMadeAheadLeavesOutWhatDoesNotFit) {
  auto nobody = Simulate(VictimScenario(false, true, 0.002), ConstantEngine(), kVictimTrace);
  auto grows = Simulate(VictimScenario(false, false, 0.002), ConstantEngine(), kVictimTrace);
  ASSERT_TRUE(nobody.ok() && grows.ok());
  EXPECT_NEAR(Find(*nobody, "x").e2e_ms(), 6004, 1e-6);
  EXPECT_NEAR(Find(*grows, "x").e2e_ms(), 6002, 1e-6);
  EXPECT_EQ(nobody->stats.recomputed_tokens, grows->stats.recomputed_tokens);
  EXPECT_EQ(Find(*nobody, "y").preemptions, 1);
}

TEST(PagedKvTest, AdmissionLeavesABlockPerRunningRequest) {
  // 1,000 tokens of room (62 blocks). The first request's 600-token
  // prompt takes 38 blocks; the second's 360 need 23, and with the first's
  // block of headroom that is 62: admitted at once (for the step after the
  // first's, TTFT 20 ms). A second of 376 tokens (24 blocks) would leave
  // less than that headroom: it waits until the first ends (20 ms).
  auto r = Simulate(Paged({Model("a")}, 1000), ConstantEngine(),
                    {Req("1", "a", 0, 600, 2), Req("2", "a", 0, 360, 2)});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_NEAR(Find(*r, "2").ttft_ms(), 20, 1e-6);
  auto w = Simulate(Paged({Model("a")}, 1000), ConstantEngine(),
                    {Req("1", "a", 0, 600, 2), Req("2", "a", 0, 376, 2)});
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_NEAR(Find(*w, "2").ttft_ms(), 30, 1e-6);
  EXPECT_EQ(w->stats.preemptions, 0);
}

TEST(PagedKvTest, AdmissionLeavesABlockForEveryModelsRunningRequest) {
  // As above with the second request another model's: the first's growth
  // may preempt it just the same (it is the GPU's newest), so its block of
  // headroom counts too. 360 tokens are admitted beside the first; 376
  // wait until it ends, and nobody is preempted.
  for (const auto& [tokens, waits] : {std::pair{360, false}, std::pair{376, true}}) {
    SCOPED_TRACE(tokens);
    auto r = Simulate(Paged({Model("a"), Model("b")}, 1000), ConstantEngine(),
                      {Req("1", "a", 0, 600, 2), Req("2", "b", 0, tokens, 2)});
    ASSERT_TRUE(r.ok()) << r.status();
    const auto &one = Find(*r, "1"), &two = Find(*r, "2");
    if (waits) {
      EXPECT_GE(two.ttft_ms(), one.e2e_ms());
    } else {
      EXPECT_LT(two.ttft_ms(), one.e2e_ms());
    }
    EXPECT_EQ(r->stats.preemptions, 0);
  }
}

TEST(PagedKvTest, AStepAdmitsOnlyWhatItsTokenBudgetCarries) {
  // 64 tokens a step: the first request's 64-token prompt fills the step,
  // so the second waits for a step with room.
  SimConfig c = Paged({Model("a")}, 100000);
  c.policy.max_batch_tokens = 64;
  auto r = Simulate(c, ConstantEngine(), {Req("1", "a", 0, 64, 3), Req("2", "a", 0, 10, 3)});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_NEAR(Find(*r, "1").ttft_ms(), 10, 1e-6);
  // Admitted for the step after (planned as the first begins: the first's
  // prompt is computed by then, a decode of one token, 63 left).
  EXPECT_NEAR(Find(*r, "2").ttft_ms(), 20, 1e-6);
  // A 64-token second request does not fit beside that decode: a step later.
  auto full = Simulate(c, ConstantEngine(), {Req("1", "a", 0, 64, 3), Req("2", "a", 0, 64, 3)});
  ASSERT_TRUE(full.ok()) << full.status();
  EXPECT_NEAR(Find(*full, "2").ttft_ms(), 30, 1e-6);
}

TEST(PagedKvTest, BurstyTraceUnderPressureIsDeterministicAndConserved) {
  bench::BurstyParams p;
  for (int i = 0; i < 4; ++i) p.models.push_back(absl::StrCat("m", i));
  p.duration_s = 60;
  p.burst_rate = 20;
  p.persistent_rate = 10;
  p.lengths = {1024, 1.0, 256, 0.8, 1.0, 2048, 512};
  const std::vector<bench::TraceRecord> trace = bench::GenerateBursty(p);
  SimConfig c = Paged({}, 0);
  c.cluster.gpu_memory_bytes = 11LL << 30;  // four 1B models, about 1 GiB of KV
  for (int i = 0; i < 4; ++i) c.models.push_back(Model(absl::StrCat("m", i)));
  std::array<double, kFeatures> k = {1e-3, 2e-5,       1 / 3e12,   1 / 2e12,
                                     1e-7, 1 / 400e12, 1 / 600e12, 1 / 300e12};
  const EngineModel engine(k, 50e9, 1.05);
  for (const auto& [rolling, arbitration] :
       {std::pair{false, node_manager::ArbitrationPolicy::kMooreHodgson},
        {true, node_manager::ArbitrationPolicy::kMooreHodgson},
        {false, node_manager::ArbitrationPolicy::kFcfs},
        {true, node_manager::ArbitrationPolicy::kFcfs}}) {
    SCOPED_TRACE(absl::StrCat(
        rolling ? "rolling " : "lockstep ",
        arbitration == node_manager::ArbitrationPolicy::kFcfs ? "fcfs" : "moore_hodgson"));
    c.policy.rolling_steps = rolling;
    c.policy.arbitration = arbitration;
    auto a = Simulate(c, engine, trace);
    auto b = Simulate(c, engine, trace);
    ASSERT_TRUE(a.ok() && b.ok());
    ASSERT_EQ(a->replay.requests.size(), b->replay.requests.size());
    for (size_t i = 0; i < a->replay.requests.size(); ++i) {
      EXPECT_EQ(a->replay.requests[i].end_s, b->replay.requests[i].end_s);
      EXPECT_EQ(a->replay.requests[i].preemptions, b->replay.requests[i].preemptions);
    }
    const bench::Report rep = bench::Summarize(a->replay, 1.0, 1e9);
    EXPECT_TRUE(rep.accounting_ok);
    EXPECT_EQ(rep.total.completed, rep.total.total);  // every request served in full
    EXPECT_GT(a->stats.preemptions, 0);
    EXPECT_EQ(rep.total.preemptions, a->stats.preemptions);
    EXPECT_GT(a->stats.recomputed_tokens, 0);
    EXPECT_EQ(a->stats.kv_bytes_at_end, 0);  // every block given back
  }
}

}  // namespace
}  // namespace ballast::sim
