// Admin.DrainNode on a real cluster (issue 19, item 5): the drained node's
// models move to the other node and keep serving exactly, nothing new is
// placed on it, the cordon can be lifted, and `ballast drain --wait` (the
// Kubernetes preStop hook) returns once the node holds no models.
#include <cstdlib>

#include "tests/integration/cluster_fixture.h"

namespace ballast {
namespace {

class NodeDrainTest : public ClusterTest {
 protected:
  ClusterSetup Cluster() override {
    ClusterSetup s = ClusterTest::Cluster();
    engine::SyntheticModelSpec g = s.models[0].second;
    g.seed = 23;
    s.models.push_back({"gamma", g});  // written, registered by the test
    return s;
  }
  v1::DrainNodeResponse Drain(const std::string& node, bool undo, grpc::Status* st) {
    grpc::ClientContext ctx;
    v1::DrainNodeRequest req;
    req.set_node_id(node);
    req.set_undo(undo);
    v1::DrainNodeResponse resp;
    *st = admin_->DrainNode(&ctx, req, &resp);
    return resp;
  }
  // Replicas the scheduler places on `node`, in any state.
  int ModelsOn(const std::string& node) {
    int n = 0;
    const v1::ClusterState state = State();
    for (const auto& m : state.models())
      for (const auto& r : m.replicas()) n += r.node_id() == node;
    return n;
  }
  bool Draining(const std::string& node) {
    const v1::ClusterState state = State();
    for (const auto& ns : state.nodes())
      if (ns.node_id() == node) return ns.draining();
    return false;
  }
};

TEST_F(NodeDrainTest, ModelsMoveAwayKeepServingAndNothingNewLands) {
  const std::string from = NodeOf("alpha");
  const std::string to = from == "n1" ? "n2" : "n1";
  grpc::Status st;
  const v1::DrainNodeResponse r = Drain(from, false, &st);
  ASSERT_TRUE(st.ok()) << st.error_message();
  ASSERT_EQ(r.moving_size(), 1);
  EXPECT_EQ(r.moving(0), "alpha");
  EXPECT_TRUE(Draining(from));
  ASSERT_TRUE(
      WaitFor([&] { return NodeOf("alpha") == to && ModelsOn(from) == 0; }, absl::Seconds(20)))
      << Logs();
  const StreamResult moved = Generate("alpha", "The cat sat on", 8);
  ASSERT_TRUE(moved.status.ok()) << moved.status.error_message();
  EXPECT_EQ(moved.ids, Reference("alpha", Bytes("The cat sat on", true), 8));
  EXPECT_EQ(moved.final.node_id(), to);

  Register("gamma");  // placed on the only node not draining
  ASSERT_TRUE(WaitFor([&] { return ReadyReplicas("gamma") == 1; }, absl::Seconds(20))) << Logs();
  EXPECT_EQ(NodeOf("gamma"), to);

  Drain("no-such-node", false, &st);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::NOT_FOUND);
  Drain(from, true, &st);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_FALSE(Draining(from));

  // The preStop path: drain the other node from the command line and wait.
  const std::string cmd = std::string(BALLAST_BINARY_DIR) + "/server/ballast drain --target " +
                          Addr(sched_port_) + " --node " + to + " --wait 30 > /dev/null";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << Logs();
  EXPECT_EQ(ModelsOn(to), 0);
  for (const std::string model : {"alpha", "beta", "gamma"}) EXPECT_EQ(NodeOf(model), from);
  const StreamResult back = Generate("beta", "Hello", 8);
  ASSERT_TRUE(back.status.ok()) << back.status.error_message();
  EXPECT_EQ(back.ids, Reference("beta", Bytes("Hello", true), 8));
}

}  // namespace
}  // namespace ballast
