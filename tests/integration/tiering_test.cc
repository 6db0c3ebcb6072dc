// Session KV tiering across processes (a scheduler and two `ballast node`
// processes with DRAM and SSD tiers, cluster_fixture.h): a session whose
// node was killed continues from that node's SSD after its restart; a
// session whose model moved continues from its old node's tiers (peer
// transfer); Advise moves the KV onto the serving device before the turn.
// Every continuation gives exactly the tokens a cold recompute gives.
#include <filesystem>
#include <set>

#include "absl/strings/match.h"
#include "tests/integration/cluster_fixture.h"

namespace ballast {
namespace {

class TieringTest : public ClusterTest {
 protected:
  ClusterSetup Cluster() override {
    ClusterSetup s = ClusterTest::Cluster();
    engine::SyntheticModelSpec g = s.models[0].second;
    g.seed = 23;
    s.models.push_back({"gamma", g});  // written; registered by a test
    s.node_yaml = "node:\n  kv_tiers: {dram_mib: 64, ssd_gib: 1, chunk_tokens: 16}\n";
    return s;
  }
  std::vector<std::string> ExtraNodeArgs(int i) override { return {"--kv-ssd-dir", SsdDir(i)}; }
  std::string SsdDir(int i) const { return (dir_ / absl::StrCat("ssd-n", i + 1)).string(); }

  // Turn 1 of `session`, then the token ids turn 2's reference starts with.
  std::vector<int> FirstTurn(const std::string& session, const std::string& prompt,
                             const std::string& model = "alpha") {
    StreamResult r = Generate(model, prompt, 20, session);
    EXPECT_TRUE(r.status.ok()) << r.status.error_message() << Logs();
    std::vector<int> ids = Bytes(prompt, true);
    ids.insert(ids.end(), r.ids.begin(), r.ids.end());
    return ids;
  }
  std::vector<int> SecondTurnReference(std::vector<int> history, const std::string& prompt,
                                       const std::string& model = "alpha") {
    const std::vector<int> turn = Bytes(prompt, false);
    history.insert(history.end(), turn.begin(), turn.end());
    return Reference(model, history, 12);
  }
  void Migrate(const std::string& from, const std::string& to) {
    grpc::ClientContext ctx;
    v1::MigrateModelRequest req;
    req.set_name("alpha");
    req.set_from_node(from);
    req.set_to_node(to);
    v1::MigrateModelResponse resp;
    ASSERT_TRUE(admin_->MigrateModel(&ctx, req, &resp).ok());
    ASSERT_TRUE(WaitFor([&] { return NodeOf("alpha") == to && ReadyReplicas("alpha") == 1; },
                        absl::Seconds(20)))
        << Logs();
  }
  int Index(const std::string& node_id) const { return node_id == "n1" ? 0 : 1; }
  // Waits (up to 30 s) until `dir` holds chunk files (".kv"), none is being
  // written (".tmp") and the set has not changed for 300 ms: the node's SSD
  // writer, which runs in the background, is done with what it was given.
  bool WaitForSettledSsd(const std::string& dir) {
    std::set<std::string> last;
    absl::Time since = absl::Now();
    return WaitFor(
        [&] {
          std::set<std::string> now;
          bool writing = false;
          std::error_code ec;
          for (const auto& f : std::filesystem::directory_iterator(dir, ec)) {
            const std::string name = f.path().filename().string();
            writing |= absl::EndsWith(name, ".tmp");
            if (absl::EndsWith(name, ".kv")) now.insert(name);
          }
          if (now.empty() || writing || now != last) {
            last = std::move(now);
            since = absl::Now();
            return false;
          }
          return absl::Now() - since >= absl::Milliseconds(300);
        },
        absl::Seconds(30));
  }
};

TEST_F(TieringTest, ASessionContinuesFromItsRestartedNodesSsd) {
  const std::string home = NodeOf("alpha");
  const int i = Index(home);
  // Only `home` can host alpha after the crash.
  nodes_[1 - i]->Stop(SIGTERM);
  const std::vector<int> history = FirstTurn("s", "Tell me about tiers.");
  ASSERT_TRUE(WaitForSettledSsd(SsdDir(i))) << "no KV reached " << SsdDir(i) << Logs();
  nodes_[i]->Stop(SIGKILL);
  const std::string bin = std::string(BALLAST_BINARY_DIR) + "/server/ballast";
  const std::string address = Addr(testing::FreePort());
  nodes_[i] = std::make_unique<testing::ChildProcess>(
      std::vector<std::string>{bin, "node", "--node-id", home, "--listen", address, "--scheduler",
                               Addr(sched_port_), "--metrics-listen", "", "--config",
                               (dir_ / "node.yaml").string(), "--kv-ssd-dir", SsdDir(i)},
      (dir_ / "restarted.log").string());
  // The new incarnation registered and loaded alpha (the old one's replica
  // is gone with it).
  ASSERT_TRUE(WaitFor(
      [&] {
        const auto state = State();
        for (const auto& n : state.nodes()) {
          if (n.node_id() == home && n.address() == address) return ReadyReplicas("alpha") == 1;
        }
        return false;
      },
      absl::Seconds(30)))
      << Logs() << nodes_[i]->Log();
  StreamResult r = Generate("alpha", " And SSDs?", 12, "s");
  ASSERT_TRUE(r.status.ok()) << r.status.error_message() << Logs() << nodes_[i]->Log();
  EXPECT_EQ(r.final.kv_source(), v1::KV_SOURCE_SSD) << nodes_[i]->Log();
  EXPECT_EQ(r.final.usage().cached_prompt_tokens(), static_cast<int>(history.size()) - 1);
  EXPECT_EQ(r.ids, SecondTurnReference(history, " And SSDs?"));
}

TEST_F(TieringTest, ASessionWhoseModelMovedFetchesItsKvFromThePeer) {
  const std::string from = NodeOf("alpha");
  const std::string to = from == "n1" ? "n2" : "n1";
  const std::vector<int> history = FirstTurn("s", "Where does my KV live?");
  Migrate(from, to);
  StreamResult r = Generate("alpha", " Over there.", 12, "s");
  ASSERT_TRUE(r.status.ok()) << r.status.error_message() << Logs();
  EXPECT_EQ(r.final.node_id(), to);
  EXPECT_EQ(r.final.kv_source(), v1::KV_SOURCE_PEER) << Logs();
  EXPECT_EQ(r.ids, SecondTurnReference(history, " Over there."));
}

TEST_F(TieringTest, AdviseMovesTheKvOntoTheServingDevice) {
  const std::string from = NodeOf("alpha");
  const std::string to = from == "n1" ? "n2" : "n1";
  const std::vector<int> history = FirstTurn("s", "Prefetch me, please.");
  Migrate(from, to);
  grpc::ClientContext ctx;
  v1::AdviseRequest adv;
  adv.set_session_id("s");
  adv.set_expected_arrival_ms(1000);
  v1::AdviseResponse ar;
  grpc::Status st = inference_->Advise(&ctx, adv, &ar);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(ar.node_id(), to);
  EXPECT_EQ(ar.source(), v1::KV_SOURCE_PEER);
  EXPECT_EQ(ar.prefetched_tokens(), static_cast<int>(history.size()) - 1);
  StreamResult r = Generate("alpha", " Thanks.", 12, "s");
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.final.kv_source(), v1::KV_SOURCE_DEVICE);
  EXPECT_EQ(r.ids, SecondTurnReference(history, " Thanks."));
  // Invalidate of a used prefetch is harmless; of an unknown session,
  // NOT_FOUND; another tenant's session, PERMISSION_DENIED.
  for (const auto& [session, tenant, code] :
       {std::tuple{"s", "", grpc::StatusCode::OK},
        {"nope", "", grpc::StatusCode::NOT_FOUND},
        {"s", "other", grpc::StatusCode::PERMISSION_DENIED}}) {
    grpc::ClientContext c;
    v1::InvalidateRequest inv;
    inv.set_session_id(session);
    inv.set_tenant(tenant);
    v1::InvalidateResponse resp;
    EXPECT_EQ(inference_->Invalidate(&c, inv, &resp).error_code(), code) << session << tenant;
  }
}

TEST_F(TieringTest, ASessionWhoseNodeDiedIsRecomputedExactly) {
  // gamma on both nodes: one replica survives the kill.
  grpc::ClientContext ctx;
  v1::RegisterModelRequest reg;
  reg.set_name("gamma");
  reg.set_path(Model("gamma"));
  reg.set_replicas(2);
  v1::RegisterModelResponse resp;
  ASSERT_TRUE(admin_->RegisterModel(&ctx, reg, &resp).ok());
  ASSERT_TRUE(WaitFor([&] { return ReadyReplicas("gamma") == 2; }, absl::Seconds(20))) << Logs();
  StreamResult t1 = Generate("gamma", "Hello node", 20, "s");
  ASSERT_TRUE(t1.status.ok()) << t1.status.error_message();
  std::vector<int> history = Bytes("Hello node", true);
  history.insert(history.end(), t1.ids.begin(), t1.ids.end());
  nodes_[Index(t1.final.node_id())]->Stop(SIGKILL);
  StreamResult r = Generate("gamma", " still there?", 12, "s");
  ASSERT_TRUE(r.status.ok()) << r.status.error_message() << Logs();
  EXPECT_NE(r.final.node_id(), t1.final.node_id());
  EXPECT_EQ(r.final.kv_source(), v1::KV_SOURCE_RECOMPUTED);
  EXPECT_EQ(r.ids, SecondTurnReference(history, " still there?", "gamma"));
}

}  // namespace
}  // namespace ballast
