// The simulator against outcomes computed by hand (an engine model whose
// step takes a constant 10 ms), conservation, determinism, eviction and
// activation timing, static partitioning, and model replicas.
#include "sim/simulator.h"

#include <gtest/gtest.h>
#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "bench/generators.h"
#include "bench/report.h"
#include "server/sim_config.h"
#include "tests/unit/sim/sim_test_util.h"

namespace ballast::sim {
namespace {

using testing::ConstantEngine;
using testing::Find;
using testing::kStep;
using testing::Model;
using testing::Req;

SimConfig OneGpu(std::vector<SimModel> models, int64_t memory = 80LL << 30) {
  SimConfig c;
  c.cluster.gpu_memory_bytes = memory;
  c.models = std::move(models);
  return c;
}

TEST(SimulatorTest, OneRequestByHand) {
  // Prefill in one step (10 ms, first token), then 4 decode steps.
  auto r = Simulate(OneGpu({Model("a")}), ConstantEngine(), {Req("r", "a", 0, 100, 5)});
  ASSERT_TRUE(r.ok()) << r.status();
  const auto& o = Find(*r, "r");
  EXPECT_EQ(o.status, "OK");
  EXPECT_NEAR(o.ttft_ms(), 10, 1e-9);
  EXPECT_NEAR(o.e2e_ms(), 50, 1e-9);
  EXPECT_NEAR(o.tpot_ms(), 10, 1e-9);
}

TEST(SimulatorTest, TheRequestPathAddsToTtftAndE2eOnly) {
  // 3 ms outside the engine: the client sees every token 3 ms after its
  // step; the engine's own TTFT (node_ttft_ms) and TPOT do not move, and
  // a session's next turn is released from when the client saw the end.
  SimConfig c = OneGpu({Model("a")});
  c.policy.request_path_s = 0.003;
  std::vector<bench::TraceRecord> t = {Req("r", "a", 0, 100, 5), Req("n", "a", 0, 100, 2)};
  t[1].after = "r";
  t[1].delay_s = 1;
  auto r = Simulate(c, ConstantEngine(), t);
  ASSERT_TRUE(r.ok()) << r.status();
  const auto& o = Find(*r, "r");
  EXPECT_NEAR(o.ttft_ms(), 13, 1e-9);
  EXPECT_NEAR(o.e2e_ms(), 53, 1e-9);
  EXPECT_NEAR(o.tpot_ms(), 10, 1e-9);
  EXPECT_NEAR(o.node_ttft_ms, 10, 1e-9);
  EXPECT_NEAR(o.path_ms(), 3, 1e-9);
  EXPECT_NEAR(Find(*r, "n").release_s, o.end_s + 1, 1e-9);
  EXPECT_NEAR(Find(*r, "n").ttft_ms(), 13, 1e-9);
  const bench::Report rep = bench::Summarize(r->replay, 1.0);
  EXPECT_NEAR(rep.total.path_ms.p50, 3, 1e-9);
}

TEST(SimulatorTest, ChunkedPrefillTakesTwoSteps) {
  SimConfig c = OneGpu({Model("a")});
  c.policy.max_batch_tokens = 64;  // a 100-token prompt: chunks of 64 and 36
  auto r = Simulate(c, ConstantEngine(), {Req("r", "a", 0, 100, 2)});
  ASSERT_TRUE(r.ok());
  EXPECT_NEAR(Find(*r, "r").ttft_ms(), 20, 1e-9);
  EXPECT_NEAR(Find(*r, "r").e2e_ms(), 30, 1e-9);
}

// The LM head multiplies a prompt's last token only: a prompt in two
// chunks pays its layers' FLOPs for every token and the head once, on the
// chunk that ends it; a last chunk of one token is a decode row (head
// included), as the engine plans it.
TEST(SimulatorTest, OnlyThePromptsLastChunkSamples) {
  const ModelShape s = *NamedShape("llama-1b");
  std::array<double, kFeatures> k{};
  k[5] = 1e-3 / (2 * s.dense_params());  // 1 ms a decode row
  k[6] = 1e-3 / (2 * s.layer_params());  // 1 ms a prefill token, the head's row on top
  const EngineModel engine(k, 1e9, 1.0);
  const double head_ms = s.lm_head_params() / s.layer_params();
  SimConfig c = OneGpu({Model("a")});
  c.policy.max_batch_tokens = 64;
  for (const auto& [prompt, ttft] :
       {std::pair{100, 100 + head_ms}, {64, 64 + head_ms}, {65, 64 + 1.0}}) {
    auto r = Simulate(c, engine, {Req("r", "a", 0, prompt, 2)});
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_NEAR(Find(*r, "r").ttft_ms(), ttft, 1e-6) << prompt;
    EXPECT_NEAR(Find(*r, "r").e2e_ms(), ttft + 1, 1e-6) << prompt;
  }
}

TEST(SimulatorTest, TwoModelsStepOneAfterTheOther) {
  // Serial steps: x starts alone (first token at 10 ms); y joins at that
  // boundary, and from then on each iteration steps both models (20 ms):
  // y's first token at 30 ms, x's tokens at 30, 50, 70, 90 ms; y's last
  // step runs alone.
  SimConfig c = OneGpu({Model("a"), Model("b")});
  c.policy.overlap_steps = false;
  auto r = Simulate(c, ConstantEngine(), {Req("x", "a", 0, 10, 5), Req("y", "b", 0, 10, 5)});
  ASSERT_TRUE(r.ok());
  EXPECT_NEAR(Find(*r, "x").ttft_ms(), 10, 1e-9);
  EXPECT_NEAR(Find(*r, "x").e2e_ms(), 90, 1e-9);
  EXPECT_NEAR(Find(*r, "y").ttft_ms(), 30, 1e-9);
  EXPECT_NEAR(Find(*r, "y").e2e_ms(), 100, 1e-9);
}

TEST(SimulatorTest, OverlappedStepsShareTheLaunchLatency) {
  // The constant engine's step is all launch latency (k0), so two models'
  // overlapped steps take 10 ms together: x ends at 50 ms. Lockstep, y
  // joins at x's first boundary (10 ms) and ends at 60 ms; rolling, y's
  // model begins its own step at once and ends at 50 ms.
  for (bool rolling : {false, true}) {
    SimConfig c = OneGpu({Model("a"), Model("b")});
    c.policy.rolling_steps = rolling;
    auto r = Simulate(c, ConstantEngine(), {Req("x", "a", 0, 10, 5), Req("y", "b", 0, 10, 5)});
    ASSERT_TRUE(r.ok());
    EXPECT_NEAR(Find(*r, "x").e2e_ms(), 50, 1e-9) << rolling;
    EXPECT_NEAR(Find(*r, "y").ttft_ms(), rolling ? 10 : 20, 1e-9) << rolling;
    EXPECT_NEAR(Find(*r, "y").e2e_ms(), rolling ? 50 : 60, 1e-9) << rolling;
  }
}

TEST(SimulatorTest, StepHostTimeComesOnTopOfTheGpuWork) {
  // 5 ms of host time per step. Lockstep overlapped, once per iteration
  // (two models stepping together: 10 + 5 ms); serial, once per model
  // (2 x 15 ms). Rolling, once per step of each model, which y's model
  // begins at once: 15 ms.
  struct Mode {
    bool overlap, rolling;
    double y_ttft_ms;
  };
  for (const Mode m : {Mode{true, false, 30}, Mode{false, false, 45}, Mode{true, true, 15}}) {
    SimConfig c = OneGpu({Model("a"), Model("b")});
    c.policy.overlap_steps = m.overlap;
    c.policy.rolling_steps = m.rolling;
    c.policy.step_host_s = 0.005;
    auto r = Simulate(c, ConstantEngine(), {Req("x", "a", 0, 10, 3), Req("y", "b", 0, 10, 3)});
    ASSERT_TRUE(r.ok());
    EXPECT_NEAR(Find(*r, "x").ttft_ms(), 15, 1e-9);  // alone
    EXPECT_NEAR(Find(*r, "y").ttft_ms(), m.y_ttft_ms, 1e-9) << m.overlap << m.rolling;
  }
}

TEST(SimulatorTest, AnArrivalCutsADecodeStretchAtTheNextStep) {
  // A decodes in one stretch from 10 ms; B arrives at 25.5 ms and is
  // admitted at the boundary at 30 ms. Without ahead steps it is prefilled
  // in the step that ends at 40 ms (one step: same model); with them
  // (the node's default) the step 30-40 was planned at 20 ms, so B's
  // prefill ends at 50 ms. A still needs 100 steps in all: ends at 1 s.
  for (const bool ahead : {true, false}) {
    SimConfig c = OneGpu({Model("a")});
    c.policy.ahead_steps = ahead;
    auto r =
        Simulate(c, ConstantEngine(), {Req("A", "a", 0, 10, 100), Req("B", "a", 0.0255, 10, 3)});
    ASSERT_TRUE(r.ok());
    EXPECT_NEAR(Find(*r, "B").ttft_ms(), ahead ? 24.5 : 14.5, 1e-6) << ahead;
    EXPECT_NEAR(Find(*r, "B").end_s, ahead ? 0.070 : 0.060, 1e-9) << ahead;
    EXPECT_NEAR(Find(*r, "A").end_s, 1.0, 1e-9) << ahead;
  }
}

TEST(SimulatorTest, KvThatDoesNotFitWaitsForRoom) {
  // Room for one request's KV at a time (llama-1b: 32 KiB per token).
  const ModelShape s = *NamedShape("llama-1b");
  const int64_t kv = 1000 * s.kv_bytes_per_token();
  SimConfig c = OneGpu({Model("a")}, s.weight_bytes() + kv + kv / 2);
  c.policy.min_kv_fraction = 0;
  auto r = Simulate(c, ConstantEngine(), {Req("1", "a", 0, 500, 500), Req("2", "a", 0, 500, 500)});
  ASSERT_TRUE(r.ok());
  // The first runs 500 steps (5 s); the second starts when it ends.
  EXPECT_NEAR(Find(*r, "1").e2e_ms(), 5000, 1e-6);
  EXPECT_NEAR(Find(*r, "2").ttft_ms(), 5010, 1e-6);
}

TEST(SimulatorTest, IdleModelIsEvictedAfterTheThresholdAndTheOtherActivated) {
  // One GPU holds one 8B model at a time: b waits until a has been idle
  // 45 s (the tick at 45 s), then loads for weights / 1 GB/s.
  const ModelShape s8 = *NamedShape("llama-8b");
  SimConfig c =
      OneGpu({Model("a", "llama-8b"), Model("b", "llama-8b")}, s8.weight_bytes() + (4LL << 30));
  c.policy.min_kv_fraction = 0.01;
  auto r = Simulate(c, ConstantEngine(1e9), {Req("r", "b", 0, 10, 2)});
  ASSERT_TRUE(r.ok()) << r.status();
  const double load_s = s8.weight_bytes() / 1e9;
  EXPECT_EQ(Find(*r, "r").status, "OK");
  EXPECT_NEAR(Find(*r, "r").first_token_s, 45 + load_s + kStep, 1e-6);
  EXPECT_EQ(r->stats.initial_placed, 1);
  EXPECT_EQ(r->stats.idle_evictions, 1);
  EXPECT_EQ(r->stats.activations, 1);
}

TEST(SimulatorTest, StaticPartitioningNeverActivates) {
  const ModelShape s8 = *NamedShape("llama-8b");
  SimConfig c =
      OneGpu({Model("a", "llama-8b"), Model("b", "llama-8b")}, s8.weight_bytes() + (4LL << 30));
  c.policy.memory_mode = MemoryMode::kStatic;
  auto r = Simulate(c, ConstantEngine(), {Req("x", "a", 0, 10, 2), Req("y", "b", 0, 10, 2)});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(Find(*r, "x").status, "OK");
  EXPECT_EQ(Find(*r, "y").status, "UNAVAILABLE");
  EXPECT_EQ(r->stats.activations, 0);
}

TEST(SimulatorTest, EveryRequestIsAccountedFor) {
  std::vector<bench::TraceRecord> t = {Req("ok", "a", 0, 10, 4), Req("nomodel", "zzz", 0, 10, 4),
                                       Req("huge", "a", 0, 4'000'000, 4),
                                       Req("child", "a", 0, 10, 4), Req("orphan", "a", 0, 10, 4)};
  t[3].after = "ok";
  t[3].delay_s = 1;
  t[4].after = "nomodel";
  auto r = Simulate(OneGpu({Model("a")}), ConstantEngine(), t);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(Find(*r, "ok").status, "OK");
  EXPECT_EQ(Find(*r, "nomodel").status, "NOT_FOUND");
  EXPECT_EQ(Find(*r, "huge").status, "RESOURCE_EXHAUSTED");
  EXPECT_EQ(Find(*r, "child").status, "OK");
  EXPECT_NEAR(Find(*r, "child").release_s, Find(*r, "ok").end_s + 1, 1e-9);
  EXPECT_EQ(Find(*r, "orphan").status, "ABORTED");
  const bench::Report rep = bench::Summarize(r->replay, 1.0, 1e9);
  EXPECT_TRUE(rep.accounting_ok);
  EXPECT_EQ(rep.total.total, 5);
  EXPECT_EQ(rep.total.completed, 2);
}

void CheckDeterministicAndConserved(const SimConfig& c, const EngineModel& engine,
                                    const std::vector<bench::TraceRecord>& trace);
void CheckDecodeStretch(bool rolling);

// A bursty trace over 12 models on 4 GPUs: conservation holds under load
// and a second run gives exactly the same outcomes, lockstep and rolling.
TEST(SimulatorTest, BurstyTraceIsDeterministicAndConserved) {
  bench::BurstyParams p;
  for (int i = 0; i < 12; ++i) p.models.push_back(absl::StrCat("m", i));
  p.duration_s = 300;
  p.burst_rate = 20;
  p.persistent_rate = 5;
  const std::vector<bench::TraceRecord> trace = bench::GenerateBursty(p);
  SimConfig c;
  c.cluster.nodes = 2;
  c.cluster.gpus_per_node = 2;
  c.cluster.gpu_memory_bytes = 16LL << 30;  // two 3B models per GPU
  for (int i = 0; i < 12; ++i) c.models.push_back(Model(absl::StrCat("m", i), "llama-3b"));
  std::array<double, kFeatures> k = {1e-3, 2e-5,       1 / 3e12,   1 / 2e12,
                                     1e-7, 1 / 400e12, 1 / 600e12, 1 / 300e12};
  const EngineModel engine(k, 50e9, 1.05);
  for (bool rolling : {false, true}) {
    SCOPED_TRACE(rolling ? "rolling" : "lockstep");
    c.policy.rolling_steps = rolling;
    CheckDeterministicAndConserved(c, engine, trace);
  }
}

void CheckDeterministicAndConserved(const SimConfig& c, const EngineModel& engine,
                                    const std::vector<bench::TraceRecord>& trace) {
  auto a = Simulate(c, engine, trace);
  auto b = Simulate(c, engine, trace);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->replay.requests.size(), b->replay.requests.size());
  for (size_t i = 0; i < a->replay.requests.size(); ++i) {
    const auto &x = a->replay.requests[i], &y = b->replay.requests[i];
    EXPECT_EQ(x.status, y.status);
    EXPECT_EQ(x.first_token_s, y.first_token_s);
    EXPECT_EQ(x.end_s, y.end_s);
  }
  EXPECT_EQ(a->stats.activations, b->stats.activations);
  EXPECT_EQ(a->stats.initial_placed, 8);
  EXPECT_GT(a->stats.activations, 0);  // the other four are activated on demand
  const bench::Report rep = bench::Summarize(a->replay, 1.0, 1e9);
  EXPECT_TRUE(rep.accounting_ok);
  EXPECT_EQ(rep.total.total, static_cast<int>(a->replay.requests.size()));
  EXPECT_GT(rep.total.completed, rep.total.total * 9 / 10);
}

// Ensembles' jitter (JitterArrivals): each request's arrival moves by at
// most the jitter in simulated time (so by jitter x rate in the trace's),
// never before 0; a turn that follows another's end and an advisory keep
// theirs; the same seed gives the same trace, another seed another.
TEST(SimulatorTest, JitterMovesEachArrivalWithinItsBound) {
  std::vector<bench::TraceRecord> t;
  for (int i = 0; i < 50; ++i) t.push_back(Req(absl::StrCat("r", i), "a", i * 0.1, 10, 10));
  bench::TraceRecord after = Req("next", "a", 3.0, 10, 10);
  after.after = "r3";
  after.delay_s = 0.5;
  t.push_back(after);
  bench::TraceRecord advise;
  advise.type = bench::TraceRecord::Type::kAdvise;
  advise.id = "adv";
  advise.arrival_s = 2.0;
  t.push_back(advise);
  const double jitter_s = 0.002, rate = 4;
  const auto a = JitterArrivals(t, jitter_s, rate, 1);
  const auto b = JitterArrivals(t, jitter_s, rate, 1);
  const auto c = JitterArrivals(t, jitter_s, rate, 2);
  ASSERT_EQ(a.size(), t.size());
  int moved = 0, differ = 0;
  for (size_t i = 0; i < 50; ++i) {
    EXPECT_EQ(a[i].id, t[i].id);
    EXPECT_LE(std::abs(a[i].arrival_s - t[i].arrival_s), jitter_s * rate + 1e-12) << i;
    EXPECT_GE(a[i].arrival_s, 0);
    EXPECT_EQ(a[i].arrival_s, b[i].arrival_s);
    moved += a[i].arrival_s != t[i].arrival_s;
    differ += a[i].arrival_s != c[i].arrival_s;
  }
  EXPECT_GE(moved, 48);
  EXPECT_GE(differ, 48);
  EXPECT_EQ(a[50].arrival_s, 3.0);  // follows r3's end
  EXPECT_EQ(a[51].arrival_s, 2.0);
  // The spread covers the bound: some draws in each outer fifth.
  int low = 0, high = 0;
  for (size_t i = 1; i < 50; ++i) {
    const double d = (a[i].arrival_s - t[i].arrival_s) / (jitter_s * rate);
    low += d < -0.6;
    high += d > 0.6;
  }
  EXPECT_GT(low, 0);
  EXPECT_GT(high, 0);
  for (size_t i = 0; i < t.size(); ++i) {
    EXPECT_EQ(JitterArrivals(t, 0, rate, 1)[i].arrival_s, t[i].arrival_s);
  }
}

// A decode stretch's closed form and its cut, against step-by-step sums:
// steps cost k0 plus k3 per KV byte read, so each decode step is longer
// than the last. One model: the same lockstep and rolling.
TEST(SimulatorTest, DecodeStretchMatchesStepByStepSums) {
  for (bool rolling : {false, true}) {
    SCOPED_TRACE(rolling ? "rolling" : "lockstep");
    CheckDecodeStretch(rolling);
  }
}

void CheckDecodeStretch(bool rolling) {
  SimConfig c = OneGpu({Model("a")});
  c.policy.rolling_steps = rolling;
  std::array<double, kFeatures> k{};
  k[0] = 1e-3;
  k[3] = 1e-9;  // 1 ms per MB of KV: a llama-1b token's KV (32 KiB) adds 33 us
  const EngineModel engine(k, 1e9, 1.0);
  const ModelShape s = *NamedShape("llama-1b");
  const double kvb = static_cast<double>(s.kv_bytes_per_token());
  // A alone: prefill (k0), then 199 decode steps over contexts 101..299.
  std::vector<double> boundary = {k[0]};
  for (int g = 1; g < 200; ++g) boundary.push_back(boundary.back() + k[0] + k[3] * kvb * (100 + g));
  auto r = Simulate(c, engine, {Req("A", "a", 0, 100, 200)});
  ASSERT_TRUE(r.ok());
  EXPECT_NEAR(Find(*r, "A").end_s, boundary.back(), 1e-9);
  // B arrives mid-stretch: admitted at the next boundary, prefilled in the
  // step after it (A's decode step, its context then 100 + g + 1); rolling,
  // that step was queued ahead, so in the one after.
  const double arrival = 0.1234;
  size_t g = 0;
  while (boundary[g] < arrival) ++g;
  const double b_first = rolling ? boundary[g + 2] : boundary[g + 1];
  r = Simulate(c, engine, {Req("A", "a", 0, 100, 200), Req("B", "a", arrival, 100, 2)});
  ASSERT_TRUE(r.ok());
  EXPECT_NEAR(Find(*r, "B").first_token_s, b_first, 1e-9);
}

// Overlapped steps through the device: the iteration is the longest launch
// latency plus every step's GPU work (here weight bytes at 1 TB/s).
// Rolling, both models begin at once: each waits its latency, then their
// work shares the GPU, so both first tokens come at k0 + 2w.
TEST(SimulatorTest, OverlappedIterationAddsWorkNotLatency) {
  std::array<double, kFeatures> k{};
  k[0] = 2e-3;
  k[2] = 1e-12;
  const EngineModel engine(k, 1e9, 1.0);
  const double w = k[2] * NamedShape("llama-1b")->weight_bytes_read();
  for (int mode = 0; mode < 3; ++mode) {  // serial, lockstep overlapped, rolling
    SimConfig c = OneGpu({Model("a"), Model("b")});
    c.policy.overlap_steps = mode > 0;
    c.policy.rolling_steps = mode == 2;
    auto r = Simulate(c, engine, {Req("x", "a", 0, 10, 2), Req("y", "b", 0, 10, 2)});
    ASSERT_TRUE(r.ok());
    // Lockstep: x's prefill alone, then x's decode beside y's prefill.
    const double both = mode == 1 ? k[0] + 2 * w : 2 * (k[0] + w);
    const double y_first = mode == 2 ? k[0] + 2 * w : (k[0] + w) + both;
    EXPECT_NEAR(Find(*r, "y").first_token_s, y_first, 1e-9) << mode;
  }
}

// An idle model is evicted for room while another model keeps the GPU
// busy: the newcomer does not wait for the busy model to finish.
TEST(SimulatorTest, EvictionTakesEffectWhileTheGpuIsBusy) {
  const ModelShape s1 = *NamedShape("llama-1b"), s8 = *NamedShape("llama-8b");
  SimConfig c = OneGpu({Model("a"), Model("b", "llama-8b"), Model("c", "llama-8b")},
                       s1.weight_bytes() + s8.weight_bytes() + (2LL << 30));
  c.policy.min_kv_fraction = 0.01;
  // a decodes for 200 s; c arrives at 50 s: b (idle since 0) goes at the
  // tick at 50 s, and c loads for 16 s (weights at 1 GB/s).
  auto r =
      Simulate(c, ConstantEngine(1e9), {Req("long", "a", 0, 10, 20000), Req("x", "c", 50, 10, 2)});
  ASSERT_TRUE(r.ok()) << r.status();
  const double ready = 50 + s8.weight_bytes() / 1e9;
  EXPECT_EQ(Find(*r, "x").status, "OK");
  EXPECT_GE(Find(*r, "x").first_token_s, ready + kStep - 1e-9);
  EXPECT_LE(Find(*r, "x").first_token_s, ready + 2 * kStep + 1e-9);
  EXPECT_EQ(r->stats.idle_evictions, 1);
}

// KV pressure: a request that fits only without the idle model's weights
// waits; the tick that finds the idle model 45 s idle evicts it, and the
// request is admitted at once although the GPU is busy.
TEST(SimulatorTest, KvPressureEvictsAnIdleModelAndAdmitsTheWaitingRequest) {
  const ModelShape s1 = *NamedShape("llama-1b"), s8 = *NamedShape("llama-8b");
  SimConfig c = OneGpu({Model("a"), Model("b", "llama-8b")},
                       s1.weight_bytes() + s8.weight_bytes() + (1LL << 30));
  c.policy.min_kv_fraction = 0;
  // long: 0.89 GiB of KV for ~290 s; big: 2 GiB (> the 1 GiB left with b).
  auto r = Simulate(c, ConstantEngine(),
                    {Req("long", "a", 0, 100, 29000), Req("big", "a", 1, 65536, 2)});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->stats.kv_pressure_evictions, 1);
  EXPECT_EQ(Find(*r, "big").status, "OK");
  // Evicted at the 45 s tick; long's model admits big at its next step
  // boundary, for the step after the one queued ahead; 65,536 tokens are
  // 9 prefill chunks (8,191 tokens beside long's decode).
  EXPECT_NEAR(Find(*r, "big").first_token_s, 45 + 11 * kStep, kStep);
}

// KVPR rebalancing: two busy models share a GPU while a third is idle on
// the other node's GPU; the rebalance moves one of them across (one
// migration), and every request still completes. Within one node the
// daemon does not move models, unless migrate_within_node.
TEST(SimulatorTest, RebalanceMigratesBetweenNodesOnly) {
  std::vector<bench::TraceRecord> t;
  for (int i = 0; i < 600; ++i) {
    t.push_back(Req(absl::StrCat("p", i), "p", i * 0.1, 200, 50));
    t.push_back(Req(absl::StrCat("q", i), "q", i * 0.1 + 0.05, 200, 50));
  }
  auto run = [&](int nodes, int per_node, bool within) {
    SimConfig c;
    c.cluster.nodes = nodes;
    c.cluster.gpus_per_node = per_node;
    c.cluster.gpu_memory_bytes = 40LL << 30;
    c.models = {Model("big", "llama-8b"), Model("p", "llama-3b"), Model("q", "llama-3b")};
    c.policy.migrate_within_node = within;
    return Simulate(c, ConstantEngine(50e9), t);
  };
  for (auto [nodes, per_node, within, moves] :
       {std::tuple{2, 1, false, true}, {1, 2, false, false}, {1, 2, true, true}}) {
    auto r = run(nodes, per_node, within);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->stats.migrations > 0, moves) << nodes << "x" << per_node << " " << within;
    const bench::Report rep = bench::Summarize(r->replay, 1.0, 1e9);
    EXPECT_TRUE(rep.accounting_ok);
    EXPECT_EQ(rep.total.completed, 1200);
  }
}

TEST(SimulatorTest, AdvisoriesNeverBlockTheirDependents) {
  std::vector<bench::TraceRecord> t = {Req("r0", "a", 0, 10, 3), Req("a1", "a", 0, 0, 0),
                                       Req("r1", "a", 0, 10, 3)};
  t[1].type = bench::TraceRecord::Type::kAdvise;
  t[1].after = "r0";
  t[1].delay_s = 1;
  t[2].after = "a1";
  t[2].delay_s = 2;
  auto r = Simulate(OneGpu({Model("a")}), ConstantEngine(), t);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(Find(*r, "r1").status, "OK");
  EXPECT_NEAR(Find(*r, "r1").release_s, Find(*r, "r0").end_s + 3, 1e-9);
  EXPECT_EQ(r->stats.advisories_ignored, 1);
}

// A steady load on one model: 6 requests a second, each running 1 s with
// at most 4 running per GPU, so one GPU serves 4 a second.
std::vector<bench::TraceRecord> SteadyLoad(const std::string& model, double seconds) {
  std::vector<bench::TraceRecord> t;
  for (int i = 0; i < static_cast<int>(seconds * 6); ++i) {
    t.push_back(Req(absl::StrCat(model, i), model, i / 6.0, 100, 100));
  }
  return t;
}

double TtftAttainment(const SimResult& r) {
  int met = 0;
  for (const auto& o : r.replay.requests) met += o.status == "OK" && o.ttft_ms() <= 1000;
  return static_cast<double>(met) / static_cast<double>(r.replay.requests.size());
}

SimConfig TwoNodes(int replicas, int gpus_per_node = 1) {
  SimConfig c;
  c.cluster.nodes = 2;
  c.cluster.gpus_per_node = gpus_per_node;
  c.cluster.gpu_memory_bytes = 80LL << 30;
  c.models = {Model("hot")};
  c.models[0].max_seqs = 4;
  c.models[0].replicas = replicas;
  return c;
}

// Two replicas on two nodes share a load one GPU cannot keep up with.
TEST(SimulatorTest, ReplicasShareAHotModelAcrossNodes) {
  const std::vector<bench::TraceRecord> t = SteadyLoad("hot", 60);
  auto one = Simulate(TwoNodes(1), ConstantEngine(), t);
  auto two = Simulate(TwoNodes(2), ConstantEngine(), t);
  ASSERT_TRUE(one.ok() && two.ok());
  EXPECT_EQ(one->stats.initial_placed, 1);
  EXPECT_EQ(two->stats.initial_placed, 2);
  ASSERT_EQ(two->stats.device_model_steps.size(), 2u);
  EXPECT_GT(two->stats.device_model_steps[0], 0);
  EXPECT_GT(two->stats.device_model_steps[1], 0);
  EXPECT_EQ(one->stats.device_model_steps[0] * one->stats.device_model_steps[1], 0);
  // One replica: Moore-Hodgson serves about the 4 a second it can on
  // time and pushes the rest back.
  EXPECT_GT(TtftAttainment(*two), 0.95);
  EXPECT_LT(TtftAttainment(*one), 0.75);
  // Both serve everything in the end; two replicas finish much sooner.
  EXPECT_LT(two->replay.wall_s, one->replay.wall_s - 20);
}

// A replica refused room is placed once an idle model is evicted for it,
// while the first replica serves.
TEST(SimulatorTest, AMissingReplicaIsActivatedOnDemand) {
  const ModelShape s8 = *NamedShape("llama-8b");
  SimConfig c = TwoNodes(2);
  c.cluster.gpu_memory_bytes = s8.weight_bytes() + (8LL << 30);
  c.models = {Model("idle", "llama-8b"), Model("hot", "llama-8b")};
  c.models[1].replicas = 2;
  c.models[1].max_seqs = 4;
  auto r = Simulate(c, ConstantEngine(1e9), SteadyLoad("hot", 120));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->stats.initial_placed, 2);  // idle and one replica of hot
  EXPECT_EQ(r->stats.idle_evictions, 1);  // idle, at the 45 s tick
  EXPECT_EQ(r->stats.activations, 1);     // hot's second replica
  EXPECT_GT(r->stats.device_model_steps[0], 0);
  EXPECT_GT(r->stats.device_model_steps[1], 0);
  const bench::Report rep = bench::Summarize(r->replay, 1.0, 1e9);
  EXPECT_TRUE(rep.accounting_ok);
  EXPECT_EQ(rep.total.completed, 720);
}

// Room for a missing replica is made only on a node without one: the
// longest-idle model shares hot's node, so evicting it would free room hot
// cannot use (and a second eviction would follow); the victim is one of
// the other node's models. most_free placement puts hot and idle-b on
// node 0, idle-a and idle-c on node 1 (each GPU holds two 8B models).
TEST(SimulatorTest, RoomForAReplicaIsMadeOnANodeWithoutOne) {
  const ModelShape s8 = *NamedShape("llama-8b");
  SimConfig c = TwoNodes(2);
  c.policy.placement = Placement::kMostFree;
  c.cluster.gpu_memory_bytes = 2 * s8.weight_bytes() + (8LL << 30);
  c.models = {Model("hot", "llama-8b"), Model("idle-a", "llama-8b"), Model("idle-b", "llama-8b"),
              Model("idle-c", "llama-8b")};
  c.models[0].replicas = 2;
  c.models[0].max_seqs = 4;
  std::vector<bench::TraceRecord> t = SteadyLoad("hot", 120);
  // idle-a and idle-c were used a little later than idle-b.
  t.push_back(Req("a", "idle-a", 1.0, 10, 2));
  t.push_back(Req("c", "idle-c", 1.0, 10, 2));
  std::sort(t.begin(), t.end(),
            [](const auto& x, const auto& y) { return x.arrival_s < y.arrival_s; });
  auto r = Simulate(c, ConstantEngine(1e9), t);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->stats.initial_placed, 4);
  EXPECT_EQ(r->stats.idle_evictions, 1);
  EXPECT_EQ(r->stats.activations, 1);  // hot's second replica, on node 1
  EXPECT_GT(r->stats.device_model_steps[0], 0);
  EXPECT_GT(r->stats.device_model_steps[1], 0);
  const bench::Report rep = bench::Summarize(r->replay, 1.0, 1e9);
  EXPECT_TRUE(rep.accounting_ok);
  EXPECT_EQ(rep.total.completed, 722);
}

// Never two replicas of a model on one node: replicas 3 on two nodes of
// two GPUs each places one replica per node, and asks for no more.
TEST(SimulatorTest, ReplicasAreOnePerNode) {
  for (Activation activation : {Activation::kOnDemand, Activation::kFixed}) {
    SimConfig c = TwoNodes(3, 2);
    c.policy.activation = activation;
    auto r = Simulate(c, ConstantEngine(), SteadyLoad("hot", 30));
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->stats.initial_placed, 2) << NameOf(activation, kActivationNames);
    EXPECT_EQ(r->stats.activations, 0) << NameOf(activation, kActivationNames);
    EXPECT_EQ(r->stats.load_refusals, 0) << NameOf(activation, kActivationNames);
    const std::vector<int64_t>& steps = r->stats.device_model_steps;
    ASSERT_EQ(steps.size(), 4u);
    // Devices 0 and 1 are node-0000's, 2 and 3 node-0001's.
    EXPECT_EQ((steps[0] > 0) + (steps[1] > 0), 1) << NameOf(activation, kActivationNames);
    EXPECT_EQ((steps[2] > 0) + (steps[3] > 0), 1) << NameOf(activation, kActivationNames);
  }
}

// `replicas: 1` is the default: the same config, and the same outcomes.
TEST(SimulatorTest, OneReplicaIsTheDefault) {
  const std::string base = R"(
calibration: c.json
cluster: {nodes: 2, gpus_per_node: 1, gpu_memory_gib: 80}
models:
  - {name: hot, shape: llama-1b, max_seqs: 4)";
  auto omitted = server::ParseSimConfig(base + "}\n", "/x/s.yaml");
  auto one = server::ParseSimConfig(base + ", replicas: 1}\n", "/x/s.yaml");
  ASSERT_TRUE(omitted.ok() && one.ok()) << omitted.status() << one.status();
  EXPECT_EQ(omitted->config.models[0].replicas, 1);
  EXPECT_EQ(one->config.models[0].replicas, 1);
  const std::vector<bench::TraceRecord> t = SteadyLoad("hot", 30);
  auto a = Simulate(omitted->config, ConstantEngine(), t);
  auto b = Simulate(one->config, ConstantEngine(), t);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->replay.requests.size(), b->replay.requests.size());
  for (size_t i = 0; i < a->replay.requests.size(); ++i) {
    EXPECT_EQ(a->replay.requests[i].first_token_s, b->replay.requests[i].first_token_s);
    EXPECT_EQ(a->replay.requests[i].end_s, b->replay.requests[i].end_s);
  }
  EXPECT_EQ(a->stats.device_model_steps, b->stats.device_model_steps);
}

TEST(SimulatorTest, ConfigRejectsZeroReplicas) {
  auto f = server::ParseSimConfig(
      "calibration: c.json\nmodels: [{name: a, shape: llama-1b, replicas: 0}]\n", "/x/s.yaml");
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("models[0].replicas"), std::string::npos) << f.status();
  SimConfig c = OneGpu({Model("a")});
  c.models[0].replicas = 0;
  EXPECT_FALSE(Simulate(c, ConstantEngine(), {}).ok());
}

}  // namespace
}  // namespace ballast::sim
