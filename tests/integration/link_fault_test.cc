// Faults on the links between the scheduler and its nodes (issue 19's
// fault tests), through loopback proxies (tcp_proxy.h) on both directions
// of each node's link: the scheduler dials the node through one, the node
// its scheduler through the other. Each test ends with nothing the client
// was told succeeded lost, and every output equal to an in-process
// reference engine's.
#include <memory>

#include "tests/integration/cluster_fixture.h"
#include "tests/integration/tcp_proxy.h"

namespace ballast {
namespace {

using Mode = testing::TcpProxy::Mode;

class LinkFaultTest : public ClusterTest {
 protected:
  ClusterSetup Cluster() override {
    ClusterSetup s = ClusterTest::Cluster();
    LargerAlpha(&s);
    return s;
  }
  std::string NodeSchedulerAddress(int i) override {
    to_sched_[i] = std::make_unique<testing::TcpProxy>(sched_port_);
    return Addr(to_sched_[i]->port());
  }
  std::vector<std::string> ExtraNodeArgs(int i) override {
    to_node_[i] = std::make_unique<testing::TcpProxy>(node_ports_[i]);
    return {"--advertise", Addr(to_node_[i]->port())};
  }
  int Index(const std::string& node_id) const { return node_id == "n1" ? 0 : 1; }
  // Both directions of node i's link.
  void Link(int i, Mode m) {
    to_node_[i]->SetMode(m);
    to_sched_[i]->SetMode(m);
  }
  void Delay(int i, absl::Duration d) {
    to_node_[i]->SetDelay(d);
    to_sched_[i]->SetDelay(d);
  }
  // The token ids a session's next turn starts from.
  static std::vector<int> Extend(std::vector<int> history, const std::string& prompt,
                                 const std::vector<int>& output) {
    const std::vector<int> turn = Bytes(prompt, history.empty());
    history.insert(history.end(), turn.begin(), turn.end());
    history.insert(history.end(), output.begin(), output.end());
    return history;
  }
  StreamResult Turn(const std::string& session, const std::string& prompt, int n,
                    const std::function<void(int)>& on_token = {}) {
    v1::GenerateRequest req;
    req.set_model("alpha");
    req.set_prompt(prompt);
    req.set_session_id(session);
    req.mutable_sampling()->set_max_tokens(n);
    req.mutable_sampling()->set_ignore_eos(true);
    return Run(req, absl::Seconds(30), on_token);
  }

  std::unique_ptr<testing::TcpProxy> to_node_[2], to_sched_[2];
};

// 150 ms each way on every link: slower, never different.
TEST_F(LinkFaultTest, ADelayedLinkSlowsRequestsButChangesNoToken) {
  for (int i = 0; i < 2; ++i) Delay(i, absl::Milliseconds(150));
  const absl::Time t0 = absl::Now();
  StreamResult a = Generate("alpha", "Hello", 8);
  const absl::Duration took = absl::Now() - t0;
  ASSERT_TRUE(a.status.ok()) << a.status.error_message() << Logs();
  EXPECT_EQ(a.ids, Reference("alpha", Bytes("Hello", true), 8));
  EXPECT_GE(took, absl::Milliseconds(300));  // the request and its tokens crossed the link
  StreamResult b = Generate("beta", "Hello", 8);
  ASSERT_TRUE(b.status.ok()) << b.status.error_message();
  EXPECT_EQ(b.ids, Reference("beta", Bytes("Hello", true), 8));
  // A session's two turns, and heartbeats, all through the delay.
  StreamResult t1 = Turn("s", "Hi", 6);
  ASSERT_TRUE(t1.status.ok()) << t1.status.error_message();
  StreamResult t2 = Turn("s", " there", 6);
  ASSERT_TRUE(t2.status.ok()) << t2.status.error_message();
  EXPECT_EQ(t2.ids, Reference("alpha", Extend(Extend({}, "Hi", t1.ids), " there", {}), 6));
  EXPECT_EQ(AliveNodes(), 2);
}

// The link to alpha's node is reset after the client reads the first token
// of a session turn: the client is told the turn failed (it was never acknowledged), so
// the turn is not in the session's history; once the link is back, the
// next turn continues from the last acknowledged one, exactly.
TEST_F(LinkFaultTest, ALinkCutMidStreamLosesNothingAcknowledged) {
  const int home = Index(NodeOf("alpha"));
  StreamResult t1 = Turn("s", "Hi", 4);
  ASSERT_TRUE(t1.status.ok()) << t1.status.error_message();
  // Tokens cross the link 150 ms after the node sends them, and 200 take
  // longer than that to generate: when the client reads the first one, the
  // rest are on the link or still to come, so the cut lands mid-stream.
  // (Keepalive pings, answered within a second, see a 300 ms round trip.)
  to_node_[home]->SetDelay(absl::Milliseconds(150));
  StreamResult cut = Turn("s", " a long answer", 200, [&](int tokens) {
    if (tokens == 1) Link(home, Mode::kCut);
  });
  to_node_[home]->SetDelay(absl::ZeroDuration());
  EXPECT_EQ(cut.status.error_code(), grpc::StatusCode::UNAVAILABLE)
      << cut.status.error_message() << " after " << cut.ids.size() << " tokens";
  EXPECT_LT(cut.ids.size(), 200u);
  Link(home, Mode::kPass);
  ASSERT_TRUE(
      WaitFor([&] { return AliveNodes() == 2 && ReadyReplicas("alpha") == 1; }, absl::Seconds(20)))
      << Logs();
  StreamResult t3 = Turn("s", " again", 6);
  ASSERT_TRUE(t3.status.ok()) << t3.status.error_message() << Logs();
  const std::vector<int> history = Extend({}, "Hi", t1.ids);
  EXPECT_EQ(t3.ids, Reference("alpha", Extend(history, " again", {}), 6));
  EXPECT_EQ(t3.final.usage().prompt_tokens(), static_cast<int>(history.size() + 6));
}

// alpha's node is cut off without a reset (a partition: nothing is
// delivered, nothing refused): the scheduler declares it dead after the
// heartbeat timeout, loads alpha on the other node, and a request waiting
// meanwhile is served there; the session continues from its history,
// recomputed, exactly. When the partition heals the node rejoins.
TEST_F(LinkFaultTest, APartitionedNodeIsReplacedAndRejoinsWithNothingLost) {
  const int home = Index(NodeOf("alpha"));
  StreamResult t1 = Turn("s", "Hi", 4);
  ASSERT_TRUE(t1.status.ok()) << t1.status.error_message();
  Link(home, Mode::kBlackhole);
  StreamResult t2 = Turn("s", " more", 6);
  ASSERT_TRUE(t2.status.ok()) << t2.status.error_message() << Logs();
  ASSERT_EQ(AliveNodes(), 1) << "the partitioned node was not declared dead\n" << Logs();
  EXPECT_EQ(t2.final.node_id(), home == 0 ? "n2" : "n1");
  EXPECT_EQ(t2.ids, Reference("alpha", Extend(Extend({}, "Hi", t1.ids), " more", {}), 6));
  StreamResult other = Generate("alpha", "Hello", 8);
  ASSERT_TRUE(other.status.ok()) << other.status.error_message();
  EXPECT_EQ(other.ids, Reference("alpha", Bytes("Hello", true), 8));
  Link(home, Mode::kPass);
  ASSERT_TRUE(WaitFor([&] { return AliveNodes() == 2; }, absl::Seconds(20))) << Logs();
  StreamResult t3 = Turn("s", " last", 6);
  ASSERT_TRUE(t3.status.ok()) << t3.status.error_message() << Logs();
  const std::vector<int> history = Extend(Extend({}, "Hi", t1.ids), " more", t2.ids);
  EXPECT_EQ(t3.ids, Reference("alpha", Extend(history, " last", {}), 6));
}

}  // namespace
}  // namespace ballast
