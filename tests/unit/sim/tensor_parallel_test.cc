// Tensor-parallel models in the simulator (SimModel::tp): parts on
// distinct GPUs of one node, the all-reduce cost computed by hand, the
// shadow steps that slow a group's neighbours, eviction of every part, the
// part shape, and the config's checks.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "server/sim_config.h"
#include "sim/simulator.h"
#include "tests/unit/sim/sim_test_util.h"

namespace ballast::sim {
namespace {

using testing::ConstantEngine;
using testing::Find;
using testing::Model;
using testing::Req;

SimConfig Cluster(int nodes, int gpus_per_node, std::vector<SimModel> models) {
  SimConfig c;
  c.cluster.nodes = nodes;
  c.cluster.gpus_per_node = gpus_per_node;
  c.cluster.gpu_memory_bytes = 80LL << 30;
  c.models = std::move(models);
  return c;
}

TEST(TensorParallelTest, PartShapeSplitsHeadsMlpAndVocab) {
  const ModelShape full = *NamedShape("llama-70b");  // 64 heads, 8 KV heads
  const ModelShape four = TensorParallelPart(full, 4);
  EXPECT_EQ(four.heads, 16);
  EXPECT_EQ(four.kv_heads, 2);
  EXPECT_EQ(four.intermediate, full.intermediate / 4);
  EXPECT_EQ(four.kv_bytes_per_token(), full.kv_bytes_per_token() / 4);
  // Weights split four ways but for the norms, which every part keeps.
  EXPECT_NEAR(static_cast<double>(four.weight_bytes()), full.weight_bytes() / 4.0,
              full.weight_bytes() * 1e-3);
  // More GPUs than KV heads: each keeps one KV head.
  EXPECT_EQ(TensorParallelPart(full, 16).kv_heads, 1);
  EXPECT_EQ(TensorParallelPart(full, 1).heads, 64);
}

TEST(TensorParallelTest, PartsGoOnDistinctGpusOfOneNode) {
  // A 70B in BF16 (141 GB) fits no 80 GiB GPU; four parts of 35 GB do.
  auto r = Simulate(Cluster(2, 4, {Model("big", "llama-70b", 4)}), ConstantEngine(),
                    {Req("x", "big", 0, 100, 20)});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Find(*r, "x").status, "OK");
  EXPECT_EQ(r->stats.initial_placed, 1);
  std::set<int> stepping, nodes;
  for (size_t d = 0; d < r->stats.device_model_steps.size(); ++d) {
    if (r->stats.device_model_steps[d] == 0) continue;
    stepping.insert(static_cast<int>(d));
    nodes.insert(static_cast<int>(d) / 4);
  }
  EXPECT_EQ(stepping.size(), 4u);  // every part steps, each on its own GPU
  EXPECT_EQ(nodes.size(), 1u);     // all on one node
  // The same model with tp 1 fits nowhere: its request waits and fails.
  auto one = Simulate(Cluster(2, 4, {Model("big", "llama-70b")}), ConstantEngine(),
                      {Req("x", "big", 0, 100, 20)});
  ASSERT_TRUE(one.ok());
  EXPECT_NE(Find(*one, "x").status, "OK");
}

TEST(TensorParallelTest, AllReducesAddToEveryStepByHand) {
  // Two layers, hidden 64: each step adds 2 x 2 all-reduces, each 1 ms of
  // latency plus tokens x 64 x 2 bytes x 2 (tp - 1) / tp at 1.28 MB/s:
  // 1 ms for the 10-token prefill, 0.1 ms for a decode token.
  // Prefill 10 + 4 x 2 = 18 ms; decodes 10 + 4 x 1.1 = 14.4 ms each.
  SimModel m;
  m.name = "tiny";
  m.shape = ModelShape{2, 64, 4, 2, 16, 128, 256, false};
  m.tp = 2;
  SimConfig c = Cluster(1, 2, {m});
  c.policy.tp_allreduce_latency_s = 1e-3;
  c.policy.tp_allreduce_bus_bytes_per_s = 1.28e6;
  auto r = Simulate(c, ConstantEngine(), {Req("x", "tiny", 0, 10, 3)});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_NEAR(Find(*r, "x").ttft_ms(), 18, 1e-6);
  EXPECT_NEAR(Find(*r, "x").e2e_ms(), 18 + 2 * 14.4, 1e-6);
}

TEST(TensorParallelTest, ShadowStepsSlowTheGroupsNeighbours) {
  // Serial steps of 10 ms. big (tp 2) spans both GPUs; s0 and s1 go one on
  // each (placement spreads them), so one shares the leader's GPU and the
  // other a shadow's. While big decodes, each of their iterations also
  // runs big's step: 20 ms per token. Without big, 10 ms.
  for (const bool big_runs : {true, false}) {
    SimConfig c = Cluster(
        1, 2, {Model("big", "llama-8b", 2), Model("s0", "llama-1b"), Model("s1", "llama-1b")});
    c.policy.overlap_steps = false;
    c.policy.tp_allreduce_latency_s = 0;  // and no bytes term:
    c.policy.tp_allreduce_bus_bytes_per_s = 1e30;
    std::vector<bench::TraceRecord> t = {Req("a", "s0", 0.005, 10, 6),
                                         Req("b", "s1", 0.005, 10, 6)};
    if (big_runs) t.push_back(Req("big", "big", 0, 10, 200));
    auto r = Simulate(c, ConstantEngine(), t);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->stats.initial_placed, 3);
    for (const char* id : {"a", "b"}) {
      EXPECT_EQ(Find(*r, id).status, "OK");
      EXPECT_NEAR(Find(*r, id).tpot_ms(), big_runs ? 20 : 10, 1e-6) << id << " " << big_runs;
    }
    // Each GPU stepped: the small models apart, big on both.
    ASSERT_EQ(r->stats.device_model_steps.size(), 2u);
    EXPECT_GT(r->stats.device_model_steps[0], 0);
    EXPECT_GT(r->stats.device_model_steps[1], 0);
  }
}

TEST(TensorParallelTest, TheGroupStepsInLockstepWithItsBusiestGpu) {
  // Serial 10 ms steps. big (tp 2) spans both GPUs; s0 and s1 sit one on
  // each. Only one of them is busy: on its GPU an iteration is big's part
  // plus its own step, 20 ms, and big, which cannot start a step before
  // every part has started the last, decodes at that GPU's pace, 20 ms a
  // token, whichever GPU the busy neighbour shares (leader's or shadow's).
  // With the neighbour on a shadow's GPU the leader runs up to one step
  // ahead at the start (its first steps take 10 ms), hence the tolerance.
  for (const char* busy : {"s0", "s1"}) {
    SimConfig c = Cluster(
        1, 2, {Model("big", "llama-8b", 2), Model("s0", "llama-1b"), Model("s1", "llama-1b")});
    c.policy.overlap_steps = false;
    c.policy.tp_allreduce_latency_s = 0;
    c.policy.tp_allreduce_bus_bytes_per_s = 1e30;
    auto r = Simulate(c, ConstantEngine(),
                      {Req("big", "big", 0, 10, 200), Req("n", busy, 0.005, 10, 400)});
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(Find(*r, "big").status, "OK");
    EXPECT_NEAR(Find(*r, "big").tpot_ms(), 20, 0.2) << busy;
    // Each GPU ran big's part once per token (199 decodes and the
    // prefill), the idle neighbour's GPU no more often than the other;
    // the busy one ran n's 400 steps too.
    const auto& steps = r->stats.device_model_steps;
    ASSERT_EQ(steps.size(), 2u);
    EXPECT_EQ(std::min(steps[0], steps[1]), 200) << busy;
    EXPECT_EQ(std::max(steps[0], steps[1]), 600) << busy;
  }
}

TEST(TensorParallelTest, RollingTheGroupStepsAtItsBusiestGpusPace) {
  // Rolling steps, every step 10 ms of GPU work and no latency (32 layers
  // of 0.3125 ms: big's part and the llama-8b neighbours alike). The busy
  // neighbour's GPU shares itself between its steps and big's part (two
  // steps always in flight: 20 ms each); big's leader begins a step only
  // once every part has begun the last, so big decodes at 20 ms a token,
  // whichever GPU the neighbour shares, as in lockstep.
  for (const char* busy : {"s0", "s1"}) {
    SimConfig c = Cluster(
        1, 2, {Model("big", "llama-8b", 2), Model("s0", "llama-8b"), Model("s1", "llama-8b")});
    c.policy.tp_allreduce_latency_s = 0;
    c.policy.tp_allreduce_bus_bytes_per_s = 1e30;
    ASSERT_TRUE(c.policy.rolling_steps);
    auto r = Simulate(c, testing::LayerEngine(0, 0.3125e-3),
                      {Req("big", "big", 0, 10, 200), Req("n", busy, 0.005, 10, 400)});
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->stats.initial_placed, 3);
    EXPECT_EQ(Find(*r, "big").status, "OK");
    EXPECT_NEAR(Find(*r, "big").tpot_ms(), 20, 0.2) << busy;
    // n: 20 ms a token beside big's part, then 10 ms alone (about 200 of each).
    EXPECT_NEAR(Find(*r, "n").tpot_ms(), 15, 0.5) << busy;
    const auto& steps = r->stats.device_model_steps;
    ASSERT_EQ(steps.size(), 2u);
    EXPECT_EQ(std::min(steps[0], steps[1]), 200) << busy;
    EXPECT_EQ(std::max(steps[0], steps[1]), 600) << busy;
  }
}

TEST(TensorParallelTest, EvictionFreesEveryPartAndTheGroupComesBack) {
  // One node of two GPUs. big (70B, tp 2: a 70 GB part on each) leaves no
  // GPU room for mid (14B, 30 GB): mid's request evicts big, big's next
  // request evicts mid, and big is loaded again on both GPUs.
  SimConfig c = Cluster(1, 2, {Model("big", "llama-70b", 2), Model("mid", "qwen-14b")});
  c.policy.idle_evict_after_s = 1;
  c.policy.rebalance_interval_s = 0;
  auto r = Simulate(
      c, ConstantEngine(),
      {Req("b1", "big", 0, 100, 10), Req("m1", "mid", 10, 100, 10), Req("b2", "big", 20, 100, 10)});
  ASSERT_TRUE(r.ok()) << r.status();
  for (const char* id : {"b1", "m1", "b2"}) EXPECT_EQ(Find(*r, id).status, "OK") << id;
  EXPECT_EQ(r->stats.initial_placed, 1);  // big only: mid fits beside no part
  EXPECT_EQ(r->stats.idle_evictions, 2);
  EXPECT_EQ(r->stats.activations, 2);
  // b2 waited for mid's drain and big's activation: after 20 s.
  EXPECT_GT(Find(*r, "b2").first_token_s, 20.0);
}

TEST(TensorParallelTest, ConfigChecksTp) {
  const std::string base = "calibration: c.json\ncluster: {nodes: 1, gpus_per_node: 4}\n";
  auto ok =
      server::ParseSimConfig(base + "models: [{name: a, shape: llama-70b, tp: 4}]\n", "/x/s.yaml");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->config.models[0].tp, 4);
  // 3 does not divide llama-8b's 32 heads.
  auto bad =
      server::ParseSimConfig(base + "models: [{name: a, shape: llama-8b, tp: 3}]\n", "/x/s.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("models[0].tp"), std::string::npos) << bad.status();
  // More GPUs than a node has.
  SimConfig c = Cluster(2, 4, {Model("a", "llama-70b", 8)});
  auto r = Simulate(c, ConstantEngine(), {});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("gpus_per_node"), std::string::npos) << r.status();
}

}  // namespace
}  // namespace ballast::sim
