// The scheduler's KVPR rebalancing pass (Scheduler::Rebalance) against fake
// nodes: it starts the first move of the plan that the cluster can take.
#include <string>

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

}  // namespace
}  // namespace ballast::global_scheduler
