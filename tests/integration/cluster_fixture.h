// The multi-process cluster fixture: `ballast scheduler` and two
// `ballast node` processes on loopback ports, driven over the public gRPC
// API like a frontend would, plus helpers (streams, cluster state, an
// in-process reference engine). Tests derive and may override Cluster() to
// change the models and the daemons' YAML configs.
#pragma once

#include <grpcpp/grpcpp.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "ballast/v1/admin.grpc.pb.h"
#include "ballast/v1/inference.grpc.pb.h"
#include "engine/model_engine.h"
#include "engine/synthetic_model.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "tests/integration/process.h"

namespace ballast {

using testing::ChildProcess;

// What a test's cluster looks like.
struct ClusterSetup {
  // Models written and registered at start (name -> spec), in order.
  std::vector<std::pair<std::string, engine::SyntheticModelSpec>> models;
  // Extra YAML for the daemons (written to files, passed as --config);
  // empty: defaults. Flags (ports, ids) override them.
  std::string scheduler_yaml, node_yaml;
};

struct StreamResult {
  grpc::Status status;
  std::vector<int> ids;
  std::string text;
  v1::Final final;
  int token_messages = 0;  // messages that carried tokens (token_batches: fewer)
};

class ClusterTest : public ::testing::Test {
 protected:
  // The default: two small models of different architectures.
  virtual ClusterSetup Cluster() {
    engine::SyntheticModelSpec a;
    a.architecture = "llama";
    a.layers = 2;
    a.hidden = 64;
    a.heads = 4;
    a.kv_heads = 2;
    a.intermediate = 128;
    a.max_position = 256;
    a.seed = 21;
    engine::SyntheticModelSpec b = a;
    b.architecture = "qwen2";
    b.seed = 22;
    return ClusterSetup{{{"alpha", a}, {"beta", b}}, "", ""};
  }

  // Makes the first model ("alpha") large enough that a 200-token stream
  // takes a few hundred ms on the CPU (4 layers, hidden 256), for tests
  // that act while a stream is in flight.
  static void LargerAlpha(ClusterSetup* s) {
    engine::SyntheticModelSpec& a = s->models[0].second;
    a.layers = 4;
    a.hidden = 256;
    a.heads = 8;
    a.kv_heads = 4;
    a.intermediate = 1024;
    a.max_position = 1024;
  }

  // Flags for node i (0 or 1) besides the ids, ports and config.
  virtual std::vector<std::string> ExtraNodeArgs(int i) { return {}; }
  // The scheduler address node i dials (a proxy in the link-fault tests).
  virtual std::string NodeSchedulerAddress(int i) { return Addr(sched_port_); }

  // Every call the fixture's helpers make (API-key tests add their key).
  virtual void Decorate(grpc::ClientContext* ctx) {}

  // The test's own connection to the scheduler (TLS tests override it).
  virtual std::shared_ptr<grpc::ChannelCredentials> ClientCredentials() {
    return grpc::InsecureChannelCredentials();
  }

  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) /
           absl::StrCat("ballast_cluster_", getpid(), "_",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    setup_ = Cluster();
    for (const auto& [name, spec] : setup_.models) {
      ASSERT_TRUE(engine::WriteSyntheticModel(spec, Model(name)).ok());
    }
    auto config = [&](const std::string& name, const std::string& yaml) {
      std::vector<std::string> args;
      if (yaml.empty()) return args;
      const std::string path = (dir_ / name).string();
      std::ofstream(path) << yaml;
      return std::vector<std::string>{"--config", path};
    };
    const auto sched_config = config("scheduler.yaml", setup_.scheduler_yaml);
    const auto node_config = config("node.yaml", setup_.node_yaml);

    // Ports are picked free, but a test running beside this one can bind
    // one before the child does (a TSan CI run: "cannot listen on
    // 127.0.0.1:27807 (port 27807 already in use)", and the nodes found
    // another test's server there). A child that exits for that is
    // launched again, with every process on new ports.
    for (int attempt = 1;; ++attempt) {
      Launch(sched_config, node_config);
      ASSERT_TRUE(testing::WaitForPort(sched_port_, 20000)) << Logs();
      grpc::ChannelArguments args;  // retry fast while the scheduler starts
      args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 50);
      args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 200);
      channel_ = grpc::CreateCustomChannel(Addr(sched_port_), ClientCredentials(), args);
      inference_ = v1::Inference::NewStub(channel_);
      admin_ = v1::Admin::NewStub(channel_);
      const bool registered =
          WaitFor([&] { return !AllRunning() || AliveNodes() == 2; }, absl::Seconds(20)) &&
          AllRunning();
      if (registered) break;
      const bool port_taken = Logs().find("cannot listen on") != std::string::npos;
      ASSERT_TRUE(port_taken && attempt < 3) << "nodes did not register\n" << Logs();
      std::cerr << "a port was taken before its process bound it; launching again\n" << Logs();
      StopAll();
    }
    // The first two models are registered and loaded (one per node).
    for (size_t i = 0; i < setup_.models.size() && i < 2; ++i) Register(setup_.models[i].first);
    ASSERT_TRUE(WaitFor(
        [&] {
          return ReadyReplicas(setup_.models[0].first) == 1 &&
                 ReadyReplicas(setup_.models[1].first) == 1;
        },
        absl::Seconds(20)))
        << Logs();
  }

  // Starts the scheduler and both nodes on fresh ports (SetUp).
  void Launch(const std::vector<std::string>& sched_config,
              const std::vector<std::string>& node_config) {
    sched_port_ = testing::FreePort();
    sched_metrics_ = testing::FreePort();
    const std::string bin = std::string(BALLAST_BINARY_DIR) + "/server/ballast";
    std::vector<std::string> sched_args{bin,
                                        "scheduler",
                                        "--listen",
                                        Addr(sched_port_),
                                        "--metrics-listen",
                                        Addr(sched_metrics_),
                                        "--heartbeat-timeout-ms",
                                        "1500"};
    sched_args.insert(sched_args.end(), sched_config.begin(), sched_config.end());
    sched_args_ = sched_args;
    scheduler_ = std::make_unique<ChildProcess>(sched_args, (dir_ / "scheduler.log").string());
    for (int i = 0; i < 2; ++i) {
      const std::string id = absl::StrCat("n", i + 1);
      node_ports_[i] = testing::FreePort();
      std::vector<std::string> node_args{bin,
                                         "node",
                                         "--node-id",
                                         id,
                                         "--listen",
                                         Addr(node_ports_[i]),
                                         "--scheduler",
                                         NodeSchedulerAddress(i),
                                         "--metrics-listen",
                                         ""};
      node_args.insert(node_args.end(), node_config.begin(), node_config.end());
      const auto extra = ExtraNodeArgs(i);
      node_args.insert(node_args.end(), extra.begin(), extra.end());
      nodes_[i] = std::make_unique<ChildProcess>(node_args, (dir_ / (id + ".log")).string());
    }
  }
  bool AllRunning() {
    return scheduler_->running() && nodes_[0]->running() && nodes_[1]->running();
  }
  void StopAll() {
    inference_.reset();
    admin_.reset();
    channel_.reset();
    for (auto& n : nodes_) n->Stop(SIGTERM);
    scheduler_->Stop(SIGTERM);
  }

  // kill -9 of the scheduler, then the same command again (same ports and
  // config), logging to `log`; returns once it listens.
  void RestartScheduler(const std::string& log) {
    scheduler_->Stop(SIGKILL);
    scheduler_ = std::make_unique<ChildProcess>(sched_args_, (dir_ / log).string());
    ASSERT_TRUE(testing::WaitForPort(sched_port_, 20000)) << Logs();
  }

  void Register(const std::string& model) {
    v1::RegisterModelRequest req;
    req.set_name(model);
    req.set_path(Model(model));
    grpc::ClientContext ctx;
    Decorate(&ctx);
    v1::RegisterModelResponse resp;
    grpc::Status st = admin_->RegisterModel(&ctx, req, &resp);
    ASSERT_TRUE(st.ok()) << st.error_message();
  }

  void TearDown() override {
    StopAll();
    if (HasFailure() || getenv("BALLAST_TEST_LOGS")) std::cerr << Logs();
    std::filesystem::remove_all(dir_);
  }

  static std::string Addr(int port) { return absl::StrCat("127.0.0.1:", port); }
  std::string Model(const std::string& name) const { return (dir_ / name).string(); }
  std::string Logs() const {
    std::string out = "--- scheduler log\n" + scheduler_->Log();
    for (int i = 0; i < 2; ++i) out += absl::StrCat("--- node ", i + 1, " log\n", nodes_[i]->Log());
    return out;
  }

  template <typename F>
  static bool WaitFor(F cond, absl::Duration limit) {
    const absl::Time end = absl::Now() + limit;
    while (absl::Now() < end) {
      if (cond()) return true;
      absl::SleepFor(absl::Milliseconds(50));
    }
    return cond();
  }

  v1::ClusterState State() {
    grpc::ClientContext ctx;
    Decorate(&ctx);
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    v1::ClusterState s;
    admin_->GetClusterState(&ctx, v1::GetClusterStateRequest(), &s);
    return s;
  }
  int AliveNodes() {
    int n = 0;
    const auto state = State();
    for (const auto& node : state.nodes()) n += node.alive();
    return n;
  }
  int ReadyReplicas(const std::string& model) {
    int n = 0;
    const auto state = State();
    for (const auto& m : state.models())
      if (m.name() == model)
        for (const auto& r : m.replicas()) n += r.state() == v1::MODEL_STATE_READY;
    return n;
  }
  std::string NodeOf(const std::string& model) {
    const auto state = State();
    for (const auto& m : state.models())
      if (m.name() == model && m.replicas_size() > 0) return m.replicas(0).node_id();
    return "";
  }

  StreamResult Generate(const std::string& model, const std::string& prompt, int max_tokens,
                        const std::string& session = "",
                        absl::Duration deadline = absl::Seconds(30)) {
    v1::GenerateRequest req;
    req.set_model(model);
    req.set_prompt(prompt);
    req.set_session_id(session);
    req.mutable_sampling()->set_max_tokens(max_tokens);
    req.mutable_sampling()->set_ignore_eos(true);
    return Run(req, deadline);
  }

  // One Generate call, read to its end; `on_token` runs after each token
  // is read (the link-fault tests cut a link mid-stream there).
  // `stub`: another connection's (default: the fixture's).
  StreamResult Run(const v1::GenerateRequest& req, absl::Duration deadline = absl::Seconds(30),
                   const std::function<void(int tokens)>& on_token = {},
                   v1::Inference::Stub* stub = nullptr) {
    grpc::ClientContext ctx;
    Decorate(&ctx);
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
    auto reader = (stub ? stub : inference_.get())->Generate(&ctx, req);
    StreamResult r;
    v1::GenerateResponse resp;
    auto token = [&](const v1::Token& t) {
      r.ids.push_back(t.id());
      r.text += t.text();
      if (on_token) on_token(static_cast<int>(r.ids.size()));
    };
    while (reader->Read(&resp)) {
      if (resp.has_token()) {
        token(resp.token());
      } else if (resp.has_tokens()) {
        for (const v1::Token& t : resp.tokens().tokens()) token(t);
      } else {
        r.final = resp.final();
        continue;
      }
      ++r.token_messages;
    }
    r.status = reader->Finish();
    return r;
  }

  // Greedy tokens from an in-process engine on the same checkpoint, its
  // weights quantized as `quantization` says.
  std::vector<int> Reference(const std::string& model, std::vector<int> prompt, int n,
                             const std::string& quantization = "none") {
    engine::ModelEngineOptions o;
    o.name = model;
    o.path = Model(model);
    o.quantization = quantization;
    auto e = engine::ModelEngine::Create(o);
    EXPECT_TRUE(e.ok()) << e.status();
    struct Sink : engine::GenerationSink {
      void OnToken(int, const std::string&, const engine::TokenLogprobs*) override {}
      void OnDone(absl::StatusOr<engine::GenerationResult> r) override { result = std::move(r); }
      absl::StatusOr<engine::GenerationResult> result = absl::UnknownError("not done");
    } sink;
    engine::GenerationRequest r;
    r.id = "ref";
    r.prompt = std::move(prompt);
    r.params.max_tokens = n;
    r.params.ignore_eos = true;
    EXPECT_TRUE((*e)->Submit(r, &sink).ok());
    while ((*e)->HasWork()) (*e)->Step();
    EXPECT_TRUE(sink.result.ok());
    return sink.result.ok() ? sink.result->output_tokens : std::vector<int>{};
  }

  static std::vector<int> Bytes(const std::string& s, bool bos) {
    std::vector<int> t;
    if (bos) t.push_back(engine::ByteTokenizer::kBos);
    for (unsigned char c : s) t.push_back(c);
    return t;
  }

  ClusterSetup setup_;
  std::filesystem::path dir_;
  int sched_port_ = 0, sched_metrics_ = 0;
  std::vector<std::string> sched_args_;  // the scheduler's command (RestartScheduler)
  int node_ports_[2] = {0, 0};
  std::unique_ptr<ChildProcess> scheduler_;
  std::unique_ptr<ChildProcess> nodes_[2];
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Inference::Stub> inference_;
  std::unique_ptr<v1::Admin::Stub> admin_;
};

}  // namespace ballast
