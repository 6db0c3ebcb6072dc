// Multi-process integration: `ballast scheduler` and two `ballast node`
// processes on loopback ports, driven over the public gRPC API like a
// frontend would. Greedy outputs are compared with an in-process
// ModelEngine on the same checkpoints.
#include <map>

#include "tests/integration/cluster_fixture.h"

namespace ballast {
namespace {

TEST_F(ClusterTest, ConcurrentStreamsOnTwoModelsMatchTheInProcessEngine) {
  // The two models were registered together and land on different nodes.
  EXPECT_NE(NodeOf("alpha"), NodeOf("beta"));
  const std::vector<std::string> prompts = {"Hello", "The cat sat on", "x", "Ballast!"};
  std::vector<StreamResult> results(8);
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back(
        [&, i] { results[i] = Generate(i % 2 ? "beta" : "alpha", prompts[i / 2], 24); });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < 8; ++i) {
    const std::string model = i % 2 ? "beta" : "alpha";
    ASSERT_TRUE(results[i].status.ok()) << results[i].status.error_message();
    EXPECT_EQ(results[i].ids, Reference(model, Bytes(prompts[i / 2], true), 24))
        << model << " " << i;
    EXPECT_EQ(results[i].final.usage().completion_tokens(), 24);
    EXPECT_EQ(results[i].final.text(), results[i].text);
    EXPECT_EQ(results[i].final.node_id(), NodeOf(model));
    EXPECT_GT(results[i].final.timings().ttft_ms(), 0.0);
    // The node's engine's own TTFT comes through the scheduler, inside it.
    EXPECT_GT(results[i].final.timings().node_ttft_ms(), 0.0);
    EXPECT_LT(results[i].final.timings().node_ttft_ms(), results[i].final.timings().ttft_ms());
    // The node's parts of the path: its admission queue and its delivery
    // of the first token, each shorter than the whole TTFT.
    EXPECT_GT(results[i].final.timings().node_admission_ms(), 0.0);
    EXPECT_LT(results[i].final.timings().node_admission_ms(), results[i].final.timings().ttft_ms());
    EXPECT_GT(results[i].final.timings().first_token_delivery_ms(), 0.0);
    // Both lie between the node's TTFT and the scheduler's.
    EXPECT_LE(results[i].final.timings().node_admission_ms() +
                  results[i].final.timings().first_token_delivery_ms(),
              results[i].final.timings().ttft_ms() - results[i].final.timings().node_ttft_ms());
  }
  // The scheduler's sliding-window statistics saw the four requests of
  // each model: 4 x 24 decode tokens over a 60 s window.
  grpc::ClientContext ctx;
  v1::ListModelsRequest lreq;
  v1::ListModelsResponse list;
  ASSERT_TRUE(inference_->ListModels(&ctx, lreq, &list).ok());
  for (const auto& m : list.models()) {
    EXPECT_DOUBLE_EQ(m.load().window_s(), 60.0) << m.name();
    EXPECT_NEAR(m.load().requests_per_s(), 4 / 60.0, 1e-9) << m.name();
    EXPECT_NEAR(m.load().decode_tokens_per_s(), 4 * 24 / 60.0, 1e-9) << m.name();
    EXPECT_GT(m.load().prompt_tokens_per_s(), 0) << m.name();
  }
}

TEST_F(ClusterTest, MultiTurnSessionsKeepHistoryAndReuseKv) {
  std::vector<int> history;
  const std::vector<std::string> turns = {"Hi there", " and again", " one more"};
  for (size_t k = 0; k < turns.size(); ++k) {
    StreamResult r = Generate("alpha", turns[k], 12, "sess-1");
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    std::vector<int> prompt = history;
    auto turn = Bytes(turns[k], history.empty());
    prompt.insert(prompt.end(), turn.begin(), turn.end());
    EXPECT_EQ(r.ids, Reference("alpha", prompt, 12)) << "turn " << k;
    EXPECT_EQ(r.final.usage().prompt_tokens(), static_cast<int>(prompt.size()));
    if (k == 0) {
      EXPECT_EQ(r.final.kv_source(), v1::KV_SOURCE_NONE);
    } else {
      EXPECT_EQ(r.final.kv_source(), v1::KV_SOURCE_DEVICE);
      EXPECT_EQ(r.final.usage().cached_prompt_tokens(), static_cast<int>(history.size()) - 1);
    }
    history = prompt;
    history.insert(history.end(), r.ids.begin(), r.ids.end());
  }
  // A second, interleaved session on the other model is independent.
  StreamResult other = Generate("beta", "Hi there", 12, "sess-2");
  ASSERT_TRUE(other.status.ok());
  EXPECT_EQ(other.ids, Reference("beta", Bytes("Hi there", true), 12));
  // Ending a session forgets it: the same id starts afresh.
  grpc::ClientContext ctx;
  v1::EndSessionRequest end;
  end.set_session_id("sess-1");
  v1::EndSessionResponse resp;
  ASSERT_TRUE(inference_->EndSession(&ctx, end, &resp).ok());
  EXPECT_TRUE(resp.existed());
  StreamResult fresh = Generate("alpha", turns[0], 12, "sess-1");
  EXPECT_EQ(fresh.final.usage().prompt_tokens(), static_cast<int>(turns[0].size()) + 1);
}

TEST_F(ClusterTest, BadInputGetsClearStatusesAndTheServerKeepsServing) {
  auto code = [&](const std::string& model, const std::string& prompt, int n) {
    return Generate(model, prompt, n).status.error_code();
  };
  EXPECT_EQ(code("nope", "hi", 4), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(code("alpha", "", 4), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(code("alpha", "hi", -3), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(code("alpha", "hi", 300), grpc::StatusCode::INVALID_ARGUMENT);  // window 256
  EXPECT_EQ(code("alpha", std::string(300, 'a'), 4), grpc::StatusCode::INVALID_ARGUMENT);
  StreamResult r = Generate("alpha", std::string(250, 'a'), 10);  // 251 + 10 > 256
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(r.status.error_message().find("context window"), std::string::npos);
  grpc::ClientContext ctx;
  v1::AdviseRequest adv;
  adv.set_session_id("s");
  adv.set_model("alpha");
  v1::AdviseResponse ar;
  // Advise for a session the scheduler does not know.
  EXPECT_EQ(inference_->Advise(&ctx, adv, &ar).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_TRUE(Generate("alpha", "still fine", 4).status.ok());
}

// A model's KV floor/limit moves at runtime: RegisterModel again with only
// those changed reaches the node holding it. A limit below what a request
// needs makes that request fail up front; lifting it serves it again.
TEST_F(ClusterTest, KvLimitsMoveAtRuntimeThroughTheAdminApi) {
  auto set = [&](int64_t floor, int64_t limit) {
    v1::RegisterModelRequest req;
    req.set_name("alpha");
    req.set_path(Model("alpha"));
    req.set_kv_floor_bytes(floor);
    req.set_kv_limit_bytes(limit);
    grpc::ClientContext ctx;
    v1::RegisterModelResponse resp;
    return admin_->RegisterModel(&ctx, req, &resp);
  };
  const std::string long_prompt(200, 'x');  // 26 blocks of 4 KiB
  ASSERT_TRUE(Generate("alpha", long_prompt, 4).status.ok());
  ASSERT_TRUE(set(0, 64 << 10).ok()) << Logs();
  StreamResult capped = Generate("alpha", long_prompt, 4);
  EXPECT_EQ(capped.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_TRUE(Generate("alpha", "hi", 4).status.ok());  // small requests still fit
  EXPECT_EQ(set(128 << 10, 64 << 10).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  ASSERT_TRUE(set(0, 0).ok());
  EXPECT_TRUE(Generate("alpha", long_prompt, 4).status.ok());
}

// quantization through the Admin API reaches the node's engine: a model
// registered with fp8 serves what an in-process fp8 engine computes, and
// ListModels shows it; an unknown value is refused, naming it, and nothing
// is registered.
TEST_F(ClusterTest, QuantizationThroughTheAdminApiReachesTheEngine) {
  auto reg = [&](const std::string& name, const std::string& quantization) {
    v1::RegisterModelRequest req;
    req.set_name(name);
    req.set_path(Model("alpha"));
    req.set_quantization(quantization);
    grpc::ClientContext ctx;
    v1::RegisterModelResponse resp;
    return admin_->RegisterModel(&ctx, req, &resp);
  };
  const grpc::Status bad = reg("alpha-int4", "int4");
  EXPECT_EQ(bad.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(bad.error_message().find("quantization \"int4\" is unknown"), std::string::npos)
      << bad.error_message();
  ASSERT_TRUE(reg("alpha-fp8", "fp8").ok());
  ASSERT_TRUE(WaitFor([&] { return ReadyReplicas("alpha-fp8") == 1; }, absl::Seconds(20)))
      << Logs();
  const std::vector<int> prompt = Bytes("The cat sat on", true);
  const std::vector<int> fp8 = Reference("alpha", prompt, 24, "fp8");
  ASSERT_NE(fp8, Reference("alpha", prompt, 24)) << "this checkpoint cannot tell fp8 apart";
  StreamResult r = Generate("alpha-fp8", "The cat sat on", 24);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.ids, fp8);
  std::map<std::string, std::string> quantization;
  const v1::ClusterState state = State();
  for (const auto& m : state.models()) quantization[m.name()] = m.quantization();
  EXPECT_EQ(quantization, (std::map<std::string, std::string>{
                              {"alpha", "none"}, {"alpha-fp8", "fp8"}, {"beta", "none"}}));
}

TEST_F(ClusterTest, ClientCancellationFreesTheSequenceOnTheNode) {
  v1::GenerateRequest req;
  req.set_model("alpha");
  req.set_prompt("a long one");
  req.mutable_sampling()->set_max_tokens(240);
  req.mutable_sampling()->set_ignore_eos(true);
  grpc::ClientContext ctx;
  auto reader = inference_->Generate(&ctx, req);
  v1::GenerateResponse resp;
  ASSERT_TRUE(reader->Read(&resp));  // first token arrived: it is running
  ctx.TryCancel();
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  auto idle = [&] {
    const auto state = State();
    for (const auto& n : state.nodes())
      for (const auto& d : n.devices())
        if (d.running() != 0 || d.kv_blocks_used() != 0) return false;
    return true;
  };
  EXPECT_TRUE(WaitFor(idle, absl::Seconds(5))) << State().DebugString();
}

TEST_F(ClusterTest, HealthAndMetricsEndpoints) {
  auto health = grpc::health::v1::Health::NewStub(channel_);
  grpc::ClientContext ctx;
  grpc::health::v1::HealthCheckResponse hr;
  ASSERT_TRUE(health->Check(&ctx, grpc::health::v1::HealthCheckRequest(), &hr).ok());
  EXPECT_EQ(hr.status(), grpc::health::v1::HealthCheckResponse::SERVING);
  const StreamResult first = Generate("alpha", "metrics", 5);
  ASSERT_TRUE(first.status.ok()) << first.status.error_code() << ": "
                                 << first.status.error_message();
  EXPECT_EQ(Generate("nope", "x", 1).status.error_code(), grpc::StatusCode::NOT_FOUND);
  const size_t size_before = testing::HttpGet(sched_metrics_, "/metrics").size();
  // Unknown model names share one label value: 50 of them add no series.
  for (int i = 0; i < 50; ++i) {
    EXPECT_EQ(Generate(absl::StrCat("junk-", i), "x", 1).status.error_code(),
              grpc::StatusCode::NOT_FOUND);
  }
  const std::string body = testing::HttpGet(sched_metrics_, "/metrics");
  EXPECT_EQ(body.find("junk-"), std::string::npos);
  EXPECT_LE(body.size(), size_before + 64);
  EXPECT_NE(body.find("ballast_scheduler_requests_total{model=\"alpha\",status=\"OK\"} 1"),
            std::string::npos)
      << body;
  EXPECT_NE(
      body.find("ballast_scheduler_requests_total{model=\"unknown\",status=\"NOT_FOUND\"} 51"),
      std::string::npos)
      << body;
  EXPECT_NE(body.find("ballast_scheduler_ttft_seconds_count{model=\"alpha\"} 1"),
            std::string::npos);
  EXPECT_NE(body.find("ballast_scheduler_tokens_generated_total{model=\"alpha\"} 5"),
            std::string::npos);
}

// Idle connections to the metrics port cannot block scrapes.
TEST_F(ClusterTest, IdleConnectionsDoNotBlockMetricsScrapes) {
  std::vector<int> idle;
  for (int i = 0; i < 4; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(sched_metrics_));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    idle.push_back(fd);  // connected, never sends a request
  }
  const absl::Time t0 = absl::Now();
  const std::string body = testing::HttpGet(sched_metrics_, "/metrics");
  EXPECT_NE(body.find("# TYPE ballast_"), std::string::npos) << body;
  EXPECT_LT(absl::Now() - t0, absl::Seconds(1));
  for (int fd : idle) close(fd);
}

// Migration keeps the source serving until the target is READY, then
// drains it: a request racing the move is served, the model ends on the
// target only, and it serves the same tokens there. (That draining waits
// for requests still running on the source is checked deterministically by
// NodeManager's unit test; the tiny model here finishes too fast to pin a
// request in flight.)
TEST_F(ClusterTest, MigrationFinishesInFlightRequestsAtTheSource) {
  const std::string from = NodeOf("alpha");
  const std::string to = from == "n1" ? "n2" : "n1";
  StreamResult long_run;
  std::thread t([&] { long_run = Generate("alpha", "a long answer, please", 200); });
  grpc::ClientContext ctx;
  v1::MigrateModelRequest req;
  req.set_name("alpha");
  req.set_from_node(from);
  req.set_to_node(to);
  v1::MigrateModelResponse resp;
  grpc::Status st = admin_->MigrateModel(&ctx, req, &resp);
  ASSERT_TRUE(st.ok()) << st.error_message();
  t.join();
  ASSERT_TRUE(long_run.status.ok()) << long_run.status.error_message() << Logs();
  EXPECT_EQ(long_run.ids.size(), 200u);  // a request racing the move is served
  ASSERT_TRUE(WaitFor([&] { return NodeOf("alpha") == to && ReadyReplicas("alpha") == 1; },
                      absl::Seconds(20)))
      << Logs();
  const StreamResult after = Generate("alpha", "Hello", 24);
  ASSERT_TRUE(after.status.ok()) << after.status.error_message();
  EXPECT_EQ(after.final.node_id(), to);
  EXPECT_EQ(after.ids, Reference("alpha", Bytes("Hello", true), 24));
  // Bad moves get actionable errors.
  for (const auto& [model, src, dst, code] :
       {std::tuple{"nope", from, to, grpc::StatusCode::NOT_FOUND},
        {"alpha", to, "n9", grpc::StatusCode::NOT_FOUND},
        {"alpha", from, to, grpc::StatusCode::FAILED_PRECONDITION}}) {
    grpc::ClientContext c;
    v1::MigrateModelRequest r;
    r.set_name(model);
    r.set_from_node(src);
    r.set_to_node(dst);
    EXPECT_EQ(admin_->MigrateModel(&c, r, &resp).error_code(), code)
        << model << " " << src << " " << dst;
  }
}

TEST_F(ClusterTest, KilledNodeIsDeclaredDeadAndTheOtherModelKeepsServing) {
  const std::string beta_node = NodeOf("beta");
  const std::string alpha_node = NodeOf("alpha");
  ASSERT_NE(beta_node, alpha_node);
  const int victim = beta_node == "n1" ? 0 : 1;
  nodes_[victim]->Stop(SIGKILL);
  auto dead = [&] {
    const auto state = State();
    for (const auto& n : state.nodes())
      if (n.node_id() == beta_node) return !n.alive();
    return false;
  };
  ASSERT_TRUE(WaitFor(dead, absl::Seconds(5))) << "node not declared dead";
  StreamResult r = Generate("alpha", "still here?", 8);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.ids, Reference("alpha", Bytes("still here?", true), 8));
  EXPECT_EQ(r.final.node_id(), alpha_node);
  // The lost model is placed again on the surviving node and served.
  ASSERT_TRUE(WaitFor([&] { return NodeOf("beta") == alpha_node; }, absl::Seconds(10)));
  StreamResult b = Generate("beta", "back?", 8);
  ASSERT_TRUE(b.status.ok()) << b.status.error_message();
  EXPECT_EQ(b.ids, Reference("beta", Bytes("back?", true), 8));
}

// A first model whose context holds a 1,500-token stream.
class TokenBatchTest : public ClusterTest {
 protected:
  ClusterSetup Cluster() override {
    ClusterSetup s = ClusterTest::Cluster();
    s.models[0].second.max_position = 4096;
    return s;
  }
};

// A client that stops reading: its 4 KiB flow-control window fills, the
// scheduler stops reading the node, the node's writes back up and it
// sends what queues behind them in batches. The scheduler relays them a
// token per message to a client that did not ask for batches, as batches
// to one that did (token_relay_test pins that down with a fake node).
// Both get the in-process engine's tokens.
TEST_F(TokenBatchTest, BatchesGoOnlyToClientsThatAskAndCarryTheSameTokens) {
  constexpr int kTokens = 1500;
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 4096);
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  auto stub = v1::Inference::NewStub(
      grpc::CreateCustomChannel(Addr(sched_port_), ClientCredentials(), args));
  const std::vector<int> reference = Reference("alpha", Bytes("Hello", true), kTokens);
  for (bool batches : {false, true}) {
    v1::GenerateRequest req;
    req.set_model("alpha");
    req.set_prompt("Hello");
    req.mutable_sampling()->set_max_tokens(kTokens);
    req.mutable_sampling()->set_ignore_eos(true);
    req.mutable_sampling()->set_logprobs(true);
    req.mutable_sampling()->set_top_logprobs(20);  // ~300-byte messages
    req.set_token_batches(batches);
    const StreamResult r = Run(
        req, absl::Seconds(120),
        [](int n) {
          if (n == 1) absl::SleepFor(absl::Seconds(1));  // the engine runs ahead
        },
        stub.get());
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(r.ids, reference) << "batches " << batches;
    EXPECT_EQ(r.final.text(), r.text);
    // How much the node batches depends on the buffers of two
    // connections (token_relay_test and node_generate_test pin it down).
    if (!batches) {
      EXPECT_EQ(r.token_messages, kTokens) << "one token per message";
    }
  }
}

}  // namespace
}  // namespace ballast
