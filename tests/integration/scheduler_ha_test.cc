// A highly available scheduler pair (issue 19, item 4): two `ballast
// scheduler` processes share one etcd (scheduler.state.etcd, lease 2 s).
// The first leads and serves; the second stands by with its ports closed.
// The nodes dial both addresses ("ipv4:a,b", gRPC's pick_first). After
// kill -9 of the leader, the standby takes over within the lease plus a
// few seconds, the nodes re-register with it, the models the Admin API
// registered with the old leader are still registered, and requests are
// served. A standby stopped with SIGTERM exits at once, cleanly.
// ballast_scheduler_leader says which one leads (0 on the standby, 1 on the
// leader, then 1 on the standby that took over), and the standby's liveness
// probe, `ballast health --metrics-url`, passes on its metrics port while
// gRPC health cannot reach it.
#include <sys/wait.h>

#include "tests/integration/cluster_fixture.h"
#include "tests/integration/etcd_process.h"

namespace ballast {
namespace {

// The value of the unlabelled ballast_scheduler_leader series on
// 127.0.0.1:port/metrics; "" if the page or the series is missing.
std::string LeaderGauge(int port) {
  const std::string text = testing::HttpGet(port, "/metrics");
  const std::string series = "\nballast_scheduler_leader ";
  const size_t at = text.find(series);
  if (at == std::string::npos) return "";
  const size_t from = at + series.size();
  return text.substr(from, text.find('\n', from) - from);
}

struct CommandResult {
  int exit_code;
  std::string output;
};

// `ballast ARGS`, waited on (up to 30 s); its exit code and output.
CommandResult Ballast(const std::vector<std::string>& args, const std::string& log) {
  std::vector<std::string> argv = {std::string(BALLAST_BINARY_DIR) + "/server/ballast"};
  argv.insert(argv.end(), args.begin(), args.end());
  ChildProcess p(argv, log);
  for (int i = 0; i < 3000 && p.running(); ++i) usleep(10000);
  const int status = p.Stop(SIGKILL);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, p.Log()};
}

class SchedulerHaTest : public ClusterTest {
 protected:
  ClusterSetup Cluster() override {
    // Runs first in SetUp: etcd must be up before the first scheduler.
    if (!testing::EtcdProcess::Installed()) return ClusterTest::Cluster();
    etcd_dir_ = std::filesystem::path(::testing::TempDir()) /
                absl::StrCat("ha_etcd_", getpid(), "_",
                             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(etcd_dir_);
    etcd_ = std::make_unique<testing::EtcdProcess>(etcd_dir_);
    standby_port_ = testing::FreePort();
    standby_metrics_ = testing::FreePort();
    ClusterSetup s = ClusterTest::Cluster();
    s.scheduler_yaml = absl::StrCat("scheduler:\n  state:\n    etcd: {endpoints: \"",
                                    etcd_->endpoint(), "\", prefix: /ha, lease_ttl_s: 2}\n");
    return s;
  }
  std::string NodeSchedulerAddress(int i) override {
    return absl::StrCat("ipv4:", Addr(sched_port_), ",", Addr(standby_port_));
  }
  // The first scheduler's command with the standby's ports.
  std::unique_ptr<ChildProcess> StartStandby() {
    std::vector<std::string> args = sched_args_;
    for (size_t i = 0; i + 1 < args.size(); ++i) {
      if (args[i] == "--listen") args[i + 1] = Addr(standby_port_);
      if (args[i] == "--metrics-listen") args[i + 1] = Addr(standby_metrics_);
    }
    return std::make_unique<ChildProcess>(args, (dir_ / "standby.log").string());
  }
  void SetUp() override {
    if (!testing::EtcdProcess::Installed()) GTEST_SKIP() << "etcd missing (etcd-server)";
    ClusterTest::SetUp();
  }
  void TearDown() override {
    if (standby_) standby_->Stop(SIGTERM);
    if (!testing::EtcdProcess::Installed()) return;
    if (HasFailure() && standby_) std::cerr << "--- standby log\n" << standby_->Log();
    ClusterTest::TearDown();
    etcd_.reset();
    std::filesystem::remove_all(etcd_dir_);
  }

  std::filesystem::path etcd_dir_;
  std::unique_ptr<testing::EtcdProcess> etcd_;
  std::unique_ptr<ChildProcess> standby_;
  int standby_port_ = 0, standby_metrics_ = 0;
};

TEST_F(SchedulerHaTest, TheStandbyTakesOverWithWhatTheLeaderAcknowledged) {
  ASSERT_TRUE(etcd_->ok()) << etcd_->Log();
  standby_ = StartStandby();
  EXPECT_FALSE(testing::WaitForPort(standby_port_, 1500)) << "the standby listens beside a leader";
  EXPECT_NE(standby_->Log().find("standing for /ha/leader"), std::string::npos) << standby_->Log();
  EXPECT_EQ(LeaderGauge(standby_metrics_), "0") << standby_->Log();
  EXPECT_EQ(LeaderGauge(sched_metrics_), "1") << Logs();
  const StreamResult before = Generate("alpha", "hello", 8);
  ASSERT_TRUE(before.status.ok()) << before.status.error_message();

  const absl::Time killed = absl::Now();
  scheduler_->Stop(SIGKILL);
  ASSERT_TRUE(testing::WaitForPort(standby_port_, 15000)) << standby_->Log();
  const double took = absl::ToDoubleSeconds(absl::Now() - killed);
  std::cout << "the standby listened " << took << " s after kill -9 of the leader (lease 2 s)\n";
  EXPECT_LT(took, 2 + 4.0);
  EXPECT_EQ(LeaderGauge(standby_metrics_), "1") << standby_->Log();

  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 50);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 200);
  channel_ = grpc::CreateCustomChannel(Addr(standby_port_), ClientCredentials(), args);
  inference_ = v1::Inference::NewStub(channel_);
  admin_ = v1::Admin::NewStub(channel_);
  ASSERT_TRUE(WaitFor([&] { return AliveNodes() == 2; }, absl::Seconds(20)))
      << "the nodes did not re-register\n"
      << standby_->Log();
  // Both models were registered through the old leader's Admin API only.
  const v1::ClusterState state = State();
  int registered = 0;
  for (const auto& m : state.models()) registered += m.name() == "alpha" || m.name() == "beta";
  EXPECT_EQ(registered, 2) << state.DebugString();
  const StreamResult after = Generate("alpha", "hello", 8);
  ASSERT_TRUE(after.status.ok()) << after.status.error_message() << standby_->Log();
  EXPECT_EQ(after.ids, before.ids);  // the same greedy tokens from the same weights
}

TEST_F(SchedulerHaTest, AStandbyStopsAtOnceOnSigterm) {
  ASSERT_TRUE(etcd_->ok()) << etcd_->Log();
  standby_ = StartStandby();
  ASSERT_TRUE(WaitFor([&] { return standby_->Log().find("standing for") != std::string::npos; },
                      absl::Seconds(10)))
      << standby_->Log();
  const absl::Time t0 = absl::Now();
  const int status = standby_->Stop(SIGTERM);
  EXPECT_LT(absl::ToDoubleSeconds(absl::Now() - t0), 3.0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status << standby_->Log();
  standby_.reset();
}

// The standby's gRPC port is closed, so a liveness probe on gRPC health
// would restart it; its metrics endpoint answers, and the metrics probe
// names the URL when nothing does.
TEST_F(SchedulerHaTest, AStandbysLivenessProbeIsItsMetricsEndpoint) {
  ASSERT_TRUE(etcd_->ok()) << etcd_->Log();
  standby_ = StartStandby();
  ASSERT_TRUE(testing::WaitForPort(standby_metrics_, 10000)) << standby_->Log();
  const std::string url = absl::StrCat("http://", Addr(standby_metrics_), "/metrics");
  const CommandResult alive =
      Ballast({"health", "--metrics-url", url}, (dir_ / "alive.log").string());
  EXPECT_EQ(alive.exit_code, 0) << alive.output;
  EXPECT_NE(alive.output.find(url + " answered 200"), std::string::npos) << alive.output;
  EXPECT_EQ(LeaderGauge(standby_metrics_), "0") << standby_->Log();
  const CommandResult grpc =
      Ballast({"health", "--target", Addr(standby_port_)}, (dir_ / "grpc.log").string());
  EXPECT_EQ(grpc.exit_code, 3) << grpc.output;  // UNAVAILABLE: not serving until it leads

  const std::string closed = absl::StrCat("http://", Addr(testing::FreePort()), "/metrics");
  const CommandResult dead =
      Ballast({"health", "--metrics-url", closed}, (dir_ / "dead.log").string());
  EXPECT_EQ(dead.exit_code, 3) << dead.output;
  EXPECT_NE(dead.output.find("error: GET " + closed + ": cannot connect to"), std::string::npos)
      << dead.output;
}

}  // namespace
}  // namespace ballast
