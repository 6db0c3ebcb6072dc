// The scheduler's control loop against fake nodes (in-process gRPC servers
// on loopback that record the calls they get): typed pending operations,
// the drain timeout passed along, a bounded pool for node calls, per-device
// placement, and no eviction when a node dies. The control loop is driven
// tick by tick on an injected clock; nothing sleeps to let time pass.
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <memory>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "ballast/v1/node.grpc.pb.h"
#include "global_scheduler/scheduler.h"
#include "gtest/gtest.h"
#include "tests/unit/global_scheduler/fake_clock.h"
#include "tests/unit/global_scheduler/fake_node.h"

namespace ballast::global_scheduler {
namespace {

// "evict:x" is a model name like any other: loading it and evicting x on
// the same node are two operations (once a string key made them collide).
TEST(SchedulerControl, AModelNamedLikeAnEvictionIsStillAModel) {
  FakeNode fake;
  fake.Close();
  FakeClock clock;
  SchedulerOptions o;
  o.models = {{"evict:x", "/models/x"}};
  auto s = *Scheduler::Create(o, clock.fn());
  ASSERT_TRUE(s->RegisterNode(NodeAt("a", fake, {"cpu:0"}, {{"x", "cpu:0"}}))
                  .ok());  // x: not in the catalogue
  s->RunControlTick();
  ASSERT_TRUE(fake.AwaitCalls(1, 1));
  EXPECT_EQ(fake.loads()[0].first, "evict:x");
  EXPECT_EQ(fake.evicts()[0].model, "x");
  fake.Open();
  s->Stop();
}

// A restarted scheduler loads no replica of a model without requests
// during the startup grace (its nodes may still hold replicas and not have
// re-registered); a request loads its model at once; after the grace the
// rest load.
TEST(SchedulerControl, StartupGraceWaitsForNodesToReRegister) {
  FakeNode fake;
  FakeClock clock;
  SchedulerOptions o;
  o.startup_grace = absl::Seconds(3);
  o.route_wait = absl::Milliseconds(1);
  o.models = {{"quiet", "/models/q"}, {"asked", "/models/a"}};
  auto s = *Scheduler::Create(o, clock.fn());
  ASSERT_TRUE(s->RegisterNode(NodeAt("a", fake, {"cpu:0"})).ok());
  s->RunControlTick();
  clock.now += absl::Seconds(1);
  s->RunControlTick();
  EXPECT_TRUE(fake.loads().empty());
  v1::GenerateRequest req;
  req.set_model("asked");
  req.set_prompt("hi");
  EXPECT_FALSE(s->RouteRequest(req, [] { return false; }).ok());  // no replica yet
  s->RunControlTick();
  ASSERT_TRUE(fake.AwaitCalls(1, 0));
  EXPECT_EQ(fake.loads()[0].first, "asked");
  clock.now += absl::Seconds(2);  // the grace is over
  s->RunControlTick();
  ASSERT_TRUE(fake.AwaitCalls(2, 0));
  EXPECT_EQ(fake.loads()[1].first, "quiet");
  s->Stop();
}

// A node that comes back holding a replica loaded with other weights than
// the catalogue lists (here: full precision where fp8 is listed) loses it;
// a replica that matches is kept.
TEST(SchedulerControl, AReplicaWithAnotherQuantizationIsEvicted) {
  FakeNode fake;
  SchedulerOptions o;
  o.models = {{"fp8", "/models/a"}, {"full", "/models/b"}};
  o.models[0].quantization = "fp8";
  auto s = *Scheduler::Create(o);
  v1::RegisterNodeRequest node =
      NodeAt("a", fake, {"cpu:0"}, {{"fp8", "cpu:0"}, {"full", "cpu:0"}});
  node.mutable_models(0)->set_quantization("none");
  ASSERT_TRUE(s->RegisterNode(node).ok());
  s->RunControlTick();
  ASSERT_TRUE(fake.AwaitCalls(0, 1));
  s->Stop();
  const auto evicts = fake.evicts();
  ASSERT_EQ(evicts.size(), 1u);
  EXPECT_EQ(evicts[0].model, "fp8");
}

// A request parked for a replica (no thread held) learns at once that its
// model's load failed permanently: the failure changes the routing
// version, so it does not wait out route_wait.
TEST(SchedulerControl, APermanentLoadFailureWakesParkedRequests) {
  FakeNode fake;
  fake.FailLoadsWith(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "bad checkpoint"));
  FakeClock clock;
  SchedulerOptions o;
  o.route_wait = absl::Minutes(5);
  o.models = {{"m", "/models/m"}};
  auto s = *Scheduler::Create(o, clock.fn());
  ASSERT_TRUE(s->RegisterNode(NodeAt("a", fake, {"cpu:0"})).ok());
  v1::GenerateRequest req;
  req.set_model("m");
  req.set_prompt("hi");
  PendingRoute pending;
  ASSERT_TRUE(s->BeginRoute(req, "", &pending).ok());
  auto first = s->TryRoute(req, &pending, false);
  ASSERT_TRUE(first.ok() && !first->has_value());
  absl::Notification woken;
  s->AwaitReplica(
      pending, [] { return false; }, [&] { woken.Notify(); });
  s->RunControlTick();  // the load fails permanently
  ASSERT_TRUE(woken.WaitForNotificationWithTimeout(absl::Seconds(10)));
  auto again = s->TryRoute(req, &pending, false);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition) << again.status();
  s->Stop();
}

TEST(SchedulerControl, RejectsModelNamesOutsideTheDocumentedSet) {
  SchedulerOptions o;
  auto s = *Scheduler::Create(o);
  for (const char* bad : {"", " x", "a b", "x\n", "-x", "../etc", "x;rm"}) {
    EXPECT_EQ(s->RegisterModel({bad, "/m"}).code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_EQ(s->RegisterModel({std::string(129, 'a'), "/m"}).code(),
            absl::StatusCode::kInvalidArgument);
  for (const char* good : {"meta-llama/Llama-3.1-8B", "qwen:7b-fp8", "m_1.v2"}) {
    EXPECT_TRUE(s->RegisterModel({good, "/m"}).ok()) << good;
  }
}

// A migration drains the source for scheduler.drain_timeout, sent with the
// call, and the call's deadline is that plus the margin (no hidden
// dependence on the node's default).
TEST(SchedulerControl, DrainingEvictionCarriesTheConfiguredTimeout) {
  FakeNode a, b;
  FakeClock clock;
  SchedulerOptions o;
  o.models = {{"m", "/models/m"}};
  o.drain_timeout = absl::Milliseconds(1234);
  o.evict_rpc_margin = absl::Seconds(5);
  auto s = *Scheduler::Create(o, clock.fn());
  ASSERT_TRUE(s->RegisterNode(NodeAt("a", a, {"cpu:0"}, {{"m", "cpu:0"}})).ok());
  ASSERT_TRUE(s->RegisterNode(NodeAt("b", b)).ok());
  ASSERT_TRUE(s->MigrateModel("m", "a", "b").ok());
  ASSERT_TRUE(b.AwaitCalls(1, 0));
  // The load answered READY; the next ticks see it and drain the source.
  for (int i = 0; i < 200 && a.evicts().empty(); ++i) {
    s->RunControlTick();
    a.AwaitCalls(0, 1, absl::Milliseconds(50));
  }
  ASSERT_EQ(a.evicts().size(), 1u);
  const FakeNode::Evict e = a.evicts()[0];
  EXPECT_TRUE(e.drain);
  EXPECT_EQ(e.drain_timeout_ms, 1234u);
  EXPECT_GT(e.deadline_left, absl::Seconds(5));
  EXPECT_LE(e.deadline_left, absl::Milliseconds(6234 + 100));  // gRPC rounds deadlines
  s->Stop();
}

// Node calls run on control_threads threads, however many are due.
TEST(SchedulerControl, NodeCallsRunOnABoundedPool) {
  FakeNode fake;
  fake.Close();
  FakeClock clock;
  SchedulerOptions o;
  o.control_threads = 2;
  for (int i = 0; i < 6; ++i) o.models.push_back({absl::StrCat("m", i), "/models/m"});
  auto s = *Scheduler::Create(o, clock.fn());
  auto node = NodeAt("a", fake);
  node.mutable_devices(0)->set_memory_total_bytes(1 << 30);
  ASSERT_TRUE(s->RegisterNode(node).ok());
  s->RunControlTick();  // six loads due at once
  ASSERT_TRUE(fake.AwaitRunning(2));
  absl::SleepFor(absl::Milliseconds(100));  // room for a third to start, were it allowed
  EXPECT_EQ(fake.peak(), 2);
  fake.Open();
  ASSERT_TRUE(fake.AwaitCalls(6, 0));
  s->Stop();
  EXPECT_EQ(fake.peak(), 2);
}

// Placement is per GPU: the load goes to the node's empty device.
TEST(SchedulerControl, LoadsGoToADeviceNotJustANode) {
  FakeNode fake;
  FakeClock clock;
  SchedulerOptions o;
  o.models = {{"new", "/models/new"}};
  auto s = *Scheduler::Create(o, clock.fn());
  auto node = NodeAt("a", fake, {"cuda:0", "cuda:1"}, {{"old", "cuda:0"}});
  node.mutable_devices(0)->set_memory_used_bytes(600);
  ASSERT_TRUE(s->RegisterNode(node).ok());
  ASSERT_TRUE(s->RegisterModel({"old", "/models/old"}).ok());
  s->RunControlTick();
  ASSERT_TRUE(fake.AwaitCalls(1, 0));
  EXPECT_EQ(fake.loads()[0], (std::pair<std::string, std::string>{"new", "cuda:1"}));
  s->Stop();
}

// When a node dies, a model that wants more replicas than there are live
// nodes is not a model that lacks room: nothing healthy is evicted for it.
TEST(SchedulerControl, ANodeDeathEvictsNothingElsewhere) {
  FakeNode a, b;
  FakeClock clock;
  SchedulerOptions o;
  o.idle_evict_after = absl::Seconds(1);
  o.heartbeat_timeout = absl::Seconds(3);
  ModelSpec wide{"wide", "/models/wide"};
  wide.replicas = 2;
  o.models = {wide, {"idle", "/models/idle"}};
  auto s = *Scheduler::Create(o, clock.fn());
  ASSERT_TRUE(
      s->RegisterNode(NodeAt("a", a, {"cpu:0"}, {{"wide", "cpu:0"}, {"idle", "cpu:0"}})).ok());
  ASSERT_TRUE(s->RegisterNode(NodeAt("b", b, {"cpu:0"}, {{"wide", "cpu:0"}})).ok());
  clock.now += absl::Seconds(5);  // b stops heartbeating; idle is idle
  v1::HeartbeatRequest hb;
  hb.set_node_id("a");
  *hb.mutable_models() = NodeAt("a", a, {"cpu:0"}, {{"wide", "cpu:0"}, {"idle", "cpu:0"}}).models();
  *hb.mutable_devices() = NodeAt("a", a).devices();
  ASSERT_FALSE(s->Heartbeat(hb).reregister());
  for (int i = 0; i < 3; ++i) s->RunControlTick();
  EXPECT_FALSE(s->cluster().IsAlive("b"));
  EXPECT_TRUE(a.evicts().empty());
  s->Stop();
}

// Whether `cond` holds within `limit` (checked every millisecond).
bool Eventually(const std::function<bool()>& cond, absl::Duration limit) {
  const absl::Time end = absl::Now() + limit;
  while (!cond()) {
    if (absl::Now() >= end) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

v1::ModelInfo InfoOf(const Scheduler& s, const std::string& model) {
  const v1::ListModelsResponse list = s.ListModels();
  for (const auto& m : list.models()) {
    if (m.name() == model) return m;
  }
  return {};
}

v1::GenerateRequest Request(const std::string& model) {
  v1::GenerateRequest r;
  r.set_model(model);
  r.set_prompt("hi");
  r.mutable_sampling()->set_max_tokens(4);
  return r;
}

// A model's serving options reach the node's LoadModel as registered:
// kv_dtype, quantization, KV floor/limit; ListModels shows them.
TEST(SchedulerControl, LoadsCarryTheModelsServingOptions) {
  FakeNode fake;
  FakeClock clock;
  SchedulerOptions o;
  ModelSpec q{"q", "/models/q"};
  q.kv_dtype = "fp8_e4m3";
  q.quantization = "fp8";
  q.kv_floor_bytes = 1 << 20;
  o.models = {q};
  auto s = *Scheduler::Create(o, clock.fn());
  ASSERT_TRUE(s->RegisterNode(NodeAt("a", fake)).ok());
  s->RunControlTick();
  ASSERT_TRUE(fake.AwaitCalls(1, 0));
  const v1::LoadModelRequest req = fake.load_requests()[0];
  EXPECT_EQ(req.name(), "q");
  EXPECT_EQ(req.kv_dtype(), "fp8_e4m3");
  EXPECT_EQ(req.quantization(), "fp8");
  EXPECT_EQ(req.kv_floor_bytes(), 1 << 20);
  const v1::ModelInfo info = InfoOf(*s, "q");
  EXPECT_EQ(info.kv_dtype(), "fp8_e4m3");
  EXPECT_EQ(info.quantization(), "fp8");
  s->Stop();
}

// A load refused for a permanent reason marks the model FAILED with the
// reason; requests fail at once with FAILED_PRECONDITION; nothing retries
// until the model is registered again.
TEST(SchedulerControl, APermanentLoadFailureIsFailedNotRetried) {
  FakeNode fake;
  fake.FailLoadsWith(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "head_dim 80 unsupported"));
  FakeClock clock;
  SchedulerOptions o;
  o.models = {{"odd", "/models/odd"}};
  o.route_wait = absl::Seconds(60);
  o.heartbeat_timeout = absl::Hours(10);  // the fake node never heartbeats
  auto s = *Scheduler::Create(o, clock.fn());
  ASSERT_TRUE(s->RegisterNode(NodeAt("a", fake)).ok());
  s->RunControlTick();
  ASSERT_TRUE(fake.AwaitCalls(1, 0));
  ASSERT_TRUE(Eventually([&] { return InfoOf(*s, "odd").state() == v1::MODEL_STATE_FAILED; },
                         absl::Seconds(10)));
  EXPECT_NE(InfoOf(*s, "odd").last_error().find("head_dim 80"), std::string::npos);
  const absl::Time t0 = absl::Now();
  auto r = s->RouteRequest(Request("odd"), [] { return false; });
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("head_dim 80"), std::string::npos);
  EXPECT_LT(absl::Now() - t0, absl::Seconds(5));  // not the 60 s route wait
  for (int i = 0; i < 5; ++i) {
    clock.now += absl::Minutes(10);
    s->RunControlTick();
  }
  EXPECT_EQ(fake.loads().size(), 1u) << "a permanent failure was retried";
  // Registering it again retries it.
  fake.FailLoadsWith(grpc::Status::OK);
  ASSERT_TRUE(s->RegisterModel({"odd", "/models/odd"}).ok());
  s->RunControlTick();
  ASSERT_TRUE(fake.AwaitCalls(2, 0));
  ASSERT_TRUE(Eventually([&] { return InfoOf(*s, "odd").state() == v1::MODEL_STATE_READY; },
                         absl::Seconds(10)));
  s->Stop();
}

// A transient failure retries after load_retry, then twice that.
TEST(SchedulerControl, ATransientLoadFailureRetriesWithBackoff) {
  FakeNode fake;
  fake.FailLoadsWith(grpc::Status(grpc::StatusCode::UNAVAILABLE, "node busy"));
  FakeClock clock;
  SchedulerOptions o;
  o.models = {{"m", "/models/m"}};
  o.load_retry = absl::Seconds(10);
  o.heartbeat_timeout = absl::Hours(10);  // the fake node never heartbeats
  auto s = *Scheduler::Create(o, clock.fn());
  ASSERT_TRUE(s->RegisterNode(NodeAt("a", fake)).ok());
  auto tick_and_count = [&](absl::Duration advance) {
    clock.now += advance;
    s->RunControlTick();
    fake.AwaitCalls(fake.loads().size() + 1, 0, absl::Milliseconds(200));
    // Let the failed call record its error before the clock moves on (the
    // model stops LOADING once it has).
    Eventually([&] { return InfoOf(*s, "m").state() != v1::MODEL_STATE_LOADING; },
               absl::Seconds(5));
    return fake.loads().size();
  };
  EXPECT_EQ(tick_and_count(absl::ZeroDuration()), 1u);
  EXPECT_EQ(tick_and_count(absl::Seconds(9)), 1u);   // backing off
  EXPECT_EQ(tick_and_count(absl::Seconds(1)), 2u);   // 10 s: retried
  EXPECT_EQ(tick_and_count(absl::Seconds(19)), 2u);  // now 20 s
  EXPECT_EQ(tick_and_count(absl::Seconds(1)), 3u);
  EXPECT_NE(InfoOf(*s, "m").state(), v1::MODEL_STATE_FAILED);
  s->Stop();
}

// A cluster where node b held "big" (900 of 1000 bytes) and died, and node
// a holds two idle models (100 each): big's weights seem not to fit on a.
struct BigOnADeadNode {
  FakeNode a, b;
  FakeClock clock;
  std::unique_ptr<Scheduler> s;

  BigOnADeadNode() {
    SchedulerOptions o;
    o.idle_evict_after = absl::Seconds(1);
    o.heartbeat_timeout = absl::Seconds(3);
    o.models = {{"big", "/models/big"}, {"idle1", "/models/idle1"}, {"idle2", "/models/idle2"}};
    s = *Scheduler::Create(o, clock.fn());
    EXPECT_TRUE(s->RegisterNode(A()).ok());
    v1::RegisterNodeRequest on_b = NodeAt("b", b, {"cpu:0"}, {{"big", "cpu:0"}});
    on_b.mutable_models(0)->set_weight_bytes(900);
    EXPECT_TRUE(s->RegisterNode(on_b).ok());
    clock.now += absl::Seconds(5);  // b stops heartbeating; idle1 and idle2 are idle
    v1::HeartbeatRequest hb;
    hb.set_node_id("a");
    *hb.mutable_models() = A().models();
    *hb.mutable_devices() = A().devices();
    EXPECT_FALSE(s->Heartbeat(hb).reregister());
  }
  v1::RegisterNodeRequest A() const {
    return NodeAt("a", a, {"cpu:0"}, {{"idle1", "cpu:0"}, {"idle2", "cpu:0"}});
  }
};

// Eviction for room only after a node refused a load for room: a node's
// death and a guess from reported memory are not enough.
TEST(SchedulerControl, EvictsForRoomOnlyAfterALoadIsRefusedForRoom) {
  BigOnADeadNode c;
  c.s->RunControlTick();  // b is dead: big is loaded on a, nothing evicted
  ASSERT_TRUE(c.a.AwaitCalls(1, 0));
  ASSERT_TRUE(Eventually([&] { return InfoOf(*c.s, "big").state() == v1::MODEL_STATE_READY; },
                         absl::Seconds(10)));
  for (int i = 0; i < 3; ++i) c.s->RunControlTick();
  EXPECT_TRUE(c.a.evicts().empty());
  c.s->Stop();
}

TEST(SchedulerControl, ALoadRefusedForRoomEvictsAnIdleModel) {
  BigOnADeadNode c;
  c.a.FailLoadsWith(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "no room"));
  c.s->RunControlTick();
  ASSERT_TRUE(c.a.AwaitCalls(1, 0));
  ASSERT_TRUE(
      Eventually([&] { return !InfoOf(*c.s, "big").last_error().empty(); }, absl::Seconds(10)));
  EXPECT_TRUE(c.a.evicts().empty());
  // Refused for room: now an idle model goes. The load records its error
  // a moment before it leaves the pending loads, and a tick in between
  // still waits for it (a full 2-core ctest once caught one there), so
  // tick until the eviction is asked.
  ASSERT_TRUE(Eventually(
      [&] {
        c.s->RunControlTick();
        return c.a.AwaitCalls(1, 1, absl::Milliseconds(50));
      },
      absl::Seconds(10)));
  EXPECT_TRUE(c.a.evicts()[0].drain);
  c.s->Stop();
}

// Node "a" reports `models` on one cpu:0 of 1000 bytes with `kv_free`
// bytes of KV room and 4 requests queued.
void Beat(Scheduler* s, const FakeNode& fake, const std::vector<std::string>& models,
          int64_t kv_free, bool elastic) {
  std::vector<std::pair<std::string, std::string>> on;
  for (const auto& m : models) on.push_back({m, "cpu:0"});
  v1::HeartbeatRequest hb;
  hb.set_node_id("a");
  *hb.mutable_models() = NodeAt("a", fake, {"cpu:0"}, on).models();
  v1::DeviceState* d = hb.add_devices();
  d->set_name("cpu:0");
  d->set_memory_total_bytes(1000);
  d->set_memory_used_bytes(1000 - kv_free);
  d->set_kv_bytes_free(kv_free);
  d->set_queue_length(4);
  d->set_elastic(elastic);
  ASSERT_FALSE(s->Heartbeat(hb).reregister());
}

v1::ModelState ReplicaState(const Scheduler& s, const std::string& model) {
  const v1::ModelInfo info = InfoOf(s, model);
  return info.replicas_size() ? info.replicas(0).state() : v1::MODEL_STATE_UNSPECIFIED;
}

// Requests queue on an elastic device whose memory is all weights: an idle
// model there is evicted (draining) so the busy one's KV can grow, and it
// stays evicted (not reloaded) until a request wants it. One eviction per
// heartbeat that still shows the pressure, and never a model with requests
// in flight. The same device with static pools, or with room, evicts
// nothing.
TEST(SchedulerControl, RequestsStarvedOfKvEvictAnIdleModelOnAnElasticDevice) {
  const std::vector<std::string> all = {"busy", "idle1", "idle2"};
  for (const bool elastic : {false, true}) {
    for (const int64_t kv_free : {400, 10}) {
      FakeNode fake;
      FakeClock clock;
      SchedulerOptions o;
      o.idle_evict_after = absl::Seconds(5);
      o.models = {{"busy", "/m/busy"}, {"idle1", "/m/idle1"}, {"idle2", "/m/idle2"}};
      auto s = *Scheduler::Create(o, clock.fn());
      ASSERT_TRUE(
          s->RegisterNode(NodeAt("a", fake, {"cpu:0"},
                                 {{"busy", "cpu:0"}, {"idle1", "cpu:0"}, {"idle2", "cpu:0"}}))
              .ok());
      clock.now += absl::Seconds(10);
      Beat(s.get(), fake, all, kv_free, elastic);
      auto route = s->RouteRequest(Request("busy"), [] { return false; });  // in flight
      ASSERT_TRUE(route.ok()) << route.status();
      s->RunControlTick();
      if (!(elastic && kv_free == 10)) {
        for (const auto& m : all) EXPECT_EQ(ReplicaState(*s, m), v1::MODEL_STATE_READY) << m;
        EXPECT_TRUE(s->Complete(*route, nullptr).ok());
        s->Stop();
        continue;
      }
      // idle1 and idle2 tie on idle time and size: the lower name goes.
      ASSERT_TRUE(fake.AwaitCalls(0, 1));
      EXPECT_EQ(fake.evicts()[0].model, "idle1");
      EXPECT_TRUE(fake.evicts()[0].drain);
      EXPECT_TRUE(Eventually([&] { return InfoOf(*s, "idle1").state() == v1::MODEL_STATE_EVICTED; },
                             absl::Seconds(10)));
      // No heartbeat since the eviction: nothing more goes, nothing reloads.
      s->RunControlTick();
      s->RunControlTick();
      EXPECT_EQ(ReplicaState(*s, "idle2"), v1::MODEL_STATE_READY);
      EXPECT_EQ(InfoOf(*s, "idle1").state(), v1::MODEL_STATE_EVICTED);
      // A later heartbeat still starved: the next idle model goes.
      clock.now += absl::Seconds(1);
      Beat(s.get(), fake, {"busy", "idle2"}, kv_free, elastic);
      s->RunControlTick();
      ASSERT_TRUE(fake.AwaitCalls(0, 2));
      EXPECT_EQ(fake.evicts()[1].model, "idle2");
      ASSERT_TRUE(Eventually([&] { return InfoOf(*s, "idle2").state() == v1::MODEL_STATE_EVICTED; },
                             absl::Seconds(10)));
      // busy's request is still in flight long past the threshold: kept.
      clock.now += absl::Seconds(30);
      Beat(s.get(), fake, {"busy"}, kv_free, elastic);
      s->RunControlTick();
      EXPECT_EQ(ReplicaState(*s, "busy"), v1::MODEL_STATE_READY);
      EXPECT_TRUE(s->Complete(*route, nullptr).ok());
      s->Stop();
    }
  }
}

// A node that comes back with a model already reloaded elsewhere: the
// extra replica is drained (not dropped) down to the catalogue's count.
TEST(SchedulerControl, ExtraReplicasAreDrained) {
  FakeNode a, b;
  FakeClock clock;
  SchedulerOptions o;
  o.heartbeat_timeout = absl::Hours(10);  // the fake nodes never heartbeat
  ModelSpec two{"two", "/models/two"};
  two.replicas = 2;
  o.models = {{"one", "/models/one"}, two};
  auto s = *Scheduler::Create(o, clock.fn());
  ASSERT_TRUE(
      s->RegisterNode(NodeAt("a", a, {"cpu:0"}, {{"one", "cpu:0"}, {"two", "cpu:0"}})).ok());
  ASSERT_TRUE(
      s->RegisterNode(NodeAt("b", b, {"cpu:0"}, {{"one", "cpu:0"}, {"two", "cpu:0"}})).ok());
  s->RunControlTick();
  ASSERT_TRUE(b.AwaitCalls(0, 1));
  for (int i = 0; i < 3; ++i) s->RunControlTick();  // the eviction is under way: once
  ASSERT_TRUE(
      Eventually([&] { return InfoOf(*s, "one").replicas_size() == 1; }, absl::Seconds(10)));
  ASSERT_EQ(b.evicts().size(), 1u);
  EXPECT_EQ(b.evicts()[0].model, "one");
  EXPECT_TRUE(b.evicts()[0].drain);
  EXPECT_TRUE(a.evicts().empty());
  EXPECT_TRUE(a.loads().empty());
  EXPECT_TRUE(b.loads().empty());
  s->Stop();
}

}  // namespace
}  // namespace ballast::global_scheduler
