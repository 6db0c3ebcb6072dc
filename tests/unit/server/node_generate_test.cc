// The node's Generate on gRPC's callback API (server/node_generate.h), over
// a real in-process gRPC server: many concurrent streams take a bounded
// number of threads (the synchronous API took one per stream) and each
// gets the exact tokens; a refused request ends with its status; a client
// that cancels frees its sequence.
#include <grpcpp/grpcpp.h>

#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "ballast/v1/node.grpc.pb.h"
#include "gtest/gtest.h"
#include "node_manager/node_manager.h"
#include "server/metrics.h"
#include "server/node_service.h"
#include "tests/unit/engine/test_util.h"

namespace ballast::server {
namespace {

// The threads of this process now.
int ThreadCount() {
  std::ifstream in("/proc/self/status");
  std::string line;
  int n = -1;
  while (std::getline(in, line)) {
    if (line.rfind("Threads:", 0) == 0) {
      EXPECT_TRUE(absl::SimpleAtoi(line.substr(8), &n));
    }
  }
  return n;
}

// One stream read with the callback client (no thread of its own).
class Reader final : public grpc::ClientReadReactor<v1::NodeGenerateResponse> {
 public:
  Reader(v1::Node::Stub* stub, v1::NodeGenerateRequest req) : req_(std::move(req)) {
    stub->async()->Generate(&ctx, &req_, this);
    StartRead(&resp_);
    StartCall();
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;
    if (resp_.has_token()) {
      ++tokens;
      if (!first_token.HasBeenNotified()) first_token.Notify();
    } else if (resp_.has_final()) {
      output.assign(resp_.final().output_tokens().begin(), resp_.final().output_tokens().end());
    }
    StartRead(&resp_);
  }
  void OnDone(const grpc::Status& s) override {
    status = s;
    done.Notify();
  }

  grpc::ClientContext ctx;
  grpc::Status status;
  int tokens = 0;
  std::vector<int> output;
  absl::Notification first_token, done;

 private:
  v1::NodeGenerateRequest req_;
  v1::NodeGenerateResponse resp_;
};

class NodeGenerateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    node_manager::NodeOptions n;
    n.devices = {node_manager::DeviceOptions{"cpu:0", 256ll << 20}};
    n.engine.max_seqs = 32;
    node_ = std::move(*node_manager::NodeManager::Create(n));
    engine::SyntheticModelSpec spec;
    spec.max_position = 8192;  // long streams to cancel
    ASSERT_TRUE(
        node_->LoadModel("a", engine::testing::WriteTinyModel(dir_, "a", spec), "auto", "").ok());
    service_ = std::make_unique<NodeService>(node_.get(), &metrics_);
    grpc::ServerBuilder b;
    int port = 0;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    b.RegisterService(service_.get());
    server_ = b.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    stub_ = v1::Node::NewStub(
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
  }
  void TearDown() override {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
    service_.reset();
    node_->Shutdown();
  }
  static v1::NodeGenerateRequest Request(const std::string& id, int max_tokens) {
    v1::NodeGenerateRequest r;
    r.set_request_id(id);
    r.set_model("a");
    r.set_prompt("the same question");
    r.mutable_sampling()->set_max_tokens(max_tokens);
    r.mutable_sampling()->set_ignore_eos(true);
    return r;
  }
  int InEngine() {
    const engine::EngineStats s = node_->devices()[0]->Find("a")->stats();
    return s.waiting + s.running;
  }

  engine::testing::TempDir dir_;
  Metrics metrics_;
  std::unique_ptr<node_manager::NodeManager> node_;
  std::unique_ptr<NodeService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::Node::Stub> stub_;
};

TEST_F(NodeGenerateTest, ManyStreamsTakeBoundedThreadsAndGetExactTokens) {
  constexpr int kStreams = 300, kTokens = 64;
  const int before = ThreadCount();
  std::vector<std::unique_ptr<Reader>> readers;
  for (int i = 0; i < kStreams; ++i) {
    readers.push_back(
        std::make_unique<Reader>(stub_.get(), Request(absl::StrCat("r", i), kTokens)));
  }
  // Every stream open at once: most wait in the engine's queue (32 run).
  int peak = 0;
  for (int i = 0; i < 600 && !readers.back()->done.HasBeenNotified(); ++i) {
    peak = std::max(peak, ThreadCount());
    if (InEngine() >= kStreams / 2) break;
    absl::SleepFor(absl::Milliseconds(10));
  }
  peak = std::max(peak, ThreadCount());
  EXPECT_LT(peak - before, 100) << "threads grow with the streams: " << before << " -> " << peak;
  for (auto& r : readers) ASSERT_TRUE(r->done.WaitForNotificationWithTimeout(absl::Seconds(120)));
  for (auto& r : readers) {
    ASSERT_TRUE(r->status.ok()) << r->status.error_message();
    EXPECT_EQ(r->tokens, kTokens);
    EXPECT_EQ(r->output, readers[0]->output);  // greedy, same prompt
  }
}

TEST_F(NodeGenerateTest, ARefusedRequestEndsWithItsStatus) {
  v1::NodeGenerateRequest r = Request("x", 4);
  r.set_model("nope");
  Reader reader(stub_.get(), r);
  ASSERT_TRUE(reader.done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_EQ(reader.status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(reader.tokens, 0);
}

TEST_F(NodeGenerateTest, ACancelledStreamFreesItsSequence) {
  Reader reader(stub_.get(), Request("long", 8000));
  ASSERT_TRUE(reader.first_token.WaitForNotificationWithTimeout(absl::Seconds(30)));
  reader.ctx.TryCancel();
  ASSERT_TRUE(reader.done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_EQ(reader.status.error_code(), grpc::StatusCode::CANCELLED);
  for (int i = 0; i < 500 && InEngine() > 0; ++i) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_EQ(InEngine(), 0) << "the engine still runs the cancelled sequence";
}

}  // namespace
}  // namespace ballast::server
