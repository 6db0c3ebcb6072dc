// Sessions across a scheduler restart (kill -9). Without a state file the
// restarted scheduler has no history for a session its node still served,
// so the session's next turn must fail DATA_LOSS (never continue silently
// without its history), until the client ends the session; new sessions
// are unaffected (Scheduler::RouteRequest, SessionDirectory). With one
// (scheduler.state.path), every acknowledged turn survives and the session
// continues exactly as one that never saw the restart.
#include "tests/integration/cluster_fixture.h"

namespace ballast {
namespace {

class SessionRestartTest : public ClusterTest {
 protected:
  // The catalogue in the scheduler's config, so a restarted scheduler
  // keeps the models (CatalogueRestartTest covers Admin registrations).
  ClusterSetup Cluster() override {
    ClusterSetup setup = ClusterTest::Cluster();
    setup.scheduler_yaml = "scheduler:\n  models:\n";
    for (const auto& [name, spec] : setup.models) {
      setup.scheduler_yaml += absl::StrCat("    - {name: ", name, ", path: ", Model(name), "}\n");
    }
    return setup;
  }

  void RestartScheduler() {
    ClusterTest::RestartScheduler("scheduler2.log");
    ASSERT_TRUE(WaitFor([&] { return AliveNodes() == 2 && ReadyReplicas("alpha") >= 1; },
                        absl::Seconds(20)))
        << Logs();
  }

  grpc::Status EndSession(const std::string& id) {
    v1::EndSessionRequest req;
    req.set_session_id(id);
    v1::EndSessionResponse resp;
    grpc::ClientContext ctx;
    return inference_->EndSession(&ctx, req, &resp);
  }
};

TEST_F(SessionRestartTest, ATurnWhoseHistoryIsLostFailsDataLoss) {
  auto t1 = Generate("alpha", "hello there", 4, "s1");
  ASSERT_TRUE(t1.status.ok()) << t1.status.error_message();
  auto t2 = Generate("alpha", " more", 4, "s1");
  ASSERT_TRUE(t2.status.ok()) << t2.status.error_message();
  EXPECT_GT(t2.final.usage().prompt_tokens(), t1.final.usage().prompt_tokens());

  RestartScheduler();
  for (int i = 0; i < 2; ++i) {  // stays lost, not silently restarted
    auto t3 = Generate("alpha", " again", 4, "s1");
    EXPECT_EQ(t3.status.error_code(), grpc::StatusCode::DATA_LOSS)
        << t3.status.error_message() << " prompt_tokens " << t3.final.usage().prompt_tokens();
    EXPECT_NE(t3.status.error_message().find("history was lost"), std::string::npos)
        << t3.status.error_message();
  }
  // A new session is not mistaken for a lost one.
  auto fresh = Generate("alpha", "new", 4, "s2");
  EXPECT_TRUE(fresh.status.ok()) << fresh.status.error_message();
  auto fresh2 = Generate("alpha", " turn", 4, "s2");
  EXPECT_TRUE(fresh2.status.ok()) << fresh2.status.error_message();
  // Ending the lost session frees its id for a new one.
  ASSERT_TRUE(EndSession("s1").ok());
  auto again = Generate("alpha", "start over", 4, "s1");
  EXPECT_TRUE(again.status.ok()) << again.status.error_message();
}

class SessionStateRestartTest : public SessionRestartTest {
 protected:
  ClusterSetup Cluster() override {
    ClusterSetup setup = SessionRestartTest::Cluster();
    setup.scheduler_yaml += absl::StrCat("  state: {path: ", (dir_ / "state.db").string(), "}\n");
    return setup;
  }
};

TEST_F(SessionStateRestartTest, AcknowledgedTurnsSurviveAKill) {
  const std::vector<std::string> turns = {"hello there", " more", " again"};
  std::vector<StreamResult> before;
  for (int i = 0; i < 2; ++i) {
    before.push_back(Generate("alpha", turns[i], 4, "s1"));
    ASSERT_TRUE(before.back().status.ok()) << before.back().status.error_message();
  }
  RestartScheduler();
  auto t3 = Generate("alpha", turns[2], 4, "s1");
  ASSERT_TRUE(t3.status.ok()) << t3.status.error_message() << Logs();
  // The reference: the same turns in a session that never saw a restart.
  std::vector<StreamResult> ref;
  for (const auto& text : turns) {
    ref.push_back(Generate("alpha", text, 4, "ref"));
    ASSERT_TRUE(ref.back().status.ok()) << ref.back().status.error_message();
  }
  for (int i = 0; i < 2; ++i) EXPECT_EQ(before[i].ids, ref[i].ids) << "turn " << i;
  EXPECT_EQ(t3.ids, ref[2].ids);
  EXPECT_EQ(t3.final.usage().prompt_tokens(), ref[2].final.usage().prompt_tokens());
  EXPECT_GT(t3.final.usage().prompt_tokens(), before[1].final.usage().prompt_tokens());
  // Twice more, to show the session keeps going and nothing was marked lost.
  RestartScheduler();
  auto t4 = Generate("alpha", " and on", 4, "s1");
  auto r4 = Generate("alpha", " and on", 4, "ref");
  ASSERT_TRUE(t4.status.ok()) << t4.status.error_message();
  ASSERT_TRUE(r4.status.ok()) << r4.status.error_message();
  EXPECT_EQ(t4.ids, r4.ids);
  EXPECT_EQ(scheduler_->Log().find("no history"), std::string::npos);
  ASSERT_TRUE(EndSession("s1").ok());
  RestartScheduler();  // an ended session stays ended
  auto fresh = Generate("alpha", turns[0], 4, "s1");
  ASSERT_TRUE(fresh.status.ok()) << fresh.status.error_message();
  EXPECT_EQ(fresh.final.usage().prompt_tokens(), before[0].final.usage().prompt_tokens());
}

// Models registered through the Admin API, with a state file, survive
// a scheduler restart: listed, served, and their replicas adopted rather
// than evicted as unknown (they were, with no state file).
class CatalogueRestartTest : public ClusterTest {
 protected:
  ClusterSetup Cluster() override {
    ClusterSetup setup = ClusterTest::Cluster();
    setup.scheduler_yaml =
        absl::StrCat("scheduler:\n  state: {path: ", (dir_ / "state.db").string(), "}\n");
    return setup;
  }
};

TEST_F(CatalogueRestartTest, AdminRegisteredModelsSurviveARestart) {
  ASSERT_TRUE(std::filesystem::exists(dir_ / "state.db"));
  RestartScheduler("scheduler2.log");
  ASSERT_TRUE(WaitFor([&] { return AliveNodes() == 2; }, absl::Seconds(20))) << Logs();
  ASSERT_TRUE(WaitFor([&] { return ReadyReplicas("alpha") == 1 && ReadyReplicas("beta") == 1; },
                      absl::Seconds(20)))
      << Logs();
  for (const char* model : {"alpha", "beta"}) {
    StreamResult r = Generate(model, "Hello", 4);
    EXPECT_TRUE(r.status.ok()) << model << ": " << r.status.error_message();
  }
  absl::SleepFor(absl::Seconds(1));  // several control ticks
  EXPECT_EQ(ReadyReplicas("alpha"), 1);
  const std::string log = scheduler_->Log();
  EXPECT_EQ(log.find("evict"), std::string::npos) << log;
  EXPECT_EQ(log.find("loading model"), std::string::npos) << log;  // adopted, not reloaded
}

}  // namespace
}  // namespace ballast
