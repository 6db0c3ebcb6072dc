// The scheduler's KVPR placement against fake nodes: the rebalancing pass
// (Scheduler::Rebalance) starts the first move of the plan that the
// cluster can take, and the step budget (scheduler.step_budget_headroom)
// reads the decode steps the nodes report in their heartbeats.
#include <string>
#include <tuple>

#include "global_scheduler/scheduler.h"
#include "gtest/gtest.h"
#include "tests/unit/global_scheduler/fake_clock.h"
#include "tests/unit/global_scheduler/fake_node.h"

namespace ballast::global_scheduler {
namespace {

// Three equally busy models share a/cuda:0. The plan (Algorithm 1) keeps
// h1 there, moves h2 to a/cuda:1 and h3 to b/cuda:0. The daemon moves only
// between nodes, so h2's move is refused; the pass goes on to h3's, which
// loads on b. (It used to stop at the refused move: nothing moved, ever.)
TEST(Rebalance, ARefusedMoveDoesNotBlockTheNextOne) {
  FakeNode a, b;
  FakeClock clock;
  SchedulerOptions o;
  o.placement_policy = "kvpr";
  o.rebalance_interval = absl::Seconds(30);
  o.idle_evict_after = absl::ZeroDuration();
  o.models = {{"h1", "/m/h1"}, {"h2", "/m/h2"}, {"h3", "/m/h3"}};
  auto s = *Scheduler::Create(o, clock.fn());
  v1::RegisterNodeRequest na =
      NodeAt("a", a, {"cuda:0", "cuda:1"}, {{"h1", "cuda:0"}, {"h2", "cuda:0"}, {"h3", "cuda:0"}});
  for (auto& m : *na.mutable_models()) m.set_kv_bytes_per_token(1000);
  ASSERT_TRUE(s->RegisterNode(na).ok());
  ASSERT_TRUE(s->RegisterNode(NodeAt("b", b, {"cuda:0"})).ok());
  clock.now += absl::Seconds(1);
  for (const char* m : {"h1", "h2", "h3"}) s->RecordCompletion(m, 1000, 1000, "");
  s->RunControlTick();
  ASSERT_TRUE(b.AwaitCalls(1, 0));
  EXPECT_EQ(b.loads()[0], (std::pair<std::string, std::string>{"h3", "cuda:0"}));
  EXPECT_TRUE(a.loads().empty());  // nothing moved within node a
  s->Stop();
}

// x holds "slow", whose decode step its heartbeat reports at 20 ms; y
// holds "cold" (1 ms), whose traffic makes y's KV pressure higher. A new
// model with a 15 ms TPOT SLO goes to x by KVPR alone; with the step
// budget, to y (1 ms + its own unknown step fits 15 ms, 20 ms does not).
TEST(StepBudget, ANewReplicaAvoidsADeviceWhoseReportedStepsExceedItsTpot) {
  for (const double headroom : {0.0, 1.0}) {
    FakeNode x, y;
    FakeClock clock;
    SchedulerOptions o;
    o.placement_policy = "kvpr";
    o.rebalance_interval = absl::ZeroDuration();
    o.step_budget_headroom = headroom;
    ModelSpec tight{"tight", "/m/tight"};
    tight.tpot_ms = 15;
    o.models = {{"slow", "/m/slow"}, {"cold", "/m/cold"}};
    auto s = *Scheduler::Create(o, clock.fn());
    for (auto [node, fake, model, step_ms] :
         {std::tuple{"x", &x, "slow", 20.0}, std::tuple{"y", &y, "cold", 1.0}}) {
      v1::RegisterNodeRequest r = NodeAt(node, *fake, {"cpu:0"}, {{model, "cpu:0"}});
      r.mutable_models(0)->set_kv_bytes_per_token(1000);
      ASSERT_TRUE(s->RegisterNode(r).ok());
      v1::HeartbeatRequest hb;
      hb.set_node_id(node);
      *hb.mutable_devices() = r.devices();
      *hb.mutable_models() = r.models();
      hb.mutable_models(0)->set_decode_step_ms(step_ms);
      ASSERT_FALSE(s->Heartbeat(hb).reregister());
    }
    clock.now += absl::Seconds(1);
    s->RecordCompletion("cold", 1000, 1000, "");
    ASSERT_TRUE(s->RegisterModel(tight).ok());
    s->RunControlTick();
    FakeNode& want = headroom > 0 ? y : x;
    ASSERT_TRUE(want.AwaitCalls(1, 0)) << headroom;
    EXPECT_EQ(want.loads()[0].first, "tight");
    s->Stop();
  }
}

}  // namespace
}  // namespace ballast::global_scheduler
