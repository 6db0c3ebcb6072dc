// Advise's own bounded pool (server/scheduler_service.h) over a real
// in-process gRPC server and Scheduler, with a fake node whose PrefetchKv
// (the node call an admitted advisory makes) blocks until the test opens
// it: the seam that holds the advisory pool's threads, no sleeps.
// (a) With more advisories stuck than the routing pool has threads,
// Generate is still routed and served at once. (b) Past advise_queue,
// Advise is refused RESOURCE_EXHAUSTED with a retry hint and counted in
// ballast_scheduler_rejections_total{reason="advise_queue_full"}; the
// queued ones are served once the node answers.
#include <grpcpp/grpcpp.h>

#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "ballast/v1/inference.grpc.pb.h"
#include "ballast/v1/node.grpc.pb.h"
#include "global_scheduler/scheduler.h"
#include "gtest/gtest.h"
#include "prometheus/text_serializer.h"
#include "server/metrics.h"
#include "server/scheduler_service.h"
#include "tests/unit/server/scheduler_front.h"

namespace ballast::server {
namespace {

// A node serving model "m": Generate streams one token and a final;
// PrefetchKv blocks while the gate is closed.
class GatedNode final : public v1::Node::Service {
 public:
  GatedNode() { server_ = testing::StartFakeNode(this, &port_); }
  ~GatedNode() override {
    Open();
    server_->Shutdown();
  }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  void Close() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock l(&mu_);
    open_ = false;
  }
  void Open() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock l(&mu_);
    open_ = true;
  }
  // Blocks until `n` PrefetchKv calls wait at the gate (or 10 s pass).
  bool AwaitWaiting(int n) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock l(&mu_);
    auto reached = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return waiting_ >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&reached), absl::Seconds(10));
  }

  grpc::Status PrefetchKv(grpc::ServerContext*, const v1::PrefetchKvRequest* req,
                          v1::PrefetchKvResponse* resp) override ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock l(&mu_);
    ++waiting_;
    mu_.Await(absl::Condition(&open_));
    --waiting_;
    resp->set_tokens(req->tokens_size());
    resp->set_source(v1::KV_SOURCE_HOST_DRAM);
    return grpc::Status::OK;
  }
  grpc::Status Generate(grpc::ServerContext*, const v1::NodeGenerateRequest*,
                        grpc::ServerWriter<v1::NodeGenerateResponse>* w) override {
    v1::NodeGenerateResponse token;
    token.mutable_token()->set_id(7);
    token.mutable_token()->set_text("x");
    w->Write(token);
    v1::NodeGenerateResponse fin;
    fin.mutable_final()->add_prompt_tokens(1);
    fin.mutable_final()->add_output_tokens(7);
    fin.mutable_final()->mutable_final()->mutable_usage()->set_completion_tokens(1);
    w->Write(fin);
    return grpc::Status::OK;
  }
  grpc::Status DropSession(grpc::ServerContext*, const v1::DropSessionRequest*,
                           v1::DropSessionResponse*) override {
    return grpc::Status::OK;  // never served the session before
  }

 private:
  absl::Mutex mu_;
  bool open_ ABSL_GUARDED_BY(mu_) = true;
  int waiting_ ABSL_GUARDED_BY(mu_) = 0;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

// Advise calls in flight on the callback client, and their statuses.
class Advisories {
 public:
  // Sends one Advise for `session`; it completes in the background.
  void Send(v1::Inference::Stub* stub, const std::string& session) ABSL_LOCKS_EXCLUDED(mu_) {
    auto call = std::make_unique<Call>();
    call->req.set_session_id(session);
    call->req.set_model("m");
    Call* c = call.get();
    {
      absl::MutexLock l(&mu_);
      calls_.push_back(std::move(call));
    }
    stub->async()->Advise(&c->ctx, &c->req, &c->resp, [this](grpc::Status st) {
      absl::MutexLock l(&mu_);
      statuses_.push_back(std::move(st));
    });
  }
  int done() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock l(&mu_);
    return static_cast<int>(statuses_.size());
  }
  // Waits (up to 30 s) for every call sent to end; whether they did.
  bool AwaitAll() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock l(&mu_);
    auto all = [this]()
                   ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return statuses_.size() == calls_.size(); };
    return mu_.AwaitWithTimeout(absl::Condition(&all), absl::Seconds(30));
  }
  // Waits for every call sent; how many ended OK.
  int AwaitAllOk() ABSL_LOCKS_EXCLUDED(mu_) {
    EXPECT_TRUE(AwaitAll());
    absl::MutexLock l(&mu_);
    int ok = 0;
    for (const grpc::Status& st : statuses_) {
      EXPECT_TRUE(st.ok()) << st.error_message();
      ok += st.ok();
    }
    return ok;
  }

 private:
  struct Call {
    grpc::ClientContext ctx;
    v1::AdviseRequest req;
    v1::AdviseResponse resp;
  };
  absl::Mutex mu_;
  std::vector<std::unique_ptr<Call>> calls_ ABSL_GUARDED_BY(mu_);
  std::vector<grpc::Status> statuses_ ABSL_GUARDED_BY(mu_);
};

// A scheduler with node "n1" serving "m", the Inference service on a
// loopback port, and session "s1" with one turn on n1.
class AdvisePoolTest : public ::testing::Test {
 protected:
  void Start(int advise_threads, int advise_queue, global_scheduler::QuotaOptions quotas = {}) {
    global_scheduler::SchedulerOptions o;
    o.quotas = std::move(quotas);
    o.advise_threads = advise_threads;
    o.advise_queue = advise_queue;
    ASSERT_NO_FATAL_FAILURE(front_.Start(node_.address(), std::move(o)));
    ASSERT_TRUE(Generate("s1").ok());  // the session advisories name
  }
  void TearDown() override {
    node_.Open();
    EXPECT_TRUE(advisories_.AwaitAll());  // no callback outlives the test
    front_.Stop();
  }

  // One Generate turn (10 s deadline: a routing pool held by advisories
  // would exceed it).
  grpc::Status Generate(const std::string& session) {
    v1::GenerateRequest req;
    req.set_model("m");
    req.set_prompt("hi");
    req.set_session_id(session);
    req.mutable_sampling()->set_max_tokens(1);
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    auto reader = front_.stub->Generate(&ctx, req);
    v1::GenerateResponse resp;
    int tokens = 0;
    while (reader->Read(&resp)) tokens += resp.has_token();
    grpc::Status st = reader->Finish();
    EXPECT_TRUE(!st.ok() || tokens == 1) << tokens << " tokens";
    return st;
  }

  std::string Scrape() {
    std::ostringstream out;
    prometheus::TextSerializer().Serialize(out, front_.metrics.registry()->Collect());
    return out.str();
  }

  GatedNode node_;
  Advisories advisories_;
  testing::SchedulerFront front_;
};

TEST_F(AdvisePoolTest, GenerateIsRoutedWhileAdvisoriesHoldTheirPool) {
  // More stuck advisories than Generate's routing pool has threads: on a
  // shared pool they would hold every routing thread.
  const int n = InferenceService::kRoutingThreads + 2;
  Start(/*advise_threads=*/2, /*advise_queue=*/n);
  node_.Close();
  for (int i = 0; i < n; ++i) advisories_.Send(front_.stub.get(), "s1");
  ASSERT_TRUE(node_.AwaitWaiting(2));  // both advisory threads blocked in the node
  ASSERT_TRUE(front_.service->advisories().AwaitPending(n, absl::Seconds(10)));

  for (int i = 0; i < 3; ++i) {
    const grpc::Status st = Generate(absl::StrCat("other-", i));
    ASSERT_TRUE(st.ok()) << st.error_message();
  }
  EXPECT_EQ(advisories_.done(), 0);  // all still held
  node_.Open();
  EXPECT_EQ(advisories_.AwaitAllOk(), n);
}

TEST_F(AdvisePoolTest, AFullQueueIsRefusedWithARetryHintAndCounted) {
  global_scheduler::QuotaOptions quotas;
  quotas.tenants["capped"] = {.advisories_per_s = 0.001, .advisory_burst = 1};
  Start(/*advise_threads=*/1, /*advise_queue=*/1, quotas);
  v1::AdviseRequest req;
  req.set_session_id("s1");
  req.set_model("m");
  v1::AdviseResponse resp;
  // A quota refusal is counted under its own reason.
  req.set_tenant("capped");
  for (int i = 0; i < 2; ++i) {
    grpc::ClientContext ctx;
    const grpc::Status st = front_.stub->Advise(&ctx, req, &resp);
    EXPECT_EQ(st.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED, i == 1)
        << st.error_message();
  }
  req.clear_tenant();

  node_.Close();
  advisories_.Send(front_.stub.get(), "s1");
  ASSERT_TRUE(node_.AwaitWaiting(1));  // the one thread is blocked
  advisories_.Send(front_.stub.get(), "s1");
  ASSERT_TRUE(front_.service->advisories().AwaitPending(2, absl::Seconds(10)));  // and one waits

  grpc::ClientContext ctx;
  const grpc::Status full = front_.stub->Advise(&ctx, req, &resp);
  EXPECT_EQ(full.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(full.error_message().find("retry in 250 ms (scheduler.advise_queue)"),
            std::string::npos)
      << full.error_message();
  const auto& md = ctx.GetServerTrailingMetadata();
  auto hint = md.find("retry-after-ms");
  ASSERT_NE(hint, md.end());
  EXPECT_EQ(std::string(hint->second.data(), hint->second.size()), "250");
  const std::string scraped = Scrape();
  EXPECT_NE(scraped.find("ballast_scheduler_rejections_total{reason=\"advise_queue_full\","
                         "tenant=\"default\"} 1"),
            std::string::npos)
      << scraped;
  EXPECT_NE(scraped.find("ballast_scheduler_rejections_total{reason=\"advise_quota\","
                         "tenant=\"other\"} 1"),
            std::string::npos)
      << scraped;

  node_.Open();
  EXPECT_EQ(advisories_.AwaitAllOk(), 2);  // the admitted ones are served
  grpc::ClientContext again;
  const grpc::Status st = front_.stub->Advise(&again, req, &resp);  // room again
  EXPECT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(resp.node_id(), "n1");
  EXPECT_EQ(resp.prefetched_tokens(), 2);  // the session's prompt and output
}

}  // namespace
}  // namespace ballast::server
