// Scheduler routing: validation, session affinity, waiting for a replica,
// and the control loop's dead-node handling. No node is contacted: routes
// are only decided (stubs connect lazily).
#include "global_scheduler/scheduler.h"

#include <atomic>
#include <functional>
#include <limits>
#include <thread>

#include "absl/synchronization/notification.h"
#include "global_scheduler/request_validation.h"
#include "gtest/gtest.h"

namespace ballast::global_scheduler {
namespace {

v1::RegisterNodeRequest Node(const std::string& id, const std::string& model) {
  v1::RegisterNodeRequest r;
  r.set_node_id(id);
  r.set_address("127.0.0.1:1");
  auto* m = r.add_models();
  m->set_name(model);
  m->set_state(v1::MODEL_STATE_READY);
  m->set_context_window(128);
  return r;
}

v1::GenerateRequest Req(const std::string& model, const std::string& prompt, int max_tokens,
                        const std::string& session = "") {
  v1::GenerateRequest r;
  r.set_model(model);
  r.set_prompt(prompt);
  r.set_session_id(session);
  r.mutable_sampling()->set_max_tokens(max_tokens);
  return r;
}

std::unique_ptr<Scheduler> Make(absl::Duration route_wait = absl::Milliseconds(100)) {
  SchedulerOptions o;
  o.route_wait = route_wait;
  o.models = {{"m", "/models/m"}, {"n", "/models/n"}};
  return *Scheduler::Create(o);
}

const auto kNever = [] { return false; };

// Each rule of ValidateGenerateRequest, one field out of range at a time;
// the message names the field.
TEST(RequestValidation, EachRuleNamesItsField) {
  auto valid = [] {
    v1::GenerateRequest r;
    r.set_model("m");
    r.set_prompt("hi");
    r.mutable_sampling()->set_max_tokens(0);  // until the window is full
    return r;
  };
  EXPECT_TRUE(ValidateGenerateRequest(valid(), 128).ok());
  struct Case {
    std::function<void(v1::GenerateRequest*)> mutate;
    std::string field;
  };
  const std::vector<Case> cases = {
      {[](auto* r) { r->clear_prompt(); }, "prompt"},
      {[](auto* r) { r->add_messages()->set_role("user"); }, "not both"},
      {[](auto* r) {
         r->clear_prompt();
         r->add_messages()->set_content("no role");
       },
       "messages[0].role"},
      {[](auto* r) { r->mutable_sampling()->set_max_tokens(128); }, "context window"},
      {[](auto* r) { r->mutable_sampling()->set_temperature(-1); }, "temperature"},
      {[](auto* r) { r->mutable_sampling()->set_top_k(-1); }, "top_k"},
      {[](auto* r) { r->mutable_sampling()->set_min_p(1.5f); }, "min_p"},
      {[](auto* r) { r->mutable_sampling()->set_presence_penalty(2.5f); }, "presence_penalty"},
      {[](auto* r) { r->mutable_sampling()->set_frequency_penalty(-3); }, "frequency_penalty"},
      {[](auto* r) { r->mutable_sampling()->set_repetition_penalty(11); }, "repetition_penalty"},
      {[](auto* r) { r->mutable_sampling()->set_top_logprobs(21); }, "top_logprobs"},
      {[](auto* r) { r->mutable_sampling()->set_top_logprobs(2); }, "logprobs = true"},
  };
  for (const Case& c : cases) {
    v1::GenerateRequest r = valid();
    c.mutate(&r);
    const absl::Status st = ValidateGenerateRequest(r, 128);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_NE(st.message().find(c.field), std::string::npos) << st.message();
  }
  v1::GenerateRequest chat = valid();
  chat.clear_prompt();
  chat.add_messages()->set_role("user");
  chat.mutable_sampling()->set_logprobs(true);
  chat.mutable_sampling()->set_top_logprobs(20);
  chat.mutable_sampling()->set_repetition_penalty(0);  // off
  EXPECT_TRUE(ValidateGenerateRequest(chat, 128).ok());
}

// NaN passes every range comparison: each float field must be finite.
TEST(RequestValidation, RefusesNonFiniteFloats) {
  const float bad[] = {std::numeric_limits<float>::quiet_NaN(),
                       std::numeric_limits<float>::infinity(),
                       -std::numeric_limits<float>::infinity()};
  using Setter = void (v1::SamplingParams::*)(float);
  const std::vector<std::pair<Setter, std::string>> fields = {
      {&v1::SamplingParams::set_temperature, "temperature"},
      {&v1::SamplingParams::set_top_p, "top_p"},
      {&v1::SamplingParams::set_min_p, "min_p"},
      {&v1::SamplingParams::set_presence_penalty, "presence_penalty"},
      {&v1::SamplingParams::set_frequency_penalty, "frequency_penalty"},
      {&v1::SamplingParams::set_repetition_penalty, "repetition_penalty"},
  };
  for (const auto& [set, field] : fields) {
    for (float v : bad) {
      v1::GenerateRequest r;
      r.set_model("m");
      r.set_prompt("hi");
      (r.mutable_sampling()->*set)(v);
      const absl::Status st = ValidateGenerateRequest(r, 128);
      EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << field << " " << v;
      EXPECT_NE(st.message().find(field), std::string::npos) << st.message();
    }
  }
}

TEST(RequestValidation, BoundsSessionIdLength) {
  v1::GenerateRequest r;
  r.set_model("m");
  r.set_prompt("hi");
  r.set_session_id(std::string(kMaxSessionIdLength, 's'));
  EXPECT_TRUE(ValidateGenerateRequest(r, 128).ok());
  r.set_session_id(std::string(kMaxSessionIdLength + 1, 's'));
  const absl::Status st = ValidateGenerateRequest(r, 128);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("session_id"), std::string::npos) << st.message();
}

// The control tick expires idle sessions: the next turn says the history
// is gone instead of starting over silently.
TEST(Scheduler, IdleSessionsExpireAtTheControlTick) {
  absl::Time now = absl::FromUnixSeconds(1000);
  SchedulerOptions o;
  o.models = {{"m", "/models/m"}};
  o.route_wait = absl::Milliseconds(100);
  o.session_ttl = absl::Minutes(30);
  auto s = *Scheduler::Create(o, [&now] { return now; });
  ASSERT_TRUE(s->RegisterNode(Node("a", "m")).ok());
  auto r1 = s->RouteRequest(Req("m", "hi", 4, "s1"), kNever);
  ASSERT_TRUE(r1.ok()) << r1.status();
  v1::NodeFinal f1;
  f1.add_prompt_tokens(1);
  EXPECT_TRUE(s->Complete(*r1, &f1).ok());
  EXPECT_EQ(s->sessions().size(), 1);
  now += absl::Minutes(31);
  s->RunControlTick();
  auto r2 = s->RouteRequest(Req("m", "more", 4, "s1"), kNever);
  EXPECT_EQ(r2.status().code(), absl::StatusCode::kDataLoss) << r2.status();
  now += absl::Minutes(31);
  s->RunControlTick();
  EXPECT_EQ(s->sessions().size(), 0);
}

TEST(Scheduler, BoundsSessionsAndModelNames) {
  SchedulerOptions o;
  o.models = {{"m", "/models/m"}};
  o.route_wait = absl::Milliseconds(100);
  o.max_sessions = 1;
  auto s = *Scheduler::Create(o);
  ASSERT_TRUE(s->RegisterNode(Node("a", "m")).ok());
  auto r1 = s->RouteRequest(Req("m", "hi", 4, "s1"), kNever);
  ASSERT_TRUE(r1.ok()) << r1.status();
  auto r2 = s->RouteRequest(Req("m", "hi", 4, "s2"), kNever);
  EXPECT_EQ(r2.status().code(), absl::StatusCode::kResourceExhausted) << r2.status();
  // A huge unknown model name is refused without echoing it back.
  auto big = s->RouteRequest(Req(std::string(100000, 'x'), "hi", 4), kNever);
  EXPECT_EQ(big.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_LT(big.status().message().size(), 300u);
}

TEST(Scheduler, RejectsBadRequestsWithActionableCodes) {
  auto s = Make();
  ASSERT_TRUE(s->RegisterNode(Node("a", "m")).ok());
  EXPECT_EQ(s->RouteRequest(Req("nope", "hi", 4), kNever).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(s->RouteRequest(Req("m", "", 4), kNever).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s->RouteRequest(Req("m", "hi", -1), kNever).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s->RouteRequest(Req("m", "hi", 500), kNever).status().code(),
            absl::StatusCode::kInvalidArgument);  // context window 128 reported by the node
  auto bad = Req("m", "hi", 4);
  bad.mutable_sampling()->set_top_p(1.5f);
  EXPECT_EQ(s->RouteRequest(bad, kNever).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(Scheduler, NoReplicaMeansUnavailableAfterTheWait) {
  auto s = Make(absl::Milliseconds(50));
  auto r = s->RouteRequest(Req("n", "hi", 4), kNever);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(r.status().message().find("no live replica"), std::string::npos);
}

TEST(Scheduler, SessionsStickToTheirNodeUntilItDies) {
  absl::Time now = absl::FromUnixSeconds(1000);
  SchedulerOptions o;
  o.models = {{"m", "/models/m"}};
  o.heartbeat_timeout = absl::Milliseconds(300);
  o.heartbeat_interval = absl::Milliseconds(100);
  o.route_wait = absl::Milliseconds(100);
  auto s = *Scheduler::Create(o, [&now] { return now; });
  ASSERT_TRUE(s->RegisterNode(Node("a", "m")).ok());
  ASSERT_TRUE(s->RegisterNode(Node("b", "m")).ok());
  auto r1 = s->RouteRequest(Req("m", "hi", 4, "s1"), kNever);
  ASSERT_TRUE(r1.ok());
  EXPECT_EQ(r1->node_id, "a");
  v1::NodeFinal f1;
  for (int t : {256, int{'h'}, int{'i'}}) f1.add_prompt_tokens(t);
  for (int t : {7, 8}) f1.add_output_tokens(t);
  EXPECT_TRUE(s->Complete(*r1, &f1).ok());
  // Load on a: a session-less request goes to b, the session stays on a.
  auto busy = s->RouteRequest(Req("m", "x", 4), kNever);
  ASSERT_TRUE(busy.ok());
  auto free_pick = s->RouteRequest(Req("m", "x", 4), kNever);
  EXPECT_NE(free_pick->node_id, busy->node_id);
  auto r2 = s->RouteRequest(Req("m", "more", 4, "s1"), kNever);
  ASSERT_TRUE(r2.ok());
  EXPECT_EQ(r2->node_id, "a");
  EXPECT_EQ(r2->history, (std::vector<int>{256, 'h', 'i', 7, 8}));
  const v1::NodeFinal empty;
  EXPECT_TRUE(s->Complete(*r2, nullptr).ok());
  EXPECT_TRUE(s->Complete(*busy, &empty).ok());
  EXPECT_TRUE(s->Complete(*free_pick, &empty).ok());
  // Only b heartbeats; at the next tick a is declared dead and the session
  // moves to b.
  for (int i = 0; i < 10; ++i) {
    now += absl::Milliseconds(60);
    v1::HeartbeatRequest hb;
    hb.set_node_id("b");
    *hb.add_models() = Node("b", "m").models(0);
    EXPECT_FALSE(s->Heartbeat(hb).reregister());
    s->RunControlTick();
  }
  EXPECT_FALSE(s->cluster().IsAlive("a"));
  auto r3 = s->RouteRequest(Req("m", "again", 4, "s1"), kNever);
  ASSERT_TRUE(r3.ok());
  EXPECT_EQ(r3->node_id, "b");
  EXPECT_EQ(r3->history.size(), 5u);  // history survives the node
  EXPECT_TRUE(s->Complete(*r3, &empty).ok());
  v1::HeartbeatRequest hb;
  hb.set_node_id("a");
  EXPECT_TRUE(s->Heartbeat(hb).reregister());
  s->Stop();
}

// A request waiting for a replica wakes when one registers (the routing
// version changes), not at the end of its wait.
TEST(Scheduler, AWaitingRequestWakesWhenAReplicaAppears) {
  auto s = Make(absl::Seconds(60));
  absl::StatusOr<Route> r;
  absl::Notification done;
  std::thread t([&] {
    r = s->RouteRequest(Req("n", "hi", 4), kNever);
    done.Notify();
  });
  EXPECT_FALSE(done.WaitForNotificationWithTimeout(absl::Milliseconds(50)));
  ASSERT_TRUE(s->RegisterNode(Node("a", "n")).ok());
  EXPECT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  t.join();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->node_id, "a");
}

// A cancelled request stops waiting.
TEST(Scheduler, ACancelledRequestStopsWaiting) {
  auto s = Make(absl::Seconds(60));
  std::atomic<bool> cancelled{false};
  absl::StatusOr<Route> r;
  std::thread t([&] { r = s->RouteRequest(Req("n", "hi", 4), [&] { return cancelled.load(); }); });
  cancelled = true;
  t.join();  // within the 250 ms cancellation bound, not the 60 s wait
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
}

TEST(Scheduler, ListModelsShowsReplicasAndState) {
  auto s = Make();
  ASSERT_TRUE(s->RegisterNode(Node("a", "m")).ok());
  auto list = s->ListModels();
  ASSERT_EQ(list.models_size(), 2);
  EXPECT_EQ(list.models(0).name(), "m");
  ASSERT_EQ(list.models(0).replicas_size(), 1);
  EXPECT_EQ(list.models(0).replicas(0).node_id(), "a");
  EXPECT_EQ(list.models(1).replicas_size(), 0);
  EXPECT_EQ(s->GetClusterState().nodes_size(), 1);
}

}  // namespace
}  // namespace ballast::global_scheduler
