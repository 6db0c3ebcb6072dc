// The scheduler's relay of a node's token batches (GenerateRequest and
// NodeGenerateRequest token_batches), over a real in-process gRPC server
// and Scheduler with a fake node whose Generate sends a fixed sequence of
// messages: token 1 alone, a batch of 2, 3, 4, a batch of 5, 6, then the
// final. A client that did not ask for batches gets one token per message;
// one that did gets the node's messages, or several of them joined where
// they came while its previous message was being written (the relay reads
// ahead). The node is always asked for batches. And a client that does
// not read while a node streams single tokens gets what gathered behind
// its flow-control window in batches.
#include <grpcpp/grpcpp.h>

#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "ballast/v1/inference.grpc.pb.h"
#include "ballast/v1/node.grpc.pb.h"
#include "global_scheduler/scheduler.h"
#include "gtest/gtest.h"
#include "server/metrics.h"
#include "server/scheduler_service.h"
#include "server/token_relay.h"
#include "tests/unit/server/scheduler_front.h"

namespace ballast::server {
namespace {

// A node serving model "m" whose Generate streams tokens 1..6 in three
// messages, then the final.
class BatchingNode final : public v1::Node::Service {
 public:
  BatchingNode() { server_ = testing::StartFakeNode(this, &port_); }
  ~BatchingNode() override { server_->Shutdown(); }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  // Whether every Generate so far asked for batches.
  bool all_asked_for_batches() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock l(&mu_);
    return calls_ > 0 && asked_ == calls_;
  }

  grpc::Status Generate(grpc::ServerContext*, const v1::NodeGenerateRequest* req,
                        grpc::ServerWriter<v1::NodeGenerateResponse>* w) override
      ABSL_LOCKS_EXCLUDED(mu_) {
    {
      absl::MutexLock l(&mu_);
      ++calls_;
      asked_ += req->token_batches();
    }
    auto fill = [](int id, v1::Token* t) {
      t->set_id(id);
      t->set_text(absl::StrCat("<", id, ">"));
    };
    v1::NodeGenerateResponse one;
    fill(1, one.mutable_token());
    w->Write(one);
    for (const std::vector<int>& batch : {std::vector<int>{2, 3, 4}, std::vector<int>{5, 6}}) {
      v1::NodeGenerateResponse r;
      for (int id : batch) fill(id, r.mutable_tokens()->add_tokens());
      w->Write(r);
    }
    v1::NodeGenerateResponse fin;
    fin.mutable_final()->add_prompt_tokens(1);
    for (int id = 1; id <= 6; ++id) fin.mutable_final()->add_output_tokens(id);
    fin.mutable_final()->mutable_final()->mutable_usage()->set_completion_tokens(6);
    w->Write(fin);
    return grpc::Status::OK;
  }

 private:
  absl::Mutex mu_;
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
  int asked_ ABSL_GUARDED_BY(mu_) = 0;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

class TokenRelayTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_NO_FATAL_FAILURE(front_.Start(node_.address())); }
  void TearDown() override { front_.Stop(); }

  // The token messages of one Generate call, each as its token ids; the
  // streamed text goes to `text`.
  std::vector<std::vector<int>> Generate(bool token_batches, std::string* text) {
    v1::GenerateRequest req;
    req.set_model("m");
    req.set_prompt("hi");
    req.mutable_sampling()->set_max_tokens(6);
    req.set_token_batches(token_batches);
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    auto reader = front_.stub->Generate(&ctx, req);
    v1::GenerateResponse resp;
    std::vector<std::vector<int>> messages;
    int finals = 0;
    while (reader->Read(&resp)) {
      if (resp.has_token()) {
        messages.push_back({resp.token().id()});
        *text += resp.token().text();
      } else if (resp.has_tokens()) {
        messages.emplace_back();
        for (const v1::Token& t : resp.tokens().tokens()) {
          messages.back().push_back(t.id());
          *text += t.text();
        }
      } else if (resp.has_final()) {
        ++finals;
        EXPECT_EQ(resp.final().usage().completion_tokens(), 6);
      }
    }
    const grpc::Status st = reader->Finish();
    EXPECT_TRUE(st.ok()) << st.error_message();
    EXPECT_EQ(finals, 1);
    return messages;
  }

  BatchingNode node_;
  testing::SchedulerFront front_;
};

TEST_F(TokenRelayTest, AClientThatDidNotAskGetsOneTokenPerMessage) {
  std::string text;
  const std::vector<std::vector<int>> got = Generate(false, &text);
  EXPECT_EQ(got, (std::vector<std::vector<int>>{{1}, {2}, {3}, {4}, {5}, {6}}));
  EXPECT_EQ(text, "<1><2><3><4><5><6>");
  EXPECT_TRUE(node_.all_asked_for_batches());
}

TEST_F(TokenRelayTest, AClientThatAskedGetsTheNodesBatches) {
  std::string text;
  const std::vector<std::vector<int>> got = Generate(true, &text);
  std::vector<int> ids;
  for (const std::vector<int>& m : got) {
    ids.insert(ids.end(), m.begin(), m.end());
    // Each message ends where one of the node's did (1, 4 or 6): the node's
    // messages, whole, some joined.
    ASSERT_FALSE(m.empty());
    EXPECT_TRUE(m.back() == 1 || m.back() == 4 || m.back() == 6) << "split at " << m.back();
  }
  EXPECT_EQ(ids, (std::vector<int>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(text, "<1><2><3><4><5><6>");
  EXPECT_TRUE(node_.all_asked_for_batches());
}

// A node streaming kTokens tokens, each alone in its message with 200
// bytes of text, then the final; `sent` once its Generate has written all.
class SingleTokenNode final : public v1::Node::Service {
 public:
  static constexpr int kTokens = 100;
  SingleTokenNode() { server_ = testing::StartFakeNode(this, &port_); }
  ~SingleTokenNode() override { server_->Shutdown(); }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }

  grpc::Status Generate(grpc::ServerContext*, const v1::NodeGenerateRequest*,
                        grpc::ServerWriter<v1::NodeGenerateResponse>* w) override {
    v1::NodeGenerateResponse fin;
    for (int id = 1; id <= kTokens; ++id) {
      v1::NodeGenerateResponse r;
      r.mutable_token()->set_id(id);
      r.mutable_token()->set_text(std::string(200, 'a'));
      if (!w->Write(r)) return grpc::Status(grpc::StatusCode::CANCELLED, "write failed");
      fin.mutable_final()->add_output_tokens(id);
    }
    fin.mutable_final()->add_prompt_tokens(1);
    fin.mutable_final()->mutable_final()->mutable_usage()->set_completion_tokens(kTokens);
    w->Write(fin);
    sent.Notify();
    return grpc::Status::OK;
  }

  absl::Notification sent;

 private:
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

TEST(TokenRelayReadAheadTest, TokensGatheredWhileTheClientDoesNotReadComeInBatches) {
  SingleTokenNode node;
  testing::SchedulerFront front;
  ASSERT_NO_FATAL_FAILURE(front.Start(node.address()));
  absl::Cleanup stop = [&] { front.Stop(); };
  // A client whose flow-control window stays at 4 KiB (no BDP probing): the
  // first few messages fill it, and the scheduler's writes then wait while
  // the node's messages (20 KiB, within the scheduler's own window) arrive.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 4096);
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  auto stub = v1::Inference::NewStub(grpc::CreateCustomChannel(
      absl::StrCat("127.0.0.1:", front.port), grpc::InsecureChannelCredentials(), args));
  v1::GenerateRequest req;
  req.set_model("m");
  req.set_prompt("hi");
  req.mutable_sampling()->set_max_tokens(SingleTokenNode::kTokens);
  req.set_token_batches(true);
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  auto reader = stub->Generate(&ctx, req);
  ASSERT_TRUE(node.sent.WaitForNotificationWithTimeout(absl::Seconds(30)))
      << "the node's messages did not fit the scheduler's window";
  std::vector<int> ids;
  int messages = 0, finals = 0;
  v1::GenerateResponse resp;
  while (reader->Read(&resp)) {
    if (resp.has_token()) ids.push_back(resp.token().id());
    for (const v1::Token& t : resp.tokens().tokens()) ids.push_back(t.id());
    messages += resp.has_token() || resp.has_tokens();
    finals += resp.has_final();
  }
  const grpc::Status st = reader->Finish();
  EXPECT_TRUE(st.ok()) << st.error_message();
  std::vector<int> want(SingleTokenNode::kTokens);
  std::iota(want.begin(), want.end(), 1);
  EXPECT_EQ(ids, want);
  EXPECT_EQ(finals, 1);
  // How many depends on when gRPC's buffers let the relay's writes wait:
  // 4 to 68 messages over 80 runs on a 2-core VM (21 most often). One by
  // one would be kTokens.
  EXPECT_LT(messages, SingleTokenNode::kTokens)
      << "the relay wrote the node's messages one by one instead of gathering them";
}

// TokenRelay alone: what each client message takes from what gathered.
std::vector<int> Ids(const v1::GenerateResponse& m) {
  if (m.has_token()) return {m.token().id()};
  std::vector<int> ids;
  for (const v1::Token& t : m.tokens().tokens()) ids.push_back(t.id());
  return ids;
}

v1::NodeGenerateResponse NodeTokens(int first, int count) {
  v1::NodeGenerateResponse r;
  for (int id = first; id < first + count; ++id) {
    v1::Token* t = count == 1 ? r.mutable_token() : r.mutable_tokens()->add_tokens();
    t->set_id(id);
  }
  return r;
}

TEST(TokenRelayBuffer, ABatchingClientTakesEverythingGatheredUpToTheCap) {
  TokenRelay relay(true);
  v1::GenerateResponse m;
  EXPECT_FALSE(relay.Next(&m));
  relay.Add(NodeTokens(1, 1));
  relay.Add(NodeTokens(2, 2));
  relay.Add(v1::NodeGenerateResponse());  // no tokens (a final's message)
  ASSERT_TRUE(relay.Next(&m));
  EXPECT_TRUE(m.has_tokens());
  EXPECT_EQ(Ids(m), (std::vector<int>{1, 2, 3}));
  EXPECT_TRUE(relay.empty());
  relay.Add(NodeTokens(4, 1));
  ASSERT_TRUE(relay.Next(&m));
  EXPECT_TRUE(m.has_token()) << "one token goes alone, as `token`";
  EXPECT_EQ(Ids(m), (std::vector<int>{4}));
  // Past the cap: full, and a message carries kMaxTokens.
  const int n = static_cast<int>(TokenRelay::kMaxTokens) + 44;
  relay.Add(NodeTokens(10, n));
  EXPECT_TRUE(relay.full());
  ASSERT_TRUE(relay.Next(&m));
  EXPECT_EQ(m.tokens().tokens_size(), static_cast<int>(TokenRelay::kMaxTokens));
  EXPECT_EQ(m.tokens().tokens(0).id(), 10);
  EXPECT_FALSE(relay.full());
  ASSERT_TRUE(relay.Next(&m));
  EXPECT_EQ(m.tokens().tokens_size(), 44);
  EXPECT_EQ(m.tokens().tokens(0).id(), 10 + static_cast<int>(TokenRelay::kMaxTokens));
  EXPECT_FALSE(relay.Next(&m));
}

TEST(TokenRelayBuffer, AClientWithoutBatchesTakesOneTokenAMessageInOrder) {
  TokenRelay relay(false);
  relay.Add(NodeTokens(1, 3));
  relay.Add(NodeTokens(4, 1));
  std::vector<int> ids;
  v1::GenerateResponse m;
  while (relay.Next(&m)) {
    ASSERT_TRUE(m.has_token());
    ids.push_back(m.token().id());
  }
  EXPECT_EQ(ids, (std::vector<int>{1, 2, 3, 4}));
  relay.Add(NodeTokens(5, 2));
  relay.Clear();
  EXPECT_TRUE(relay.empty());
  EXPECT_FALSE(relay.Next(&m));
}

}  // namespace
}  // namespace ballast::server
