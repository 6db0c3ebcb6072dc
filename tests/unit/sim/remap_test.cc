// Parameter remapping in the simulator (policy.remap; sim_device_remap.cc,
// sim_remap.h): layers lent by hand-computed counts, no request waiting for
// KV with remapping where some wait without, the idle model lending first,
// reversion at the daemon's tick cadence after the quiet time (a request
// waiting for KV keeps it from starting), the copy stall with the timing
// constraint off, lockstep iterations with a streaming model, determinism,
// the report, and the H200 8B's figures.
//
// One GPU holding two llama-1b models (a, b) and kRoom tokens of KV
// beside them. A llama-1b decoder layer is 121,643,008 bytes: 3,712.25
// tokens of 32,768-byte KV.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/generators.h"
#include "bench/report.h"
#include "sim/sim_remap.h"
#include "sim/simulator.h"
#include "tests/unit/sim/sim_test_util.h"

namespace ballast::sim {
namespace {

using testing::Find;
using testing::kStep;
using testing::Model;
using testing::Req;

const ModelShape kShape = *NamedShape("llama-1b");
const int64_t kBpt = kShape.kv_bytes_per_token();
const int64_t kLayer = LayerBytes(kShape);
constexpr int kRoom = 6000;  // tokens of KV beside the weights

// Models `names` (llama-1b) on one GPU with kRoom tokens of KV left.
SimConfig Gpu(std::vector<std::string> names, bool remap) {
  SimConfig c;
  for (const auto& n : names) c.models.push_back(Model(n));
  c.cluster.gpu_memory_bytes =
      static_cast<int64_t>(names.size()) * kShape.weight_bytes() + kRoom * kBpt;
  c.policy.min_kv_fraction = 0;
  c.policy.kv_pressure_free_fraction = 0;
  c.policy.remap.enabled = remap;
  // Worked by hand with an ahead plan that lends (the daemon's ahead plans
  // do not: TheAheadPlanLendsNothingAsTheDaemons).
  c.policy.ahead_admissions_lend = true;
  return c;
}

// Four requests of model a at t = 0, each kRoom tokens of KV (4,950 +
// 1,050): 18,000 tokens beyond the room. The first is admitted alone (the
// others come while its first step is in flight) and they at once for
// the step after it (rolling: the step planned ahead; lockstep: at its
// end, 10 ms later); they end at about 10.5 s.
std::vector<bench::TraceRecord> Burst(std::vector<bench::TraceRecord> extra = {}, int n = 4) {
  std::vector<bench::TraceRecord> t;
  for (int i = 0; i < n; ++i) t.push_back(Req(absl::StrCat("r", i), "a", 0, 4950, 1050));
  for (auto& r : extra) t.push_back(r);
  return t;
}

TEST(SimRemapTest, TheIdleModelLendsTheLayersTheBurstNeedsByHand) {
  ASSERT_EQ(kLayer, 121643008);
  auto on = Simulate(Gpu({"a", "b"}, true), testing::ConstantEngine(), Burst());
  auto off = Simulate(Gpu({"a", "b"}, false), testing::ConstantEngine(), Burst());
  ASSERT_TRUE(on.ok()) << on.status();
  ASSERT_TRUE(off.ok()) << off.status();
  const RemapCounters& c = on->stats.remap;
  // Admitted one by one: r0 fits; r1 is 6,000 tokens short (2 layers,
  // 1,424.5 spare), r2 4,575.5 (2 layers, 2,849 spare), r3 3,151 (1 layer):
  // 5 layers = ceil(18,000 / 3,712.25), all of b's (idle; a, busy, may
  // lend none: T_T 122 ms against T_c 0.6 ms).
  EXPECT_EQ(c.max_alpha.count(0), 0u);
  EXPECT_EQ(c.max_alpha.at(1), 5);
  EXPECT_EQ(c.max_lent_bytes, 5 * kLayer);
  EXPECT_GE(c.max_lent_bytes, 18000 * kBpt);
  EXPECT_LT(c.max_lent_bytes - kLayer, 18000 * kBpt);  // no layer more than needed
  EXPECT_EQ(c.remap_events, 3);
  EXPECT_EQ(c.capped_events, 0);
  EXPECT_EQ(c.kv_wait_requests, 0);
  EXPECT_EQ(c.streamed_steps, 0);  // b never steps
  // All four start at once: the last prefill chunk ends in the third step.
  for (int i = 0; i < 4; ++i)
    EXPECT_LE(Find(*on, absl::StrCat("r", i)).ttft_ms(), 3 * kStep * 1e3 + 1e-6);
  // Without remapping only r0 fits; the others wait for room.
  EXPECT_EQ(off->stats.remap.kv_wait_requests, 3);
  EXPECT_TRUE(off->stats.remap.max_alpha.empty());
  EXPECT_GT(Find(*off, "r3").ttft_ms(), 1000);
  EXPECT_TRUE(off->stats.remap_json.is_null());
  EXPECT_FALSE(ToJson(off->stats).contains("remap"));
  EXPECT_EQ(ToJson(off->stats).at("kv_wait_requests"), 3);  // with remapping off too
}

// The daemon's ahead plans ask nobody for KV (BatchPlanner): r1-r3,
// which arrive while r0's first step is in flight, need lent layers, so
// the plan made as that step begins leaves them out and drains. The
// second step carries r0 alone; the model plans again once it has ended,
// lends b's 5 layers then and admits r1-r3, whose prompts end a step
// later than with an ahead plan that lends (policy.ahead_admissions_lend).
TEST(SimRemapTest, TheAheadPlanLendsNothingAsTheDaemons) {
  SimConfig daemon = Gpu({"a", "b"}, true);
  daemon.policy.ahead_admissions_lend = false;
  auto lends = Simulate(Gpu({"a", "b"}, true), testing::ConstantEngine(), Burst());
  auto waits = Simulate(daemon, testing::ConstantEngine(), Burst());
  ASSERT_TRUE(lends.ok()) << lends.status();
  ASSERT_TRUE(waits.ok()) << waits.status();
  EXPECT_DOUBLE_EQ(Find(*waits, "r0").ttft_ms(), Find(*lends, "r0").ttft_ms());
  for (int i = 1; i < 4; ++i) {
    const std::string id = absl::StrCat("r", i);
    EXPECT_NEAR(Find(*waits, id).ttft_ms(), Find(*lends, id).ttft_ms() + kStep * 1e3, 1e-6) << id;
  }
  EXPECT_EQ(waits->stats.remap.max_alpha.at(1), 5);  // the same layers, lent a step later
  EXPECT_EQ(waits->stats.remap.kv_wait_requests, 0);
}

// Equal idle donors lend in MRU order of activation (the daemon's
// RemapController::NoteEngines): c, placed last, lends the burst's 5
// layers, not b.
TEST(SimRemapTest, TheModelActivatedLastLendsFirst) {
  auto r = Simulate(Gpu({"a", "b", "c"}, true), testing::ConstantEngine(), Burst());
  ASSERT_TRUE(r.ok()) << r.status();
  const RemapCounters& c = r->stats.remap;
  EXPECT_EQ(c.max_alpha.count(1), 0u);
  EXPECT_EQ(c.max_alpha.at(2), 5);
}

TEST(SimRemapTest, LayersComeBackAtTheDaemonsTickOnceQuietAndFree) {
  // The daemon ticks before each pass of its loop (sim_device.h): layers
  // come back within a tenth of a second of the burst's end, not one a
  // control interval (1 s). Each comes back from the host with no step
  // in flight, T_T = 121,643,008 B / 1 GB/s = 0.121643 s (ConstantEngine),
  // and the loop ticks again only after that copy.
  // A late request keeps the simulation going past the burst's end.
  const auto trace = Burst({Req("late", "a", 30, 10, 10)});
  constexpr double kCopy = 0.121643008;
  for (bool rolling : {true, false}) {
    SCOPED_TRACE(rolling);
    SimConfig cfg = Gpu({"a", "b"}, true);
    cfg.policy.rolling_steps = rolling;
    auto r = Simulate(cfg, testing::ConstantEngine(), trace);
    ASSERT_TRUE(r.ok()) << r.status();
    const RemapCounters& c = r->stats.remap;
    EXPECT_NEAR(Find(*r, "r0").end_s, 10.50, 1e-9);
    // b lends 5 layers from 0.01 s (rolling: from 0). Quiet from 1.01 s,
    // but a layer's bytes are free only once a request ends (till then
    // 561 tokens are).
    EXPECT_EQ(c.revert_events, 5);
    EXPECT_EQ(c.copy_pauses, 5);
    EXPECT_NEAR(c.copy_s, 5 * kCopy, 1e-9);
    if (rolling) {
      // Ticks at most every 100 ms: the last while stepping at 10.49 (r0
      // not ended), so the requests end as without copies; then the idle
      // GPU's at 10.62 and each after the last one's copy.
      EXPECT_NEAR(Find(*r, "r1").end_s, 10.51, 1e-9);
      EXPECT_NEAR(Find(*r, "r3").end_s, 10.52, 1e-9);
      EXPECT_NEAR(c.layer_seconds.at(1), 5 * 10.62 + (4 + 3 + 2 + 1) * kCopy, 1e-9);
    } else {
      // A tick at each iteration: 10.50 (r0 ended; r1's last iteration
      // waits for the copy), 10.50 + kCopy + 0.01 (r1 ended: two layers'
      // bytes free, one a tick: r2 and r3 wait for two copies), then at
      // r3's end and after its copy.
      const double r1 = 10.50 + kCopy + 0.01, r3 = r1 + 2 * kCopy + 0.01;
      EXPECT_NEAR(Find(*r, "r1").end_s, r1, 1e-9);
      EXPECT_NEAR(Find(*r, "r3").end_s, r3, 1e-9);
      EXPECT_NEAR(c.layer_seconds.at(1),
                  5 * 10.49 + 4 * (r1 - 10.50) + 3 * kCopy + 2 * (r3 - r1 - kCopy) + kCopy, 1e-9);
    }
  }
  // Never quiet long enough: nothing comes back.
  SimConfig slow = Gpu({"a", "b"}, true);
  slow.policy.remap.revert_after_s = 100;
  auto s = Simulate(slow, testing::ConstantEngine(), trace);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->stats.remap.revert_events, 0);
  EXPECT_GT(s->stats.remap.layer_seconds.at(1), 5 * 30.0);
}

TEST(SimRemapTest, ALenderThatGetsARequestTakesItsLayersBackPreemptingTheNewest) {
  // b lends to a's burst while idle; at 2 s it gets a request and is over
  // its cap (busy: T_T 122 ms against T_c 0.6 ms allows none). Held block
  // by block (kv_paged), every layer comes back at its first tick and a's
  // newest requests give their KV back for them (the daemon's forced
  // revert); b's request is served from resident weights. With whole
  // reservations nothing is preempted: b's layers wait for free room.
  const auto trace = Burst({Req("b0", "b", 2, 100, 20)});
  SimConfig paged = Gpu({"a", "b"}, true);
  paged.policy.kv_paged = true;
  auto r = Simulate(paged, testing::ConstantEngine(), trace);
  ASSERT_TRUE(r.ok()) << r.status();
  const RemapCounters& c = r->stats.remap;
  EXPECT_GT(c.max_alpha.at(1), 0);
  EXPECT_EQ(c.forced_reverts, 1);
  EXPECT_GT(r->stats.preemptions, 0);
  EXPECT_EQ(Find(*r, "b0").status, "OK");
  EXPECT_EQ(Find(*r, "b0").preemptions, 0);
  // Back at once: b streams for at most the steps before its first tick.
  EXPECT_LE(c.streamed_steps, 2);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(Find(*r, absl::StrCat("r", i)).status, "OK");
  const bench::Report rep = bench::Summarize(r->replay, 1.0, 1e9);
  EXPECT_EQ(rep.total.completed, rep.total.total);
  EXPECT_EQ(r->stats.kv_bytes_at_end, 0);
  auto whole = Simulate(Gpu({"a", "b"}, true), testing::ConstantEngine(), trace);
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(whole->stats.remap.forced_reverts, 0);
  EXPECT_EQ(whole->stats.preemptions, 0);
}

TEST(SimRemapTest, TheBusyModelLendsOnlyPastTheIdleOnesCapAndWhereItsCopiesHide) {
  SimConfig c = Gpu({"a", "b"}, true);
  c.policy.remap.max_fraction = 0.1875;  // 3 of 16 layers each
  // A fast link: T_T 0.12 ms, T_c 0.625 ms; a's layers hide. r1 takes 2
  // of b's, r2 b's third and 1 of a's, r3 a second of a's.
  auto r = Simulate(c, testing::ConstantEngine(1e12), Burst());
  ASSERT_TRUE(r.ok()) << r.status();
  const RemapCounters& s = r->stats.remap;
  EXPECT_EQ(s.max_alpha.at(1), 3);  // b first, to its cap
  EXPECT_EQ(s.max_alpha.at(0), 2);  // then a
  EXPECT_EQ(s.kv_wait_requests, 0);
  EXPECT_GT(s.streamed_steps, 0);
  EXPECT_EQ(s.stall_s, 0);
  EXPECT_NEAR(Find(*r, "r0").tpot_ms(), kStep * 1e3, 1e-6);
  // Without the fast link a may lend none: b's 3 layers (11,137 tokens)
  // hold one more request, and the last two wait.
  auto slow = Simulate(c, testing::ConstantEngine(), Burst());
  ASSERT_TRUE(slow.ok()) << slow.status();
  EXPECT_EQ(slow->stats.remap.max_alpha.count(0), 0u);
  EXPECT_GT(slow->stats.remap.capped_events, 0);
  EXPECT_EQ(slow->stats.remap.kv_wait_requests, 2);
}

TEST(SimRemapTest, WithoutTheTimingCapStepsWaitForTheirCopies) {
  // a alone; T_T = 5 ms a layer. Two requests need 2 layers (6,000 tokens
  // short): T_T (α + 2) = 20 ms > T_c n = 10 ms, so the timing cap is 0.
  const double h2d = static_cast<double>(kLayer) / 0.005;
  const std::vector<bench::TraceRecord> two = {Req("x", "a", 0, 4950, 1050),
                                               Req("y", "a", 0, 4950, 1050)};
  for (bool rolling : {true, false}) {
    SCOPED_TRACE(rolling);
    SimConfig c = Gpu({"a"}, true);
    c.policy.rolling_steps = rolling;
    auto timed = Simulate(c, testing::ConstantEngine(h2d), two);
    ASSERT_TRUE(timed.ok()) << timed.status();
    EXPECT_TRUE(timed->stats.remap.max_alpha.empty());
    EXPECT_EQ(timed->stats.remap.kv_wait_requests, 1);
    EXPECT_NEAR(Find(*timed, "x").tpot_ms(), kStep * 1e3, 1e-6);
    c.policy.remap.respect_timing = false;
    auto forced = Simulate(c, testing::ConstantEngine(h2d), two);
    ASSERT_TRUE(forced.ok()) << forced.status();
    const RemapCounters& s = forced->stats.remap;
    EXPECT_EQ(s.max_alpha.at(0), 2);
    EXPECT_EQ(s.kv_wait_requests, 0);
    // Two slots, 4 copies a step (2 lent layers, 2 homes): 20 ms of copies
    // against a 10 ms step: each step from y's admission (10 ms, at x's
    // first step's end) waits 10 ms more. Lockstep's last one, y's alone,
    // streams nothing: x's end freed both layers' bytes, and the ticks
    // before it took them back, one a tick, each after a 5 ms copy with
    // nothing in flight (10 ms: the wait it saves). Rolling ticks at most
    // every 100 ms and streams to the end (its tick at y's end reverts).
    EXPECT_GT(s.streamed_steps, 1000);
    EXPECT_NEAR(s.stall_s, 0.010 * static_cast<double>(s.streamed_steps), 1e-9);
    EXPECT_EQ(s.copy_pauses, s.revert_events);  // one layer each
    if (!rolling) {
      EXPECT_EQ(s.revert_events, 2);
    }
    EXPECT_NEAR(Find(*forced, "x").ttft_ms(), kStep * 1e3, 1e-6);
    EXPECT_NEAR(Find(*forced, "y").ttft_ms(), 3 * kStep * 1e3, 1e-6);
    EXPECT_NEAR(Find(*forced, "x").tpot_ms(), 2 * kStep * 1e3, 1e-6);
    EXPECT_NEAR(Find(*forced, "y").tpot_ms(), 2 * kStep * 1e3, 1e-6);
  }
}

TEST(SimRemapTest, DeterministicOnABurstyTrace) {
  bench::BurstyParams p;
  p.models = {"a", "b", "c"};
  p.duration_s = 120;
  p.persistent_fraction = 0;
  p.lengths.prompt_mean = 2000;
  p.lengths.output_mean = 300;
  p.seed = 7;
  const auto trace = bench::GenerateBursty(p);
  for (bool respect : {true, false}) {
    SCOPED_TRACE(respect);
    SimConfig c = Gpu({"a", "b", "c"}, true);
    c.cluster.gpu_memory_bytes += 40000 * kBpt;
    c.policy.remap.respect_timing = respect;
    auto x = Simulate(c, testing::ConstantEngine(1e10), trace);
    auto y = Simulate(c, testing::ConstantEngine(1e10), trace);
    ASSERT_TRUE(x.ok() && y.ok());
    nlohmann::json jx = ToJson(x->stats), jy = ToJson(y->stats);
    jx.erase("wall_s");
    jy.erase("wall_s");
    EXPECT_EQ(jx, jy);
    EXPECT_GT(x->stats.remap.remap_events, 0);
    ASSERT_EQ(x->replay.requests.size(), y->replay.requests.size());
    for (size_t i = 0; i < x->replay.requests.size(); ++i) {
      EXPECT_EQ(x->replay.requests[i].end_s, y->replay.requests[i].end_s);
    }
    const nlohmann::json& rj = jx.at("remap");
    EXPECT_EQ(rj.at("remap_events"), x->stats.remap.remap_events);
    EXPECT_EQ(rj.at("respect_timing"), respect);
    EXPECT_TRUE(rj.at("max_alpha").is_object());
  }
}

TEST(SimRemapTest, StaticMemoryLendsNothing) {
  SimConfig c = Gpu({"a", "b"}, true);
  c.policy.memory_mode = MemoryMode::kStatic;
  // a's share: 3,000 tokens; 1,000 a request: the fourth waits.
  std::vector<bench::TraceRecord> t;
  for (int i = 0; i < 4; ++i) t.push_back(Req(absl::StrCat("s", i), "a", 0, 900, 100));
  auto r = Simulate(c, testing::ConstantEngine(), t);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->stats.remap.max_alpha.empty());
  EXPECT_EQ(r->stats.remap.kv_wait_requests, 1);
}

TEST(SimRemapTest, ALongKvWaitKeepsTheLayersLentUnderEveryArbitration) {
  // Seven of the burst's requests: b lends its cap (8 layers, 29,698
  // tokens); r5 and r6 wait for KV till r0 ends (10.5 s). The waiting
  // request is a shortfall at every tick, whether or not admission runs
  // (fcfs skips it in decode stretches), so nothing comes back before.
  for (bool rolling : {true, false}) {
    SCOPED_TRACE(rolling);
    std::vector<RemapCounters> by_policy;
    for (auto policy :
         {node_manager::ArbitrationPolicy::kFcfs, node_manager::ArbitrationPolicy::kMooreHodgson}) {
      SimConfig c = Gpu({"a", "b"}, true);
      c.policy.rolling_steps = rolling;
      c.policy.arbitration = policy;
      auto r = Simulate(c, testing::ConstantEngine(), Burst({}, 7));
      ASSERT_TRUE(r.ok()) << r.status();
      by_policy.push_back(r->stats.remap);
      const RemapCounters& s = r->stats.remap;
      EXPECT_EQ(s.max_alpha.at(1), 8);
      EXPECT_EQ(s.kv_wait_requests, 2);
      EXPECT_GT(Find(*r, "r5").ttft_ms(), 10000);
      EXPECT_GT(s.layer_seconds.at(1), 8 * 10.4);  // all 8 lent till r0's end
    }
    EXPECT_EQ(by_policy[0].remap_events, by_policy[1].remap_events);
    EXPECT_EQ(by_policy[0].revert_events, by_policy[1].revert_events);
    EXPECT_EQ(by_policy[0].capped_events > 0, by_policy[1].capped_events > 0);
    EXPECT_NEAR(by_policy[0].layer_seconds.at(1), by_policy[1].layer_seconds.at(1), 1e-9);
  }
}

TEST(SimRemapTest, LockstepOverlapsAStreamingModelsWaitWithTheOthersWork) {
  // a's x and y (3,000 tokens each) and b's long request (1,010) are 1,010
  // tokens past the room: one layer lent (timing cap off), streamed with 2
  // copies of 10 ms against a 9 ms step (1 ms launch, 8 ms work): an 11 ms
  // wait. An iteration: max(1 + 11 + 8, 1 + 8 + 8) = 20 ms, not the wait
  // with the launch and then both works (28 ms).
  SimConfig c = Gpu({"a", "b"}, true);
  c.policy.rolling_steps = false;
  c.policy.step_host_s = 0;
  c.policy.remap.respect_timing = false;
  const std::vector<bench::TraceRecord> t = {
      Req("long", "b", 0, 10, 1000), Req("x", "a", 0, 2500, 500), Req("y", "a", 0, 2500, 500)};
  auto r = Simulate(c, testing::LayerEngine(0.001, 0.0005, static_cast<double>(kLayer) / 0.010), t);
  ASSERT_TRUE(r.ok()) << r.status();
  const RemapCounters& s = r->stats.remap;
  EXPECT_EQ(s.remap_events, 1);
  EXPECT_EQ(s.kv_wait_requests, 0);
  EXPECT_NEAR(s.stall_s, 0.011 * static_cast<double>(s.streamed_steps), 1e-9);
  EXPECT_NEAR(Find(*r, "x").tpot_ms(), 20, 1e-6);
  EXPECT_NEAR(Find(*r, "y").tpot_ms(), 20, 1e-6);
}

TEST(SimRemapTest, TimingsMatchTheH200Calibration) {
  auto cal =
      ReadCalibration(std::string(BALLAST_SOURCE_DIR) + "/configs/sim/calibration-h200.json");
  ASSERT_TRUE(cal.ok()) << cal.status();
  auto engine = EngineModel::Fit(*cal);
  ASSERT_TRUE(engine.ok()) << engine.status();
  const RemapTimings t = TimingsOf(*engine, SimPolicy{}, Model("m", "llama-8b"));
  // A decoder layer: attention 41,943,040 + MLP 176,160,768 + norms 8,192
  // parameters in BF16 (no embedding or LM head).
  EXPECT_EQ(t.layers, 32);
  EXPECT_EQ(t.layer_bytes, 436224000);
  // 436.2 MB at 55.4 GB/s: 7.87 ms (measured 7.88-7.91 ms).
  EXPECT_NEAR(t.t_transfer, 0.00787, 0.00002);
  // Measured 0.15-0.18 ms a layer; the model within 10% of that range
  // (0.148 ms with the calibration of 2026-12-01, session 40).
  EXPECT_GT(t.t_compute, 0.00015 * 0.9);
  EXPECT_LT(t.t_compute, 0.00018 * 1.1);
}

TEST(SimRemapTest, PlansAndStallsFollowTheMirageEquations) {
  auto cal =
      ReadCalibration(std::string(BALLAST_SOURCE_DIR) + "/configs/sim/calibration-h200.json");
  ASSERT_TRUE(cal.ok()) << cal.status();
  auto engine = EngineModel::Fit(*cal);
  ASSERT_TRUE(engine.ok()) << engine.status();
  const RemapTimings t = TimingsOf(*engine, SimPolicy{}, Model("m", "llama-8b"));  // the H200's 8B
  SimRemap o;
  EXPECT_EQ(RemapCap(t, o, /*active=*/false), 16);
  EXPECT_EQ(RemapCap(t, o, /*active=*/true), 0);
  EXPECT_TRUE(PlanFor(t, 4, true).streamed.empty());
  const memory::StreamingPlan forced = PlanFor(t, 4, false);
  EXPECT_EQ(forced.slots, 2);
  EXPECT_EQ(memory::CopiesPerStep(forced), 6);
  EXPECT_EQ(memory::CopiesPerStep(PlanFor(t, 1, false)), 2);  // no copy of a home onto itself
  // 6 copies of 7.87 ms against a 10.6 ms step (the H200's fixed α = 4):
  // 36.6 ms, measured 48.2 - 10.6 = 37.6 ms.
  EXPECT_NEAR(StreamingStall(t, forced, 0.0106), 6 * t.t_transfer - 0.0106, 1e-12);
  EXPECT_NEAR(StreamingStall(t, forced, 0.0106), 0.0376, 0.0015);
  EXPECT_EQ(StreamingStall(t, forced, 1.0), 0);  // a long prefill step hides them
}

TEST(SimRemapTest, TheStallFollowsThePlansOwnSlots) {
  // n = 32, α = 3, T_T = 6.5 T_c: a plan with β = 2 copies 5 layers a step
  // (32.5 T_c) against a 32 T_c step, though 3 slots would hide them.
  const double tc = 0.0002;
  const RemapTimings t{32, 1 << 20, 6.5 * tc, tc};
  memory::StreamingPlan p;
  p.alpha = 3;
  p.slots = 2;
  p.streamed = memory::StreamedLayers(32, 5);
  EXPECT_NEAR(StreamingStall(t, p, 32 * tc), 0.5 * tc, 1e-12);
}

TEST(SimRemapTest, BusyModelsShareTheCopyLink) {
  // n = 8, T_T = 2.5 T_c: alone a busy model may lend one layer (its 2
  // copies hide in the 3 T_c between the slot's readers); beside one whose
  // copies hold 62.5% of the link, a copy takes 6.7 T_c and it may lend
  // none; an idle one lends to its floor whatever the link.
  const double tc = 0.001;
  const RemapTimings t{8, 1 << 20, 2.5 * tc, tc};
  SimRemap o;
  EXPECT_EQ(RemapCap(t, o, /*active=*/true), 1);
  EXPECT_EQ(RemapCap(t, o, /*active=*/true, 0.625), 0);
  EXPECT_EQ(RemapCap(t, o, /*active=*/true, 1.0), 0);
  EXPECT_EQ(RemapCap(t, o, /*active=*/false, 1.0), 4);
  EXPECT_EQ(PlanFor(t, 1, /*respect_timing=*/true).slots, 1);
  EXPECT_TRUE(PlanFor(t, 1, /*respect_timing=*/true, 0.625).streamed.empty());
  EXPECT_EQ(PlanFor(t, 1, /*respect_timing=*/false, 1.0).slots, 2);  // streamed anyway
  // The stall: copies take T_T each while the link keeps up, stretched by
  // the load past it. 2 copies (62.5% of the link) against a step of 8 T_c
  // hide beside others taking 0.375 (load 1) or 0.875 (7.5 T_c), and
  // stall 2 T_c beside 1.375 (load 2: 10 T_c); alone, against a 4 T_c step,
  // 1 T_c.
  const memory::StreamingPlan one = PlanFor(t, 1, true);
  EXPECT_EQ(StreamingStall(t, one, 8 * tc, 0.375), 0);
  EXPECT_EQ(StreamingStall(t, one, 8 * tc, 0.875), 0);
  EXPECT_NEAR(StreamingStall(t, one, 8 * tc, 1.375), 2 * tc, 1e-12);
  EXPECT_NEAR(StreamingStall(t, one, 4 * tc), 1 * tc, 1e-12);
  // A model whose own copies overload the link (timing cap off: 6 copies,
  // 187.5%) is stretched only by the others' part: beside 0.375, by
  // 2.25 / 1.875.
  const memory::StreamingPlan four = PlanFor(t, 4, false);
  EXPECT_NEAR(StreamingStall(t, four, 8 * tc), 15 * tc - 8 * tc, 1e-12);
  EXPECT_NEAR(StreamingStall(t, four, 8 * tc, 0.375), 15 * tc * 1.2 - 8 * tc, 1e-12);
}

}  // namespace
}  // namespace ballast::sim
