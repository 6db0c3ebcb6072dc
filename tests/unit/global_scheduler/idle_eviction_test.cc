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

// A device of `memory` bytes named `device` with `kv_free` bytes of KV
// room (free blocks, empty slabs, unmapped budget) and `queued` requests
// waiting; its models (all READY) live on it.
NodeInfo Pressured(const std::string& id, const std::string& device, int64_t memory,
                   int64_t kv_free, int queued, bool elastic,
                   std::vector<std::pair<std::string, int64_t>> models) {
  NodeInfo n = Node(id, memory, {});
  v1::DeviceState& d = n.devices.front();
  d.set_name(device);
  d.set_kv_bytes_free(kv_free);
  d.set_memory_used_bytes(memory - kv_free);
  d.set_queue_length(queued);
  d.set_elastic(elastic);
  for (const auto& [name, weights] : models) {
    v1::ResidentModel m;
    m.set_name(name);
    m.set_device(device);
    m.set_weight_bytes(weights);
    m.set_state(v1::MODEL_STATE_READY);
    n.models.push_back(m);
  }
  return n;
}

TEST(IdleEviction, KvPressureEvictsAnIdleModelFromTheStarvedElasticDevice) {
  std::map<std::string, absl::Duration> idle = {{"hot", absl::Seconds(1)},
                                                {"cold", absl::Seconds(60)},
                                                {"colder", absl::Seconds(90)},
                                                {"elsewhere", absl::Seconds(900)}};
  auto idle_of = [&](const std::string& m) { return idle.at(m); };
  const absl::Duration t = absl::Seconds(45);
  // n1: 2% KV room with requests queued. n2: plenty; its long-idle model
  // must not be the victim.
  std::vector<NodeInfo> nodes = {
      Pressured("n1", "cuda:0", 100, 2, 3, true, {{"hot", 40}, {"cold", 30}, {"colder", 20}}),
      Pressured("n2", "cuda:0", 100, 50, 3, true, {{"elsewhere", 40}})};
  auto v = ChooseKvPressureVictim(nodes, idle_of, t, {}, 0.05, {});
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->model, "colder");
  EXPECT_EQ(v->node_id, "n1");
  // Skipped (leaving, or requests in flight): the next idle one.
  EXPECT_EQ(ChooseKvPressureVictim(nodes, idle_of, t, {"colder"}, 0.05, {})->model, "cold");
  // Below the fraction only counts: at 1% nothing is under pressure.
  EXPECT_FALSE(ChooseKvPressureVictim(nodes, idle_of, t, {}, 0.01, {}).has_value());
  // An eviction there not yet seen in a heartbeat holds the device.
  EXPECT_FALSE(
      ChooseKvPressureVictim(nodes, idle_of, t, {}, 0.05, {DeviceKey("n1", "cuda:0")}).has_value());
  // Nothing waits: no pressure, however full.
  nodes[0].devices.front().set_queue_length(0);
  EXPECT_FALSE(ChooseKvPressureVictim(nodes, idle_of, t, {}, 0.05, {}).has_value());
  nodes[0].devices.front().set_queue_length(3);
  // A static device's pools gain nothing from an eviction.
  nodes[0].devices.front().set_elastic(false);
  EXPECT_FALSE(ChooseKvPressureVictim(nodes, idle_of, t, {}, 0.05, {}).has_value());
  nodes[0].devices.front().set_elastic(true);
  // Layers the models could still lend are KV room: 2 free + 2 lendable
  // is below 5% of 100, 2 + 3 is not (the short model gets them within a
  // step; the eviction's reload would cost seconds).
  nodes[0].devices.front().set_kv_bytes_lendable(2);
  EXPECT_EQ(ChooseKvPressureVictim(nodes, idle_of, t, {}, 0.05, {})->model, "colder");
  nodes[0].devices.front().set_kv_bytes_lendable(3);
  EXPECT_FALSE(ChooseKvPressureVictim(nodes, idle_of, t, {}, 0.05, {}).has_value());
  nodes[0].devices.front().set_kv_bytes_lendable(0);
  // Only models idle past the threshold.
  EXPECT_FALSE(ChooseKvPressureVictim(nodes, idle_of, absl::Seconds(100), {}, 0.05, {}));
  // A load under way on the device: its pages are not pressure.
  nodes[0].models[0].set_state(v1::MODEL_STATE_LOADING);
  EXPECT_FALSE(ChooseKvPressureVictim(nodes, idle_of, t, {}, 0.05, {}).has_value());
}

TEST(IdleEviction, KvPressureLooksOnlyAtTheStarvedDevicesModels) {
  std::map<std::string, absl::Duration> idle = {{"on0", absl::Seconds(50)},
                                                {"on1", absl::Seconds(500)}};
  auto idle_of = [&](const std::string& m) { return idle.at(m); };
  NodeInfo n = Pressured("n1", "cuda:0", 100, 0, 2, true, {{"on0", 10}});
  v1::DeviceState other;
  other.set_name("cuda:1");
  other.set_memory_total_bytes(100);
  other.set_kv_bytes_free(90);
  other.set_queue_length(2);
  other.set_elastic(true);
  n.devices.push_back(other);
  v1::ResidentModel m;
  m.set_name("on1");
  m.set_device("cuda:1");
  m.set_weight_bytes(10);
  m.set_state(v1::MODEL_STATE_READY);
  n.models.push_back(m);
  auto v = ChooseKvPressureVictim({n}, idle_of, absl::Seconds(45), {}, 0.05, {});
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->model, "on0");  // on1 is idler, but its device has room
}

}  // namespace
}  // namespace ballast::global_scheduler
