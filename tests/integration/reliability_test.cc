// Reliability on a real cluster (a scheduler and two `ballast node`
// processes, cluster_fixture.h): node identity (a duplicate live id is
// refused and its process exits non-zero; a restart replaces the old
// incarnation), a port in use fails at start, and failover (a request for
// a model with a live replica elsewhere succeeds within a second of a node
// crash or hang), the first load onto a node restarted in place, and
// SIGTERM draining a node.
#include <sys/wait.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <thread>

#include "absl/synchronization/notification.h"
#include "tests/integration/cluster_fixture.h"

namespace ballast {
namespace {

class ReliabilityTest : public ClusterTest {
 protected:
  ClusterSetup Cluster() override {
    ClusterSetup s = ClusterTest::Cluster();
    engine::SyntheticModelSpec g = s.models[0].second;
    g.seed = 23;
    s.models.push_back({"gamma", g});  // written, registered by the tests
    return s;
  }

  std::unique_ptr<ChildProcess> StartNode(const std::string& id, int port, const std::string& log) {
    const std::string bin = std::string(BALLAST_BINARY_DIR) + "/server/ballast";
    return std::make_unique<ChildProcess>(
        std::vector<std::string>{bin, "node", "--node-id", id, "--listen", Addr(port),
                                 "--scheduler", Addr(sched_port_), "--metrics-listen", ""},
        (dir_ / log).string());
  }

  std::string AddressOf(const std::string& id) {
    const auto state = State();
    for (const auto& n : state.nodes())
      if (n.node_id() == id && n.alive()) return n.address();
    return "";
  }

  // Registers gamma on both nodes (replicas: 2).
  void GammaOnBothNodes() {
    v1::RegisterModelRequest req;
    req.set_name("gamma");
    req.set_path(Model("gamma"));
    req.set_replicas(2);
    grpc::ClientContext ctx;
    v1::RegisterModelResponse resp;
    ASSERT_TRUE(admin_->RegisterModel(&ctx, req, &resp).ok());
    ASSERT_TRUE(WaitFor([&] { return ReadyReplicas("gamma") == 2; }, absl::Seconds(20))) << Logs();
  }

  // Sends gamma requests back to back for `span`; returns the time from
  // `t0` to the first success, and fails the test on any failed request.
  absl::Duration RequestsAllSucceed(absl::Time t0, absl::Duration span) {
    absl::Duration first = absl::InfiniteDuration();
    int n = 0;
    while (absl::Now() - t0 < span) {
      StreamResult r = Generate("gamma", "Hello", 4);
      EXPECT_TRUE(r.status.ok()) << "request " << n << " at +" << absl::Now() - t0 << ": "
                                 << r.status.error_message();
      EXPECT_EQ(r.ids.size(), 4u);
      if (r.status.ok() && first == absl::InfiniteDuration()) first = absl::Now() - t0;
      ++n;
    }
    return first;
  }
};

// A second process with a live node's id is refused on both sides: the
// scheduler keeps the first, the second exits non-zero naming the id and
// the live node's address.
TEST_F(ReliabilityTest, ADuplicateLiveNodeIdIsRefusedAndItsProcessExits) {
  const std::string n1 = AddressOf("n1");
  ASSERT_FALSE(n1.empty());
  auto dup = StartNode("n1", testing::FreePort(), "dup.log");
  ASSERT_TRUE(WaitFor([&] { return !dup->running(); }, absl::Seconds(15))) << dup->Log();
  const int status = dup->Stop(SIGTERM);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0) << status;
  EXPECT_NE(dup->Log().find("\"n1\" is already registered by a live node at " + n1),
            std::string::npos)
      << dup->Log();
  EXPECT_EQ(AddressOf("n1"), n1);
  EXPECT_EQ(AliveNodes(), 2);
  for (const char* model : {"alpha", "beta"}) {
    for (int i = 0; i < 5; ++i) {
      StreamResult r = Generate(model, "Hi", 2);
      EXPECT_TRUE(r.status.ok()) << model << ": " << r.status.error_message();
    }
  }
}

// A node that crashed and restarts at another address, before its old
// incarnation's heartbeats time out, replaces it at once.
TEST_F(ReliabilityTest, ARestartedNodeReplacesItsOldIncarnation) {
  nodes_[0]->Stop(SIGKILL);
  node_ports_[0] = testing::FreePort();
  nodes_[0] = StartNode("n1", node_ports_[0], "n1-restarted.log");
  ASSERT_TRUE(WaitFor([&] { return AddressOf("n1") == Addr(node_ports_[0]); }, absl::Seconds(10)))
      << Logs() << nodes_[0]->Log();
  EXPECT_TRUE(nodes_[0]->running());
  EXPECT_EQ(AliveNodes(), 2);
}

// A node that crashed and restarts at its old address takes its first load
// at once: the scheduler waits for the reconnection (node_connect_wait)
// instead of failing the load at once and backing off load_retry (10 s).
TEST_F(ReliabilityTest, TheFirstLoadOntoANodeRestartedInPlaceSucceeds) {
  // The scheduler's channel to n1 sees the crash (a failed call puts it in
  // reconnect backoff).
  nodes_[0]->Stop(SIGKILL);
  for (int i = 0; i < 3; ++i) {
    StreamResult r = Generate("alpha", "Hi", 1, "", absl::Milliseconds(300));
    EXPECT_FALSE(r.status.ok());
  }
  nodes_[0] = StartNode("n1", node_ports_[0], "n1-again.log");
  ASSERT_TRUE(WaitFor([&] { return AliveNodes() == 2; }, absl::Seconds(10)))
      << Logs() << nodes_[0]->Log();
  const absl::Time t0 = absl::Now();
  GammaOnBothNodes();
  const absl::Duration took = absl::Now() - t0;
  std::cout << "both replicas ready " << took << " after the restart\n";
  EXPECT_LT(took, absl::Seconds(8)) << Logs() << nodes_[0]->Log();
}

// Listening on a port in use fails at start with a message naming it (gRPC
// would otherwise share it through SO_REUSEPORT).
TEST_F(ReliabilityTest, APortInUseFailsAtStart) {
  auto second = StartNode("n3", node_ports_[0], "n3.log");
  ASSERT_TRUE(WaitFor([&] { return !second->running(); }, absl::Seconds(15))) << second->Log();
  const int status = second->Stop(SIGTERM);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0) << status;
  EXPECT_NE(second->Log().find(absl::StrCat("port ", node_ports_[0], " already in use")),
            std::string::npos)
      << second->Log();
}

// kill -9 of one of two nodes holding a model: every request afterwards
// succeeds (the one caught on the dead node is retried on the other), the
// first within a second.
TEST_F(ReliabilityTest, ACrashedReplicaFailsOverWithinASecond) {
  GammaOnBothNodes();
  // A session on the node about to die: its next turn moves and recomputes.
  StreamResult turn1 = Generate("gamma", "Hi there", 6, "sess-f");
  ASSERT_TRUE(turn1.status.ok()) << turn1.status.error_message();
  const int victim = turn1.final.node_id() == "n1" ? 0 : 1;
  const absl::Time t0 = absl::Now();
  nodes_[victim]->Stop(SIGKILL);
  StreamResult turn2 = Generate("gamma", " again", 6, "sess-f");
  const absl::Duration first = absl::Now() - t0;
  ASSERT_TRUE(turn2.status.ok()) << turn2.status.error_message() << Logs();
  EXPECT_NE(turn2.final.node_id(), turn1.final.node_id());
  EXPECT_EQ(turn2.final.usage().prompt_tokens(),
            turn1.final.usage().prompt_tokens() + 6 + static_cast<int>(strlen(" again")));
  RequestsAllSucceed(t0, absl::Seconds(3));
  std::cout << "first success " << first << " after kill -9\n";
  EXPECT_LT(first, absl::Seconds(1)) << Logs();
}

// A hung (SIGSTOPped) node: a request it does not accept within
// node_accept_timeout is retried on the other replica, and routing avoids
// the node; every request succeeds, the first within a second. Both nodes
// get requests first, so one is caught on the hung node.
TEST_F(ReliabilityTest, AHungReplicaFailsOverWithinASecond) {
  GammaOnBothNodes();
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(Generate("gamma", "Hello", 2).status.ok());
  nodes_[0]->Signal(SIGSTOP);
  int stopped = 0;  // every thread stopped: nothing accepts from here on
  ASSERT_EQ(waitpid(nodes_[0]->pid(), &stopped, WUNTRACED), nodes_[0]->pid());
  ASSERT_TRUE(WIFSTOPPED(stopped));
  const absl::Time t0 = absl::Now();
  std::vector<std::thread> clients;
  std::vector<absl::Duration> took(4);
  for (int i = 0; i < 4; ++i) {
    clients.emplace_back([&, i] {
      StreamResult r = Generate("gamma", "Hello", 4);
      EXPECT_TRUE(r.status.ok()) << i << ": " << r.status.error_message();
      took[i] = absl::Now() - t0;
    });
  }
  for (auto& c : clients) c.join();
  const absl::Duration first = RequestsAllSucceed(t0, absl::Seconds(3));
  nodes_[0]->Signal(SIGCONT);
  std::cout << "first success " << first << " after SIGSTOP; concurrent requests took";
  for (auto t : took) std::cout << " " << t;
  std::cout << "\n";
  for (auto t : took) EXPECT_LT(t, absl::Seconds(1)) << Logs();
}

// A cluster whose nodes have 16 MiB of device memory each, and a model,
// "huge", too big for either: its loads are refused for room.
class ColdModelTest : public ReliabilityTest {
 protected:
  ClusterSetup Cluster() override {
    ClusterSetup s = ReliabilityTest::Cluster();
    engine::SyntheticModelSpec h = s.models[0].second;
    h.hidden = 512;
    h.intermediate = 2048;
    h.heads = 8;
    h.kv_heads = 8;
    h.seed = 24;
    s.models.push_back({"huge", h});  // about 33 MB of weights: registered by the test
    s.node_yaml = "node:\n  devices:\n    - {name: cpu:0, memory_mib: 16}\n";
    return s;
  }
};

// Requests waiting for a model that cannot load park with the scheduler
// instead of holding its bounded routing pool (32 threads): a request for
// a ready model sent behind 48 of them is served at once, and the waiting
// ones end when their deadline passes.
TEST_F(ColdModelTest, RequestsWaitingForAColdModelDoNotBlockOthers) {
  v1::RegisterModelRequest reg;
  reg.set_name("huge");
  reg.set_path(Model("huge"));
  {
    grpc::ClientContext ctx;
    v1::RegisterModelResponse resp;
    ASSERT_TRUE(admin_->RegisterModel(&ctx, reg, &resp).ok());
  }
  constexpr int kCold = 48;
  std::vector<std::thread> cold;
  std::atomic<int> cold_ended{0};
  for (int i = 0; i < kCold; ++i) {
    cold.emplace_back([&] {
      StreamResult r = Generate("huge", "Hi", 2, "", absl::Seconds(6));
      EXPECT_FALSE(r.status.ok());
      ++cold_ended;
    });
  }
  absl::SleepFor(absl::Milliseconds(500));  // every cold request is routing
  const absl::Time t0 = absl::Now();
  StreamResult warm = Generate("alpha", "Hello", 4);
  const absl::Duration took = absl::Now() - t0;
  EXPECT_TRUE(warm.status.ok()) << warm.status.error_message();
  EXPECT_EQ(cold_ended.load(), 0);  // still waiting: the warm one did not wait for them
  std::cout << "warm request served in " << took << " behind " << kCold << " cold waits\n";
  EXPECT_LT(took, absl::Seconds(2)) << Logs();
  for (auto& t : cold) t.join();
  EXPECT_EQ(cold_ended.load(), kCold);
}

// The threads of process `pid` now.
int Threads(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("Threads:", 0) == 0) return std::atoi(line.c_str() + 8);
  }
  return -1;
}

// One stream read with the callback client (no thread of its own).
class StreamReader final : public grpc::ClientReadReactor<v1::GenerateResponse> {
 public:
  StreamReader(v1::Inference::Stub* stub, v1::GenerateRequest req) : req_(std::move(req)) {
    ctx_.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
    stub->async()->Generate(&ctx_, &req_, this);
    StartRead(&resp_);
    StartCall();
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;
    if (resp_.has_token()) ++tokens;
    if (resp_.has_final()) got_final = true;
    StartRead(&resp_);
  }
  void OnDone(const grpc::Status& s) override {
    status = s;
    done.Notify();
  }
  grpc::Status status;
  int tokens = 0;
  bool got_final = false;
  absl::Notification done;

 private:
  grpc::ClientContext ctx_;
  v1::GenerateRequest req_;
  v1::GenerateResponse resp_;
};

// Streams are pushed by callback reactors on the scheduler and the node: a
// few hundred concurrent streams add a bounded number of threads to either
// daemon (the synchronous handlers took a thread per stream on both, and
// the scheduler another one to watch each for cancellation), and every
// stream ends with all its tokens.
TEST_F(ReliabilityTest, ManyStreamsKeepTheDaemonsThreadsBounded) {
  constexpr int kStreams = 300, kTokens = 32;
  const int node = NodeOf("alpha") == "n1" ? 0 : 1;
  const pid_t pids[] = {scheduler_->pid(), nodes_[node]->pid()};
  int before[2], peak[2];
  for (int i = 0; i < 2; ++i) peak[i] = before[i] = Threads(pids[i]);
  std::vector<std::unique_ptr<StreamReader>> streams;
  for (int i = 0; i < kStreams; ++i) {
    v1::GenerateRequest req;
    req.set_model("alpha");
    req.set_prompt(absl::StrCat("stream ", i));
    req.mutable_sampling()->set_max_tokens(kTokens);
    req.mutable_sampling()->set_ignore_eos(true);
    streams.push_back(std::make_unique<StreamReader>(inference_.get(), std::move(req)));
  }
  while (!streams.back()->done.WaitForNotificationWithTimeout(absl::Milliseconds(20))) {
    for (int i = 0; i < 2; ++i) peak[i] = std::max(peak[i], Threads(pids[i]));
  }
  for (auto& s : streams) ASSERT_TRUE(s->done.WaitForNotificationWithTimeout(absl::Seconds(120)));
  int ok = 0;
  for (auto& s : streams) {
    EXPECT_TRUE(s->status.ok()) << s->status.error_message();
    ok += s->status.ok() && s->got_final && s->tokens == kTokens;
  }
  EXPECT_EQ(ok, kStreams);
  EXPECT_LT(peak[0] - before[0], 100) << "scheduler threads " << before[0] << " -> " << peak[0];
  EXPECT_LT(peak[1] - before[1], 100) << "node threads " << before[1] << " -> " << peak[1];
  std::cout << "threads with " << kStreams << " streams: scheduler " << before[0] << " -> "
            << peak[0] << ", node " << before[1] << " -> " << peak[1] << "\n";
}

// SIGTERM drains a node: a stream in flight on it finishes (a model large
// enough that its stream outlasts the signal), and the node exits cleanly.
class DrainTest : public ReliabilityTest {
 protected:
  ClusterSetup Cluster() override {
    ClusterSetup s = ReliabilityTest::Cluster();
    LargerAlpha(&s);
    return s;
  }
};

TEST_F(DrainTest, SigtermFinishesInFlightStreams) {
  const int victim = NodeOf("alpha") == "n1" ? 0 : 1;
  const absl::Time t0 = absl::Now();
  StreamResult r;
  // 200 tokens outlast the signal (200 ms in) and fit ChildProcess::Stop's
  // 10 s in a sanitizer build.
  std::thread request([&] { r = Generate("alpha", "Hello", 200); });
  absl::SleepFor(absl::Milliseconds(200));
  const int status = nodes_[victim]->Stop(SIGTERM);
  request.join();
  std::cout << "stream of 200 tokens took " << absl::Now() - t0 << "\n";
  EXPECT_TRUE(r.status.ok()) << r.status.error_message() << "\n" << Logs();
  EXPECT_EQ(r.ids.size(), 200u);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

}  // namespace
}  // namespace ballast
