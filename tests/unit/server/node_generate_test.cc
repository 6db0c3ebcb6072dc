// The node's Generate on gRPC's callback API (server/node_generate.h), over
// a real in-process gRPC server: many concurrent streams take a bounded
// number of threads (the synchronous API took one per stream) and each
// gets the exact tokens; a refused request ends with its status; a client
// that cancels frees its sequence. Token delivery is off the engine's step
// thread: a server interceptor records the thread of every write and
// Finish, none is the step thread, and each stream gets its tokens in
// order then its final message, exactly once, also when clients cancel
// mid-stream or do not read.
#include <grpcpp/grpcpp.h>
#include <grpcpp/support/server_interceptor.h>

#include <atomic>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/notification.h"
#include "ballast/v1/node.grpc.pb.h"
#include "gtest/gtest.h"
#include "node_manager/node_manager.h"
#include "server/delivery_queue.h"
#include "server/metrics.h"
#include "server/node_service.h"
#include "tests/unit/engine/test_util.h"

namespace ballast::server {
namespace {

// ThreadSanitizer builds (scripts/ci-checks.sh tsan) skip the two tests
// whose gRPC patterns TSan misreads: it cannot see the hand-offs inside
// gRPC's uninstrumented core (tests/sanitizers/tsan.supp).
#if defined(__SANITIZE_THREAD__)
constexpr bool kTsan = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
constexpr bool kTsan = true;
#else
constexpr bool kTsan = false;
#endif
#else
constexpr bool kTsan = false;
#endif

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

// The threads on which the server sends Generate's messages and statuses
// (an interceptor runs inline in the thread that calls StartWrite/Finish).
class SendThreads final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new Hook(this, std::string(info->method()) == "/ballast.v1.Node/Generate");
  }
  // Sends per thread, and the totals.
  std::map<std::thread::id, int> threads() {
    absl::MutexLock lock(&mu_);
    return threads_;
  }
  int messages() {
    absl::MutexLock lock(&mu_);
    return messages_;
  }
  int statuses() {
    absl::MutexLock lock(&mu_);
    return statuses_;
  }

 private:
  class Hook final : public grpc::experimental::Interceptor {
   public:
    Hook(SendThreads* owner, bool generate) : owner_(owner), generate_(generate) {}
    void Intercept(grpc::experimental::InterceptorBatchMethods* m) override {
      using grpc::experimental::InterceptionHookPoints;
      const bool msg = m->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_MESSAGE);
      const bool st = m->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS);
      if (generate_ && (msg || st)) {
        absl::MutexLock lock(&owner_->mu_);
        ++owner_->threads_[std::this_thread::get_id()];
        owner_->messages_ += msg;
        owner_->statuses_ += st;
      }
      m->Proceed();
    }

   private:
    SendThreads* const owner_;
    const bool generate_;
  };
  absl::Mutex mu_;
  std::map<std::thread::id, int> threads_ ABSL_GUARDED_BY(mu_);
  int messages_ ABSL_GUARDED_BY(mu_) = 0;
  int statuses_ ABSL_GUARDED_BY(mu_) = 0;
};

// Records the thread the engine calls a sink on (the device's step thread).
class ThreadSink final : public engine::GenerationSink {
 public:
  void OnToken(int, const std::string&, const engine::TokenLogprobs*) override {
    absl::MutexLock lock(&mu_);
    thread_ = std::this_thread::get_id();
  }
  void OnDone(absl::StatusOr<engine::GenerationResult>) override { done_.Notify(); }
  std::thread::id Wait() {
    EXPECT_TRUE(done_.WaitForNotificationWithTimeout(absl::Seconds(30)));
    absl::MutexLock lock(&mu_);
    return thread_;
  }

 private:
  absl::Mutex mu_;
  std::thread::id thread_ ABSL_GUARDED_BY(mu_);
  absl::Notification done_;
};

// One stream read with the callback client (no thread of its own). With
// `cancel_after` > 0 it cancels once that many tokens came.
class Reader final : public grpc::ClientReadReactor<v1::NodeGenerateResponse> {
 public:
  Reader(v1::Node::Stub* stub, v1::NodeGenerateRequest req, int cancel_after = 0)
      : req_(std::move(req)), cancel_after_(cancel_after) {
    stub->async()->Generate(&ctx, &req_, this);
    StartRead(&resp_);
    StartCall();
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;
    if (finals > 0) ++after_final;
    if (resp_.has_token()) {
      ++tokens;
      ids.push_back(resp_.token().id());
      if (!first_token.HasBeenNotified()) first_token.Notify();
      if (tokens == cancel_after_) ctx.TryCancel();
    } else if (resp_.has_final()) {
      ++finals;
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
  int tokens = 0, finals = 0, after_final = 0;
  std::vector<int> ids;  // streamed, in order
  std::vector<int> output;
  absl::Notification first_token, done;

 private:
  v1::NodeGenerateRequest req_;
  const int cancel_after_;
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
    if (InterceptSends()) {
      std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> hooks;
      hooks.push_back(std::make_unique<SendThreads>());
      sends_ = static_cast<SendThreads*>(hooks.back().get());
      b.experimental().SetInterceptorCreators(std::move(hooks));
    }
    server_ = b.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    port_ = port;
    stub_ = v1::Node::NewStub(
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
  }
  // Whether the server records its send threads (sends_).
  virtual bool InterceptSends() const { return false; }
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

  // A client that reads nothing does not hold the engine: its sequence runs
  // to the end while the stream's messages wait (flow control), then it
  // reads every token (with its log-probabilities) in order and the final
  // message. Read on this thread alone (the synchronous client). Returns the
  // messages that carried tokens.
  int ReadEverythingLater(bool token_batches, v1::Node::Stub* stub) {
    constexpr int kTokens = 1500;
    v1::NodeGenerateRequest req = Request("slow", kTokens);
    req.mutable_sampling()->set_logprobs(true);
    req.mutable_sampling()->set_top_logprobs(5);
    req.set_token_batches(token_batches);
    grpc::ClientContext ctx;
    std::unique_ptr<grpc::ClientReader<v1::NodeGenerateResponse>> stream =
        stub->Generate(&ctx, req);
    absl::SleepFor(absl::Milliseconds(50));
    for (int i = 0; i < 3000 && InEngine() > 0; ++i) absl::SleepFor(absl::Milliseconds(10));
    EXPECT_EQ(InEngine(), 0) << "the engine waits for a client that does not read";
    std::vector<int> ids, output;
    int with_logprobs = 0, finals = 0, after_final = 0, messages = 0, batches = 0;
    auto token = [&](const v1::Token& tok) {
      ids.push_back(tok.id());
      with_logprobs += tok.has_logprob() && tok.top_logprobs_size() == 5;
    };
    v1::NodeGenerateResponse m;
    while (stream->Read(&m)) {
      if (finals > 0) ++after_final;
      if (m.has_token()) {
        token(m.token());
        ++messages;
      } else if (m.has_tokens()) {
        EXPECT_GE(m.tokens().tokens_size(), 2) << "one token comes as `token`";
        for (const v1::Token& tok : m.tokens().tokens()) token(tok);
        ++messages;
        ++batches;
      } else if (m.has_final()) {
        ++finals;
        output.assign(m.final().output_tokens().begin(), m.final().output_tokens().end());
      }
    }
    const grpc::Status status = stream->Finish();
    EXPECT_TRUE(status.ok()) << status.error_message();
    EXPECT_EQ(static_cast<int>(ids.size()), kTokens);
    EXPECT_EQ(with_logprobs, kTokens);
    EXPECT_EQ(ids, output);
    EXPECT_EQ(finals, 1);
    EXPECT_EQ(after_final, 0);
    if (!token_batches) {
      EXPECT_EQ(batches, 0) << "batches only for a caller that asks";
    }
    return messages;
  }

  engine::testing::TempDir dir_;
  Metrics metrics_;
  std::unique_ptr<node_manager::NodeManager> node_;
  std::unique_ptr<NodeService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::Node::Stub> stub_;
  int port_ = 0;
  SendThreads* sends_ = nullptr;  // owned by server_, with InterceptSends()
};

// The fixture's server with the send-thread interceptor. Not under TSan: an
// interceptor makes gRPC finish each op set in two rounds through its
// core, on different threads, which TSan reports as races inside gRPC's
// op sets.
class NodeGenerateSendThreadsTest : public NodeGenerateTest {
 protected:
  bool InterceptSends() const override { return true; }
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
    EXPECT_EQ(r->ids, r->output);              // streamed in order, each once
    EXPECT_EQ(r->finals, 1);
    EXPECT_EQ(r->after_final, 0);
  }
}

// The step thread records each token; the delivery pool builds and writes
// the messages (before, the step thread called StartWrite inline).
TEST_F(NodeGenerateSendThreadsTest, WritesAndFinishesRunOffTheStepThread) {
  if (kTsan) GTEST_SKIP() << "the interceptor's hand-offs are invisible to TSan";
  ThreadSink probe;
  ASSERT_TRUE(node_->Submit(Request("probe", 2), &probe).ok());
  const std::thread::id step_thread = probe.Wait();
  constexpr int kStreams = 16, kTokens = 48;
  std::vector<std::unique_ptr<Reader>> readers;
  for (int i = 0; i < kStreams; ++i) {
    readers.push_back(
        std::make_unique<Reader>(stub_.get(), Request(absl::StrCat("w", i), kTokens)));
  }
  for (auto& r : readers) ASSERT_TRUE(r->done.WaitForNotificationWithTimeout(absl::Seconds(60)));
  for (auto& r : readers) {
    ASSERT_TRUE(r->status.ok()) << r->status.error_message();
    EXPECT_EQ(r->ids, r->output);
    EXPECT_EQ(r->finals, 1);
  }
  EXPECT_EQ(sends_->messages(), kStreams * (kTokens + 1));  // tokens and finals, once each
  EXPECT_EQ(sends_->statuses(), kStreams);
  const auto threads = sends_->threads();
  EXPECT_EQ(threads.count(step_thread), 0u)
      << threads.at(step_thread) << " writes on the engine's step thread";
}

// Clients cancel at every point of their streams while deliveries are
// posted, written and finished: each stream ends once, with its tokens in
// order, and the engine frees every sequence. Not under TSan: many
// cancelled calls make gRPC run a call's OnDone on a thread its core hands
// it to, and TSan reports the context's deletion there against the
// completion callback that ran before (also with the stream written from
// the step thread); ASan and the Release build run it.
TEST_F(NodeGenerateTest, StreamsCancelledMidStreamEndOnceAndFreeTheirSequences) {
  if (kTsan) GTEST_SKIP() << "gRPC's OnDone hand-off is invisible to TSan";
  constexpr int kStreams = 48;
  std::vector<std::unique_ptr<Reader>> readers;
  for (int i = 0; i < kStreams; ++i) {
    const int tokens = i % 4 == 0 ? 24 : 2000;  // a quarter finish, the others are cancelled
    readers.push_back(std::make_unique<Reader>(stub_.get(), Request(absl::StrCat("c", i), tokens),
                                               /*cancel_after=*/1 + (i * 7) % 40));
  }
  for (auto& r : readers) ASSERT_TRUE(r->done.WaitForNotificationWithTimeout(absl::Seconds(60)));
  int cancelled = 0;
  for (int i = 0; i < kStreams; ++i) {
    const Reader& r = *readers[i];
    EXPECT_EQ(r.after_final, 0);
    if (r.status.ok()) {
      EXPECT_EQ(r.finals, 1);
      EXPECT_EQ(r.ids, r.output);
    } else {
      ++cancelled;
      EXPECT_EQ(r.status.error_code(), grpc::StatusCode::CANCELLED) << r.status.error_message();
      EXPECT_EQ(r.finals, 0);
    }
  }
  EXPECT_GE(cancelled, kStreams / 2);
  for (int i = 0; i < 500 && InEngine() > 0; ++i) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_EQ(InEngine(), 0) << "the engine still runs cancelled sequences";
}

TEST_F(NodeGenerateTest, AClientThatDoesNotReadGetsEverythingLater) {
  EXPECT_EQ(ReadEverythingLater(false, stub_.get()), 1500);
}

// With token_batches, the tokens that queued while the client did not read
// come in fewer messages: the same tokens, in order, with their
// log-probabilities.
TEST_F(NodeGenerateTest, ABatchingClientThatDoesNotReadGetsTheTokensInFewerMessages) {
  // A client whose flow-control window stays at 4 KiB (no BDP probing):
  // the first messages fill it one token each, what queued behind them
  // comes in batches.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 4096);
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  auto stub = v1::Node::NewStub(grpc::CreateCustomChannel(
      absl::StrCat("127.0.0.1:", port_), grpc::InsecureChannelCredentials(), args));
  const int messages = ReadEverythingLater(true, stub.get());
  EXPECT_LT(messages, 1500 / 2) << "the queued tokens were not batched";
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

// Every posted pump runs once, on the pool's threads (at most its size at
// once), and a burst of posts shares few pool tasks: the poster wakes the
// pool about once per burst, not once per post.
TEST(DeliveryQueueTest, BurstsRunOnceOffThePostersThreadInFewTasks) {
  constexpr int kPosts = 2000, kThreads = 2;
  DeliveryQueue q(kThreads);
  absl::Mutex mu;
  std::vector<int> runs(kPosts, 0);
  int running = 0, peak = 0;
  bool on_poster = false;
  absl::BlockingCounter left(kPosts);
  const std::thread::id poster = std::this_thread::get_id();
  for (int i = 0; i < kPosts; ++i) {
    q.Post([&, i] {
      {
        absl::MutexLock lock(&mu);
        ++runs[i];
        peak = std::max(peak, ++running);
        on_poster |= std::this_thread::get_id() == poster;
      }
      absl::SleepFor(absl::Microseconds(20));  // slower than posting: a backlog builds
      {
        absl::MutexLock lock(&mu);
        --running;
      }
      left.DecrementCount();
    });
  }
  left.Wait();
  absl::MutexLock lock(&mu);
  for (int i = 0; i < kPosts; ++i) ASSERT_EQ(runs[i], 1) << i;
  EXPECT_FALSE(on_poster);
  EXPECT_LE(peak, kThreads);
  EXPECT_LT(q.drains_started(), kPosts / 10) << "a pool task per post";
}

// Destruction runs what is still queued (the pool's Stop drains it).
TEST(DeliveryQueueTest, DestructionRunsWhatIsQueued) {
  std::atomic<int> ran{0};
  {
    DeliveryQueue q(1);
    absl::Notification release;
    q.Post([&] { release.WaitForNotification(); });
    for (int i = 0; i < 100; ++i) q.Post([&] { ++ran; });
    release.Notify();
  }
  EXPECT_EQ(ran.load(), 100);
}

}  // namespace
}  // namespace ballast::server
