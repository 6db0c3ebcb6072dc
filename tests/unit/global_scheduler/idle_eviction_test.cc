// Idle eviction's victim rule and the weight-room test.
#include "global_scheduler/idle_eviction.h"

#include <map>

#include "gtest/gtest.h"

namespace ballast::global_scheduler {
namespace {

NodeInfo Node(const std::string& id, int64_t memory,
              std::vector<std::tuple<std::string, int64_t, v1::ModelState>> models) {
  NodeInfo n;
  n.node_id = id;
  n.alive = true;
  v1::DeviceState d;
  d.set_memory_total_bytes(memory);
  n.devices.push_back(d);
  for (const auto& [name, weights, state] : models) {
    v1::ResidentModel m;
    m.set_name(name);
    m.set_weight_bytes(weights);
    m.set_state(state);
    n.models.push_back(m);
  }
  return n;
}

TEST(IdleEviction, LongestIdlePastTheThresholdThenLargerWeights) {
  std::map<std::string, absl::Duration> idle = {{"a", absl::Seconds(50)},
                                                {"b", absl::Seconds(90)},
                                                {"c", absl::Seconds(90)},
                                                {"d", absl::Seconds(10)},
                                                {"e", absl::Seconds(300)}};
  auto idle_of = [&](const std::string& m) { return idle.at(m); };
  std::vector<NodeInfo> nodes = {
      Node("n1", 100, {{"a", 10, v1::MODEL_STATE_READY}, {"b", 20, v1::MODEL_STATE_READY}}),
      Node("n2", 100, {{"c", 30, v1::MODEL_STATE_READY}, {"d", 5, v1::MODEL_STATE_READY}}),
      Node("n3", 100, {{"e", 5, v1::MODEL_STATE_DRAINING}})};
  // b and c are idle longest; c frees more. e is already draining.
  auto v = ChooseIdleVictim(nodes, idle_of, absl::Seconds(45), {});
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->model, "c");
  EXPECT_EQ(v->node_id, "n2");
  // Skipped models (the one activating, ones leaving) are never chosen.
  v = ChooseIdleVictim(nodes, idle_of, absl::Seconds(45), {"c"});
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->model, "b");
  // Nothing idle long enough: no victim.
  EXPECT_FALSE(ChooseIdleVictim(nodes, idle_of, absl::Seconds(400), {}).has_value());
  // A dead node's models are not candidates.
  nodes[1].alive = false;
  EXPECT_EQ(ChooseIdleVictim(nodes, idle_of, absl::Seconds(45), {})->model, "b");
}

TEST(IdleEviction, WeightRoomCountsResidentWeightsNotKv) {
  const NodeInfo n =
      Node("n1", 100, {{"a", 40, v1::MODEL_STATE_READY}, {"b", 30, v1::MODEL_STATE_LOADING}});
  EXPECT_TRUE(HasWeightRoom(n, 29));
  EXPECT_FALSE(HasWeightRoom(n, 30));
  EXPECT_TRUE(HasWeightRoom(n, 0));  // unknown size: try
}

}  // namespace
}  // namespace ballast::global_scheduler
