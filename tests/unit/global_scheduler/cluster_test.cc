// ClusterState liveness, SessionDirectory turns, ModelRegistry checks and
// the baseline placement rule.
#include "global_scheduler/cluster_state.h"
#include "global_scheduler/idle_eviction.h"
#include "global_scheduler/model_registry.h"
#include "global_scheduler/placement.h"
#include "global_scheduler/session_directory.h"
#include "gtest/gtest.h"
#include "tests/unit/global_scheduler/fake_clock.h"

namespace ballast::global_scheduler {
namespace {

std::optional<std::string> NodeOf(const std::optional<Target>& t) {
  if (!t) return std::nullopt;
  return t->node_id;
}

v1::RegisterNodeRequest Node(const std::string& id, std::vector<std::string> models,
                             int64_t total = 1000, int64_t used = 0) {
  v1::RegisterNodeRequest r;
  r.set_node_id(id);
  r.set_address(id + ":1");
  auto* d = r.add_devices();
  d->set_name("cpu:0");
  d->set_memory_total_bytes(total);
  d->set_memory_used_bytes(used);
  for (const auto& m : models) {
    auto* rm = r.add_models();
    rm->set_name(m);
    rm->set_state(v1::MODEL_STATE_READY);
  }
  return r;
}

TEST(ClusterState, NodesDieAfterTheHeartbeatTimeoutAndCanComeBack) {
  FakeClock clock;
  ClusterState c(absl::Seconds(3), clock.fn());
  ASSERT_TRUE(c.Register(Node("a", {"m"})).ok());
  ASSERT_TRUE(c.Register(Node("b", {"m"})).ok());
  clock.now += absl::Seconds(2);
  v1::HeartbeatRequest hb;
  hb.set_node_id("a");
  *hb.add_models() = Node("a", {"m"}).models(0);
  EXPECT_EQ(c.Heartbeat(hb), HeartbeatResult::kOk);
  EXPECT_TRUE(c.SweepDead().empty());
  clock.now += absl::Seconds(2);  // b silent for 4 s, a for 2 s
  EXPECT_EQ(c.SweepDead(), std::vector<std::string>{"b"});
  EXPECT_EQ(c.NodesWithModel("m"), std::vector<std::string>{"a"});
  hb.set_node_id("b");
  EXPECT_EQ(c.Heartbeat(hb), HeartbeatResult::kReregister);  // dead nodes register again
  ASSERT_TRUE(c.Register(Node("b", {"m"})).ok());
  EXPECT_TRUE(c.IsAlive("b"));
  hb.set_node_id("ghost");
  EXPECT_EQ(c.Heartbeat(hb), HeartbeatResult::kReregister);
}

v1::RegisterNodeRequest Incarnation(v1::RegisterNodeRequest r, const std::string& address,
                                    const std::string& incarnation) {
  r.set_address(address);
  r.set_incarnation(incarnation);
  return r;
}

// A live id is not taken over by another process; a restart (same address,
// or the old one dead) replaces it, and the old incarnation is told so.
TEST(ClusterState, ALiveNodeIdIsNotHijacked) {
  FakeClock clock;
  ClusterState c(absl::Seconds(3), clock.fn());
  ASSERT_TRUE(c.Register(Incarnation(Node("a", {"m"}), "10.0.0.1:1", "one")).ok());
  const absl::Status st = c.Register(Incarnation(Node("a", {}), "10.0.0.2:1", "two"));
  EXPECT_EQ(st.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_NE(st.message().find("\"a\""), std::string::npos) << st;
  EXPECT_NE(st.message().find("10.0.0.1:1"), std::string::npos) << st;
  EXPECT_EQ(c.Get("a")->address, "10.0.0.1:1");
  EXPECT_EQ(c.NodesWithModel("m"), std::vector<std::string>{"a"});
  // A restart at the same address replaces the old incarnation.
  ASSERT_TRUE(c.Register(Incarnation(Node("a", {}), "10.0.0.1:1", "three")).ok());
  v1::HeartbeatRequest hb;
  hb.set_node_id("a");
  hb.set_incarnation("one");
  EXPECT_EQ(c.Heartbeat(hb), HeartbeatResult::kReplaced);
  hb.set_incarnation("three");
  EXPECT_EQ(c.Heartbeat(hb), HeartbeatResult::kOk);
  // Once it is dead, any incarnation may take the id.
  clock.now += absl::Seconds(4);
  c.SweepDead();
  ASSERT_TRUE(c.Register(Incarnation(Node("a", {}), "10.0.0.2:1", "four")).ok());
  // And the caller may replace a live one it found unreachable.
  ASSERT_TRUE(c.Register(Incarnation(Node("a", {}), "10.0.0.3:1", "five"), true).ok());
  EXPECT_EQ(c.Get("a")->address, "10.0.0.3:1");
}

TEST(ClusterState, ASuspectNodeIsSkippedUntilItsNextHeartbeat) {
  FakeClock clock;
  ClusterState c(absl::Seconds(3), clock.fn());
  ASSERT_TRUE(c.Register(Node("a", {"m"})).ok());
  ASSERT_TRUE(c.Register(Node("b", {"m"})).ok());
  const uint64_t version = c.RoutingVersion();
  c.MarkSuspect("a");
  EXPECT_NE(c.RoutingVersion(), version);
  EXPECT_EQ(c.NodesWithModel("m"), std::vector<std::string>{"b"});
  v1::HeartbeatRequest hb;
  hb.set_node_id("a");
  *hb.add_models() = Node("a", {"m"}).models(0);
  EXPECT_EQ(c.Heartbeat(hb), HeartbeatResult::kOk);
  EXPECT_EQ(c.NodesWithModel("m"), (std::vector<std::string>{"a", "b"}));
}

TEST(ClusterState, LeastLoadedCountsInflightAndQueues) {
  FakeClock clock;
  ClusterState c(absl::Seconds(3), clock.fn());
  ASSERT_TRUE(c.Register(Node("a", {"m"})).ok());
  ASSERT_TRUE(c.Register(Node("b", {"m"})).ok());
  EXPECT_EQ(c.LeastLoaded({"a", "b"}), "a");  // tie -> lower id
  c.AddInflight("a", 2);
  EXPECT_EQ(c.LeastLoaded({"a", "b"}), "b");
  c.AddInflight("b", 3);
  EXPECT_EQ(c.LeastLoaded({"a", "b"}), "a");
  EXPECT_FALSE(c.LeastLoaded({}).has_value());
}

TEST(SessionDirectory, OneTurnAtATimeAndHistoryGrowsOnCommit) {
  SessionDirectory d;
  auto t1 = d.Begin("s", "m");
  ASSERT_TRUE(t1.ok());
  EXPECT_TRUE(t1->history.empty());
  EXPECT_EQ(d.Begin("s", "m").status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(
      d.Commit("s", "node-a", {.prompt_tokens = {1, 2}, .output_tokens = {3}, .messages = {}})
          .ok());
  auto t2 = d.Begin("s", "m");
  ASSERT_TRUE(t2.ok());
  EXPECT_EQ(t2->history, (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(t2->node_id, "node-a");
  d.Abort("s");  // failed turn: history unchanged
  EXPECT_EQ(d.Begin("s", "other").status().code(), absl::StatusCode::kInvalidArgument);
  d.ForgetNode("node-a");
  auto t3 = d.Begin("s", "m");
  EXPECT_EQ(t3->node_id, "");
  EXPECT_EQ(t3->history.size(), 3u);
  d.Abort("s");
  bool existed = false;
  ASSERT_TRUE(d.End("s", &existed).ok());
  EXPECT_TRUE(existed);
  EXPECT_EQ(d.size(), 0);
  // A first turn that fails leaves no session behind.
  ASSERT_TRUE(d.Begin("t", "m").ok());
  d.Abort("t");
  EXPECT_EQ(d.size(), 0);
}

v1::ChatMessage Msg(const std::string& role, const std::string& content) {
  v1::ChatMessage m;
  m.set_role(role);
  m.set_content(content);
  return m;
}

TEST(SessionDirectory, ChatTurnsReplaceTheTokensAndKeepTheConversation) {
  SessionDirectory d;
  ASSERT_TRUE(d.Begin("c", "m", /*chat=*/true).ok());
  EXPECT_TRUE(d.Commit("c", "node-a",
                       {.prompt_tokens = {1, 2, 3},
                        .output_tokens = {4},
                        .prompt_replaces_history = true,
                        .messages = {Msg("user", "hi"), Msg("assistant", "hello")}})
                  .ok());
  auto t = d.Begin("c", "m", true);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->history, (std::vector<int>{1, 2, 3, 4}));
  ASSERT_EQ(t->messages.size(), 2u);
  EXPECT_EQ(t->messages[1].content(), "hello");
  // The second turn's rendered prompt re-tokenises the whole conversation.
  EXPECT_TRUE(d.Commit("c", "node-a",
                       {.prompt_tokens = {1, 2, 3, 4, 5},
                        .output_tokens = {6},
                        .prompt_replaces_history = true,
                        .messages = {Msg("user", "more"), Msg("assistant", "ok")}})
                  .ok());
  t = d.Begin("c", "m", true);
  EXPECT_EQ(t->history, (std::vector<int>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(t->messages.size(), 4u);
  d.Abort("c");
  // A chat session takes no prompt turn, and a text session no chat turn.
  EXPECT_EQ(d.Begin("c", "m", false).status().code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(d.Begin("t", "m", false).ok());
  EXPECT_TRUE(
      d.Commit("t", "node-a", {.prompt_tokens = {1}, .output_tokens = {2}, .messages = {}}).ok());
  EXPECT_EQ(d.Begin("t", "m", true).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ModelRegistry, ValidatesSpecs) {
  ModelRegistry r;
  EXPECT_EQ(r.Add({"", "/p"}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.Add({"m", ""}).code(), absl::StatusCode::kInvalidArgument);
  ModelSpec bad{"m", "/p"};
  bad.kv_dtype = "int3";
  EXPECT_EQ(r.Add(bad).code(), absl::StatusCode::kInvalidArgument);
  ModelSpec bad_quant{"m", "/p"};
  bad_quant.quantization = "int4";
  const absl::Status refused = r.Add(bad_quant);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("quantization \"int4\" is unknown"), std::string::npos)
      << refused;
  EXPECT_TRUE(r.Add({"m", "/p"}).ok());
  EXPECT_TRUE(r.Add({"m", "/p"}).ok());  // idempotent
  EXPECT_EQ(r.Add({"m", "/q"}).code(), absl::StatusCode::kAlreadyExists);
  // Another quantization is another spec, not an update.
  ModelSpec fp8{"m", "/p"};
  fp8.quantization = "fp8";
  EXPECT_EQ(r.Add(fp8).code(), absl::StatusCode::kAlreadyExists);
  // Only the KV floor/limit changed: an update, reported to the caller.
  ModelSpec limits{"m", "/p"};
  limits.kv_floor_bytes = 1 << 20;
  limits.kv_limit_bytes = 4 << 20;
  bool changed = false;
  EXPECT_TRUE(r.Add(limits, &changed).ok());
  EXPECT_TRUE(changed);
  EXPECT_EQ(r.Get("m")->spec.kv_limit_bytes, 4 << 20);
  EXPECT_TRUE(r.Add(limits, &changed).ok());
  EXPECT_FALSE(changed);
  limits.kv_floor_bytes = 8 << 20;  // floor above limit
  EXPECT_EQ(r.Add(limits).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(r.Remove("m").ok());
  EXPECT_EQ(r.Remove("m").code(), absl::StatusCode::kNotFound);
}

TEST(Placement, MostFreeMemoryThenFewestModels) {
  FakeClock clock;
  ClusterState c(absl::Seconds(3), clock.fn());
  ASSERT_TRUE(c.Register(Node("a", {"x"}, 1000, 600)).ok());
  ASSERT_TRUE(c.Register(Node("b", {}, 1000, 100)).ok());
  ASSERT_TRUE(c.Register(Node("c", {"y", "z"}, 1000, 100)).ok());
  EXPECT_EQ(NodeOf(ChooseNodeForLoad(c.Snapshot(), {})), "b");
  EXPECT_EQ(NodeOf(ChooseNodeForLoad(c.Snapshot(), {"b"})), "c");
  EXPECT_EQ(NodeOf(ChooseNodeForLoad(c.Snapshot(), {"a", "b", "c"})), std::nullopt);
  clock.now += absl::Seconds(10);
  c.SweepDead();
  EXPECT_EQ(NodeOf(ChooseNodeForLoad(c.Snapshot(), {})), std::nullopt);  // dead nodes never chosen
}

// KVPR goes where the KV pressure after the load is lowest, not where the
// most memory is free: a node whose model is hot is avoided.
TEST(Placement, KvprAvoidsTheNodeUnderKvPressure) {
  FakeClock clock;
  ClusterState c(absl::Seconds(3), clock.fn());
  auto with_weights = [](v1::RegisterNodeRequest r, int64_t w) {
    for (auto& m : *r.mutable_models()) m.set_weight_bytes(w);
    return r;
  };
  ASSERT_TRUE(c.Register(with_weights(Node("a", {"hot"}, 1000, 100), 100)).ok());   // free 900
  ASSERT_TRUE(c.Register(with_weights(Node("b", {"cold"}, 1000, 500), 500)).ok());  // free 500
  ASSERT_TRUE(
      c.Register(with_weights(Node("c", {"tiny"}, 150, 100), 100)).ok());  // no room for 100 more
  auto demand = [](const std::string& m) { return m == "hot" ? 10.0 : 1.0; };
  EXPECT_EQ(NodeOf(ChooseNodeForLoad(c.Snapshot(), {"c"})), "a");  // the baseline: most free memory
  // KVPR(a) = (10 + 1) / (1000 - 100 - 100) = 0.014; KVPR(b) = (1 + 1) / 400 = 0.005.
  EXPECT_EQ(NodeOf(ChooseNodeKvpr(c.Snapshot(), {}, demand, 1.0, 100)), "b");
  EXPECT_EQ(NodeOf(ChooseNodeKvpr(c.Snapshot(), {"b"}, demand, 1.0, 100)), "a");
  EXPECT_EQ(NodeOf(ChooseNodeKvpr(c.Snapshot(), {"a", "b"}, demand, 1.0, 100)),
            std::nullopt);  // c too small
  // No statistics yet (all demands 0): ties fall back to the most free memory.
  EXPECT_EQ(NodeOf(ChooseNodeKvpr(
                c.Snapshot(), {}, [](const std::string&) { return 0.0; }, 0, 100)),
            "a");
}

// FineServe's score: the average MME of the node's models after the load,
// times the contested memory left. An FP8-KV model (mu twice a BF16 one)
// pulls a new model towards its node; so does having fewer models.
TEST(Placement, MmeScoresAverageEfficiencyTimesContestedMemory) {
  FakeClock clock;
  ClusterState c(absl::Seconds(3), clock.fn());
  auto with_weights = [](v1::RegisterNodeRequest r, int64_t w) {
    for (auto& m : *r.mutable_models()) m.set_weight_bytes(w);
    return r;
  };
  ASSERT_TRUE(c.Register(with_weights(Node("a", {"bf16"}, 1000, 0), 200)).ok());
  ASSERT_TRUE(c.Register(with_weights(Node("b", {"fp8"}, 1000, 0), 200)).ok());
  ASSERT_TRUE(c.Register(with_weights(Node("c", {"x", "y"}, 1000, 0), 100)).ok());
  auto mu = [](const std::string& m) { return m == "fp8" ? 2.0 : 1.0; };
  // a: (1 + 1) / 2 * (1000 - 300) = 700; b: (2 + 1) / 2 * 700 = 1050;
  // c: (1 + 1 + 1) / 3 * (1000 - 300) = 700.
  EXPECT_EQ(NodeOf(ChooseNodeMme(c.Snapshot(), {}, mu, 1.0, 100)), "b");
  // Without b, a and c tie at 700: the baseline order breaks it (fewer models).
  EXPECT_EQ(NodeOf(ChooseNodeMme(c.Snapshot(), {"b"}, mu, 1.0, 100)), "a");
  EXPECT_EQ(NodeOf(ChooseNodeMme(c.Snapshot(), {}, mu, 1.0, 900)),
            std::nullopt);  // no room anywhere
}

// Placement is per device: a node with several GPUs is several candidates,
// and a model must fit one of them. Per node, a's two GPUs would look like
// one 2000-byte device holding the hot model; per device, a's idle GPU 1 is
// the least pressured place of all.
TEST(Placement, KvprAndRoomArePerDeviceNotPerNode) {
  FakeClock clock;
  ClusterState c(absl::Seconds(3), clock.fn());
  v1::RegisterNodeRequest a = Node("a", {"hot"}, 1000, 100);
  auto* gpu1 = a.add_devices();
  gpu1->set_name("cuda:1");
  gpu1->set_memory_total_bytes(1000);
  a.mutable_devices(0)->set_name("cuda:0");
  a.mutable_models(0)->set_device("cuda:0");
  a.mutable_models(0)->set_weight_bytes(100);
  v1::RegisterNodeRequest b = Node("b", {"cold"}, 1000, 100);
  b.mutable_models(0)->set_weight_bytes(100);
  b.mutable_models(0)->set_device("cpu:0");
  ASSERT_TRUE(c.Register(a).ok());
  ASSERT_TRUE(c.Register(b).ok());
  auto demand = [](const std::string& m) { return m == "hot" ? 10.0 : 1.0; };
  // Per node: a = 11 / (2000 - 200) = 0.0061 > b = 2 / 800 = 0.0025.
  // Per device: a/cuda:1 = 1 / 900 = 0.0011 < b = 0.0025 < a/cuda:0.
  EXPECT_EQ(ChooseNodeKvpr(c.Snapshot(), {}, demand, 1.0, 100), (Target{"a", "cuda:1"}));
  EXPECT_EQ(ChooseNodeForLoad(c.Snapshot(), {}), (Target{"a", "cuda:1"}));  // 1000 free
  // 1500 bytes of weights fit a's memory in total but no single GPU of it.
  const NodeInfo node_a = *c.Get("a");
  EXPECT_FALSE(HasWeightRoom(node_a, 1500));
  EXPECT_TRUE(HasWeightRoom(node_a, 950));
  EXPECT_EQ(ChooseNodeKvpr(c.Snapshot(), {}, demand, 1.0, 1500), std::nullopt);
  EXPECT_EQ(ChooseNodeMme(
                c.Snapshot(), {}, [](const std::string&) { return 1.0; }, 1.0, 1500),
            std::nullopt);
}

// With a step budget (kvpr.h): x has the lower KVPR, but its model's 20 ms
// step leaves no room under the new model's 15 ms TPOT SLO, so y (1 ms)
// takes it; where the budget holds nowhere, KVPR decides again.
TEST(Placement, KvprWithAStepBudgetSkipsADeviceTooSlowForTheTpot) {
  FakeClock clock;
  ClusterState c(absl::Seconds(3), clock.fn());
  for (auto [id, model] : {std::pair{"x", "hot"}, std::pair{"y", "cold"}}) {
    v1::RegisterNodeRequest r = Node(id, {model}, 1000, 100);
    r.mutable_models(0)->set_weight_bytes(100);
    ASSERT_TRUE(c.Register(r).ok());
  }
  // KVPR(x) = (0 + 1) / 800 < KVPR(y) = (10 + 1) / 800.
  auto demand = [](const std::string& m) { return m == "cold" ? 10.0 : 0.0; };
  EXPECT_EQ(NodeOf(ChooseNodeKvpr(c.Snapshot(), {}, demand, 1.0, 100)), "x");
  StepBudget budget;
  budget.step_s = [](const std::string& m) { return m == "hot" ? 0.020 : 0.001; };
  budget.tpot_s = [](const std::string&) { return 0.1; };
  budget.new_step_s = 0.002;
  budget.new_tpot_s = 0.015;
  EXPECT_EQ(NodeOf(ChooseNodeKvpr(c.Snapshot(), {}, demand, 1.0, 100, &budget)), "y");
  budget.headroom = 0;  // off
  EXPECT_EQ(NodeOf(ChooseNodeKvpr(c.Snapshot(), {}, demand, 1.0, 100, &budget)), "x");
  budget.headroom = 1;
  budget.new_step_s = 0.5;  // within the budget nowhere
  EXPECT_EQ(NodeOf(ChooseNodeKvpr(c.Snapshot(), {}, demand, 1.0, 100, &budget)), "x");
}

}  // namespace
}  // namespace ballast::global_scheduler
