// The device's shared queue: admission follows the arbitration policy
// across the device's models, the prefill cost model fits measured steps,
// and a request that cannot meet its TTFT SLO is served late unless it
// asked to be rejected.
#include <atomic>
#include <map>
#include <regex>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "engine/model_engine.h"
#include "gtest/gtest.h"
#include "node_manager/device_worker.h"
#include "spdlog/sinks/ostream_sink.h"
#include "spdlog/spdlog.h"
#include "tests/unit/engine/test_util.h"

namespace ballast::node_manager {
namespace {

using engine::GenerationRequest;
using engine::GenerationResult;
using engine::ModelEngine;
using engine::ModelEngineOptions;

// Records the order requests finish in.
struct Order {
  absl::Mutex mu;
  std::vector<std::string> ids;
};

struct Sink : engine::GenerationSink {
  Sink(std::string id, Order* order) : id(std::move(id)), order(order) {}
  void OnToken(int, const std::string&, const engine::TokenLogprobs*) override { ++tokens; }
  void OnDone(absl::StatusOr<GenerationResult> r) override {
    absl::MutexLock lock(&order->mu);
    result = std::move(r);
    order->ids.push_back(id);
    done = true;
  }
  std::string id;
  Order* order;
  std::atomic<int> tokens{0};
  bool done = false;
  absl::StatusOr<GenerationResult> result = absl::UnknownError("not done");
};

GenerationRequest Req(const std::string& id, int prompt, double ttft_ms, bool reject = false) {
  GenerationRequest r;
  r.id = id;
  r.prompt = {engine::ByteTokenizer::kBos};
  for (int i = 1; i < prompt; ++i) r.prompt.push_back(32 + i % 90);
  r.params.max_tokens = 4;
  r.params.ignore_eos = true;
  r.ttft_slo_ms = ttft_ms;
  r.reject_if_slo_unmet = reject;
  r.arrival = absl::Now();
  return r;
}

bool WaitAll(Order* o, size_t n) {
  const absl::Time end = absl::Now() + absl::Seconds(30);
  while (absl::Now() < end) {
    {
      absl::MutexLock lock(&o->mu);
      if (o->ids.size() >= n) return true;
    }
    absl::SleepFor(absl::Milliseconds(2));
  }
  return false;
}

std::shared_ptr<ModelEngine> Engine(const std::string& name, const std::string& path,
                                    DeviceWorker* w, bool sample_in_step = false) {
  ModelEngineOptions o;
  o.name = name;
  o.path = path;
  o.cpu_sample_in_step = sample_in_step;  // ahead steps need it
  o.max_seqs = 1;                         // one at a time: completion order = admission order
  o.kv_arena = w->arena();
  return std::shared_ptr<ModelEngine>(std::move(*ModelEngine::Create(o, [w] { w->Wake(); })));
}

std::unique_ptr<DeviceWorker> Worker(const DeviceArbitrationOptions& arb) {
  DeviceMemoryOptions mem;
  mem.page_bytes = 64 << 10;
  return std::move(*DeviceWorker::Create("cpu:0", 256 << 20, mem, arb));
}

std::unique_ptr<DeviceWorker> Worker(ArbitrationPolicy policy) {
  DeviceArbitrationOptions arb;
  arb.policy = policy;
  return Worker(arb);
}

// Both engines join between two passes (on the step thread), so the first
// pass that steps either sees both queues.
void AddBoth(DeviceWorker* w, std::shared_ptr<ModelEngine> a, std::shared_ptr<ModelEngine> b) {
  ASSERT_TRUE(w->RunOnStepThread([&] {
                 if (absl::Status st = w->Add(a); !st.ok()) return st;
                 return w->Add(b);
               }).ok());
}

TEST(DeviceArbitration, AdmissionFollowsDeadlinesNotArrival) {
  engine::testing::TempDir dir;
  const std::string path = engine::testing::WriteTinyModel(dir, "a", {});
  for (auto policy :
       {ArbitrationPolicy::kMooreHodgson, ArbitrationPolicy::kEdf, ArbitrationPolicy::kFcfs}) {
    auto w = Worker(policy);
    auto e = Engine("a", path, w.get());
    Order order;
    std::vector<std::unique_ptr<Sink>> sinks;
    // Queued before the engine joins the device, so one decision sees all.
    const std::vector<std::pair<std::string, double>> reqs = {
        {"late-deadline", 60000}, {"urgent", 2000}, {"middle", 20000}};
    for (const auto& [id, ttft] : reqs) {
      sinks.push_back(std::make_unique<Sink>(id, &order));
      ASSERT_TRUE(e->Submit(Req(id, 20, ttft), sinks.back().get()).ok());
    }
    ASSERT_TRUE(w->Add(e).ok());
    ASSERT_TRUE(WaitAll(&order, 3));
    const std::vector<std::string> want =
        policy == ArbitrationPolicy::kFcfs
            ? std::vector<std::string>{"late-deadline", "urgent", "middle"}
            : std::vector<std::string>{"urgent", "middle", "late-deadline"};
    EXPECT_EQ(order.ids, want) << static_cast<int>(policy);
    EXPECT_GT(w->arbitration_stats().decisions, 0);
    EXPECT_EQ(w->arbitration_stats().urgent_steps, 0);  // one model: no one to go ahead of
    w->Stop();
  }
}

// Two models stepping in one pass, priority_streams "first": the one
// holding the request the policy put first steps urgent (the GPU's
// greatest stream priority; a no-op on the CPU backend); with "none" no
// step is urgent.
TEST(DeviceArbitration, TheFirstRequestsModelStepsUrgentWhenStepsOverlap) {
  engine::testing::TempDir dir;
  const std::string path = engine::testing::WriteTinyModel(dir, "a", {});
  for (bool on : {true, false}) {
    DeviceArbitrationOptions arb;
    arb.policy = ArbitrationPolicy::kMooreHodgson;
    arb.priority_streams = on ? StreamPriorityPolicy::kFirst : StreamPriorityPolicy::kNone;
    auto w = Worker(arb);
    auto relaxed = Engine("relaxed", path, w.get());
    auto urgent = Engine("urgent", path, w.get());
    Order order;
    std::vector<std::unique_ptr<Sink>> sinks;
    auto submit = [&](ModelEngine* e, const std::string& id, double ttft_ms) {
      sinks.push_back(std::make_unique<Sink>(id, &order));
      ASSERT_TRUE(e->Submit(Req(id, 200, ttft_ms), sinks.back().get()).ok());
    };
    // Queued before the engines join, so the first pass with both sees
    // both queues; the relaxed model has enough work to outlast the join.
    for (int i = 0; i < 6; ++i) submit(relaxed.get(), absl::StrCat("r", i), 600000);
    submit(urgent.get(), "u", 1000);
    AddBoth(w.get(), relaxed, urgent);
    ASSERT_TRUE(WaitAll(&order, 7));
    w->Stop();
    for (const auto& s : sinks) EXPECT_TRUE(s->result.ok()) << s->id << ": " << s->result.status();
    if (on) {
      EXPECT_GT(urgent->urgent_steps(), 0);
      EXPECT_GT(w->arbitration_stats().urgent_steps, 0);
    } else {
      EXPECT_EQ(urgent->urgent_steps(), 0);
      EXPECT_EQ(w->arbitration_stats().urgent_steps, 0);
    }
    // Once "u" runs, the relaxed model's queue comes first and its steps
    // may be urgent in turn; one model is urgent per pass at most.
    EXPECT_EQ(relaxed->urgent_steps() + urgent->urgent_steps(),
              w->arbitration_stats().urgent_steps);
  }
}

TEST(DeviceArbitration, UnmeetableSloIsServedLateUnlessRejectionWasAsked) {
  engine::testing::TempDir dir;
  const std::string path = engine::testing::WriteTinyModel(dir, "a", {});
  auto w = Worker(ArbitrationPolicy::kMooreHodgson);
  auto e = Engine("a", path, w.get());
  Order order;
  // A 0.01 ms TTFT SLO cannot be met by any prefill estimate.
  Sink late("late", &order), reject("reject", &order);
  ASSERT_TRUE(e->Submit(Req("late", 50, 0.01), &late).ok());
  ASSERT_TRUE(e->Submit(Req("reject", 50, 0.01, /*reject=*/true), &reject).ok());
  ASSERT_TRUE(w->Add(e).ok());
  ASSERT_TRUE(WaitAll(&order, 2));
  ASSERT_TRUE(late.result.ok()) << late.result.status();
  EXPECT_EQ(late.result->output_tokens.size(), 4u);
  EXPECT_EQ(reject.result.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(reject.result.status().message().find("TTFT SLO"), std::string::npos);
  EXPECT_EQ(w->arbitration_stats().rejected, 1);
  w->Stop();
}

// node.arbitration.log_decisions: a line for each change of each queued
// request, in the form scripts/arbitration-timeline.py parses (its LINE).
TEST(DeviceArbitration, TheDecisionLogHasALinePerChange) {
  engine::testing::TempDir dir;
  const std::string path = engine::testing::WriteTinyModel(dir, "a", {});
  auto out = std::make_shared<std::ostringstream>();
  // The default logger writes to `out` until this scope ends (a failed
  // ASSERT included), then is restored.
  struct Capture {
    explicit Capture(std::ostringstream* o) : was(spdlog::default_logger()) {
      spdlog::set_default_logger(std::make_shared<spdlog::logger>(
          "capture", std::make_shared<spdlog::sinks::ostream_sink_mt>(*o)));
    }
    ~Capture() { spdlog::set_default_logger(was); }
    std::shared_ptr<spdlog::logger> was;
  } capture(out.get());
  DeviceArbitrationOptions arb;
  arb.log_decisions = true;
  auto w = Worker(arb);
  auto e = Engine("a", path, w.get());
  Order order;
  Sink late("late", &order), reject("reject", &order), fine("fine", &order);
  ASSERT_TRUE(e->Submit(Req("fine", 20, 60000), &fine).ok());
  ASSERT_TRUE(e->Submit(Req("late", 50, 0.01), &late).ok());  // no estimate meets 0.01 ms
  ASSERT_TRUE(e->Submit(Req("reject", 50, 0.01, /*reject=*/true), &reject).ok());
  ASSERT_TRUE(w->Add(e).ok());
  ASSERT_TRUE(WaitAll(&order, 3));
  w->Stop();
  const std::regex line(
      R"(arbitration (\S+) at ([0-9.]+): (\S+) (\S+) (\w+); (\d+) tokens, arrived (-?[0-9.]+) s, )"
      R"(start (-?[0-9.]+) ms, deadline (-?[0-9.]+) ms, cost (-?[0-9.]+) ms, queued ([0-9.]+) ms; )"
      R"(fit ([0-9.]+) ms \+ ([0-9.]+) ms/token over (\d+) steps; (\d+) queued, KV free (\d+) MiB)");
  std::map<std::string, std::vector<std::string>> events;  // request -> its events
  std::istringstream lines(out->str());
  for (std::string l; std::getline(lines, l);) {
    if (l.find("arbitration cpu:0") == std::string::npos) continue;
    std::smatch m;
    ASSERT_TRUE(std::regex_search(l, m, line)) << l;
    EXPECT_EQ(m[4], "a");
    events[m[3]].push_back(m[5]);
    if (m[3] == "late" && m[5] == "queued") {
      EXPECT_GT(std::stod(m[8]) + std::stod(m[10]), std::stod(m[9]))
          << l;  // start + cost > deadline
    }
  }
  EXPECT_EQ(events["fine"], (std::vector<std::string>{"queued", "left"}));
  EXPECT_EQ(events["late"], (std::vector<std::string>{"queued", "left"}));
  EXPECT_EQ(events["reject"], (std::vector<std::string>{"queued", "rejected"}));
  EXPECT_EQ(reject.result.status().code(), absl::StatusCode::kResourceExhausted);
}

// Past the overload bound a waiting request is refused at once, asked or
// not; within it, it is served.
TEST(DeviceArbitration, AQueueBeyondTheWaitBoundIsRefusedEarly) {
  engine::testing::TempDir dir;
  const std::string path = engine::testing::WriteTinyModel(dir, "a", {});
  DeviceArbitrationOptions arb;
  arb.max_queue_wait_ms = 0.001;  // below any prefill estimate
  auto w = Worker(arb);
  auto e = Engine("a", path, w.get());
  Order order;
  Sink sink("r", &order);
  ASSERT_TRUE(e->Submit(Req("r", 50, 60000), &sink).ok());  // a generous SLO, not opted in
  ASSERT_TRUE(w->Add(e).ok());
  ASSERT_TRUE(WaitAll(&order, 1));
  EXPECT_EQ(sink.result.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(sink.result.status().message().find("overloaded"), std::string::npos)
      << sink.result.status();
  w->Stop();
}

// Aging: "old" (TTFT SLO 100 ms, queued 1 s ago) is late whatever the
// order, so Moore-Hodgson serves it after the two on time; having waited
// 10 SLOs, past promote_after_slo 3, it is admitted first.
TEST(DeviceArbitration, AgingAdmitsALongLateRequestFirst) {
  engine::testing::TempDir dir;
  const std::string path = engine::testing::WriteTinyModel(dir, "a", {});
  for (const double k : {0.0, 3.0}) {
    SCOPED_TRACE(k);
    DeviceArbitrationOptions arb;
    arb.promote_after_slo = k;
    auto w = Worker(arb);
    auto e = Engine("a", path, w.get());
    Order order;
    std::vector<std::unique_ptr<Sink>> sinks;
    for (const char* id : {"on-time-1", "on-time-2", "old"}) {
      sinks.push_back(std::make_unique<Sink>(id, &order));
      GenerationRequest r = Req(id, 20, 60000);
      if (std::string(id) == "old") {
        r.ttft_slo_ms = 100;
        r.arrival = absl::Now() - absl::Seconds(1);
      }
      ASSERT_TRUE(e->Submit(std::move(r), sinks.back().get()).ok());
    }
    ASSERT_TRUE(w->Add(e).ok());
    ASSERT_TRUE(WaitAll(&order, 3));
    const std::vector<std::string> want =
        k > 0 ? std::vector<std::string>{"old", "on-time-1", "on-time-2"}
              : std::vector<std::string>{"on-time-1", "on-time-2", "old"};
    EXPECT_EQ(order.ids, want);
    w->Stop();
  }
}

TEST(PrefillCostModel, FitsMeasuredStepsAndStartsFromThePrior) {
  PrefillCostModel m(/*prior_ms_per_token=*/0.1);
  EXPECT_DOUBLE_EQ(m.PredictMs(100), 10.0);  // prior
  for (int t : {16, 64, 128, 256, 512}) m.Record(t, 2.0 + 0.03 * t);
  EXPECT_NEAR(m.intercept_ms(), 2.0, 1e-9);
  EXPECT_NEAR(m.ms_per_token(), 0.03, 1e-12);
  EXPECT_NEAR(m.PredictMs(1000), 32.0, 1e-9);
  // One token count only: proportional, never negative.
  PrefillCostModel one;
  for (int i = 0; i < 5; ++i) one.Record(100, 5.0);
  EXPECT_NEAR(one.PredictMs(200), 10.0, 1e-9);
  // A window forgets old samples.
  PrefillCostModel w(0.1, /*window=*/4);
  for (int t : {10, 20, 30, 40}) w.Record(t, 100.0 + t);
  for (int t : {10, 20, 30, 40}) w.Record(t, 1.0 * t);
  EXPECT_NEAR(w.PredictMs(50), 50.0, 1e-9);
}

// The H200's rate-4 validation run (issue 20, session 59): m1's warm-up of
// 8 tokens took 201 ms, then its prompts 46, 30 and 26 ms. Fitted with the
// warm-up, the slope fell below zero and the clamped fit was 77 ms for any
// prompt; without it, the fit follows the prompts.
TEST(PrefillCostModel, LeavesOutTheModelsFirstStep) {
  const std::pair<int, double> steps[] = {
      {8, 201.0}, {2048, 46.0}, {1025, 30.0}, {965, 26.0}, {1500, 35.0}};
  PrefillCostModel with_first(0.05, 64, /*warmup_steps=*/0);
  PrefillCostModel model;  // leaves out one
  for (auto [t, ms] : steps) {
    with_first.Record(t, ms);
    model.Record(t, ms);
  }
  EXPECT_EQ(with_first.samples(), 5);
  EXPECT_DOUBLE_EQ(with_first.ms_per_token(), 0.0);
  EXPECT_NEAR(with_first.PredictMs(218), (201.0 + 46 + 30 + 26 + 35) / 5, 1e-9);
  EXPECT_EQ(model.samples(), 4);
  // Least squares over the four prompts: 0.0170 ms a token from 10.8 ms.
  EXPECT_NEAR(model.ms_per_token(), 0.016963, 1e-5);
  EXPECT_NEAR(model.intercept_ms(), 10.765, 1e-2);
  EXPECT_LT(model.PredictMs(218), 15.0);
  EXPECT_GT(model.PredictMs(3072), 60.0);
}

// priority_streams "decode": a model's decode-only steps run urgent while
// another model's prefill chunks overlap them; a step carrying prefill
// tokens never does.
TEST(DeviceArbitration, DecodeOnlyStepsRunUrgentBesidePrefills) {
  engine::testing::TempDir dir;
  const std::string path = engine::testing::WriteTinyModel(dir, "a", {});
  DeviceArbitrationOptions arb;
  arb.priority_streams = StreamPriorityPolicy::kDecode;
  auto w = Worker(arb);
  auto chat = Engine("chat", path, w.get());
  auto bulk = Engine("bulk", path, w.get());
  Order order;
  std::vector<std::unique_ptr<Sink>> sinks;
  auto submit = [&](ModelEngine* e, const std::string& id, int prompt, int max_tokens) {
    sinks.push_back(std::make_unique<Sink>(id, &order));
    GenerationRequest r = Req(id, prompt, 60000);
    r.params.max_tokens = max_tokens;
    ASSERT_TRUE(e->Submit(r, sinks.back().get()).ok());
  };
  // The bulk model only prefills (one token each, from the prefill step);
  // the chat model decodes long enough to overlap them.
  for (int i = 0; i < 12; ++i) submit(bulk.get(), absl::StrCat("b", i), 300, 1);
  submit(chat.get(), "c", 20, 48);
  AddBoth(w.get(), bulk, chat);
  ASSERT_TRUE(WaitAll(&order, 13));
  w->Stop();
  for (const auto& s : sinks) EXPECT_TRUE(s->result.ok()) << s->id << ": " << s->result.status();
  EXPECT_GT(chat->urgent_steps(), 0);
  EXPECT_EQ(bulk->urgent_steps(), 0);
  EXPECT_EQ(w->arbitration_stats().urgent_steps, chat->urgent_steps());
}

// rolling_steps, with and without ahead_steps (and with the loop polling
// the steps' ends, poll_steps): every model's requests are
// served, with the same tokens as in lockstep passes (the CPU backend is
// deterministic), while between-step tasks still run (they wait for the
// steps in flight), and the worker stops cleanly with a request in flight.
TEST(DeviceArbitration, RollingStepsServeEveryModelWithTheSameTokens) {
  engine::testing::TempDir dir;
  const std::string path = engine::testing::WriteTinyModel(dir, "a", {});
  std::map<std::string, std::vector<int>> tokens[4];
  // lockstep, rolling, rolling with ahead steps, the same polling
  for (int mode = 0; mode < 4; ++mode) {
    const bool ahead = mode >= 2;
    DeviceArbitrationOptions arb;
    arb.rolling_steps = mode >= 1;
    arb.ahead_steps = ahead;
    arb.poll_steps = mode == 3;
    const absl::Time created = absl::Now();
    auto w = Worker(arb);
    auto a = Engine("a", path, w.get(), ahead);
    auto b = Engine("b", path, w.get(), ahead);
    ASSERT_TRUE(w->Add(a).ok());
    ASSERT_TRUE(w->Add(b).ok());
    Order order;
    std::vector<std::unique_ptr<Sink>> sinks;
    for (int i = 0; i < 4; ++i) {
      for (ModelEngine* e : {a.get(), b.get()}) {
        const std::string id = absl::StrCat(e->name(), i);
        sinks.push_back(std::make_unique<Sink>(id, &order));
        GenerationRequest r = Req(id, 30 + 7 * i, 60000);
        r.params.max_tokens = 12;
        ASSERT_TRUE(e->Submit(r, sinks.back().get()).ok());
      }
      // A between-step task while steps are in flight.
      EXPECT_TRUE(w->RunOnStepThread([] { return absl::OkStatus(); }).ok());
    }
    ASSERT_TRUE(WaitAll(&order, 8));
    for (const auto& s : sinks) {
      ASSERT_TRUE(s->result.ok()) << s->id << ": " << s->result.status();
      EXPECT_EQ(s->result->output_tokens.size(), 12u) << s->id;
      tokens[mode][s->id] = s->result->output_tokens;
    }
    // The step thread's time was charged to beginning and finishing steps,
    // and in all to no more than the worker's life.
    const StepThreadTime t = w->Usage().step_thread;
    EXPECT_GT(t.begin_s, 0);
    EXPECT_GT(t.finish_s, 0);
    EXPECT_LE(t.begin_s + t.finish_s + t.idle_s + t.other_s,
              absl::ToDoubleSeconds(absl::Now() - created));
    // Stopping with a request in flight ends it (served or failed) and returns.
    Sink left("left", &order);
    ASSERT_TRUE(a->Submit(Req("left", 40, 60000), &left).ok());
    w->Stop();
    EXPECT_TRUE(left.done);
    // Read once the step thread is gone.
    if (ahead) {
      EXPECT_GT(a->ahead_steps() + b->ahead_steps(), 0);
    } else {
      EXPECT_EQ(a->ahead_steps() + b->ahead_steps(), 0);
    }
    // The device counted each step begun once, by how it began.
    const StepStarts starts = w->Usage().step_starts;
    EXPECT_GT(starts.alone, 0);
    EXPECT_EQ(starts.ahead + starts.late, a->ahead_steps() + b->ahead_steps());
  }
  EXPECT_EQ(tokens[0], tokens[1]);
  EXPECT_EQ(tokens[0], tokens[2]);
  EXPECT_EQ(tokens[0], tokens[3]);
}

// Holds the rolling loop's device-done callbacks (notify_device_done)
// until Open: steps stay in flight on the CPU backend, whose steps have no
// device work to wait for.
class HeldSteps {
 public:
  std::function<void(ModelEngine&, std::function<void()>)> Notifier() {
    return [this](ModelEngine& e, std::function<void()> done) {
      {
        absl::MutexLock lock(&mu_);
        ++notified_[e.name()];
        if (!open_) {
          held_.push_back(std::move(done));
          return;
        }
      }
      done();
    };
  }
  // Device-done notifications asked for `model`'s steps so far.
  int notified(const std::string& model) {
    absl::MutexLock lock(&mu_);
    return notified_[model];
  }
  bool AwaitHeld(size_t n) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return held_.size() >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(30));
  }
  // Releases what is held; later steps are not held.
  void Open() {
    std::vector<std::function<void()>> release;
    {
      absl::MutexLock lock(&mu_);
      open_ = true;
      release.swap(held_);
    }
    for (auto& done : release) done();
  }

 private:
  absl::Mutex mu_;
  bool open_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::function<void()>> held_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int> notified_ ABSL_GUARDED_BY(mu_);
};

// Rolling steps: while A's and B's steps are held in flight, a request for
// C begins C's step at once, and arbitrating C's queue does not finish the
// held steps (an engine's arbitration hooks would wait for its device
// work): A has streamed no token until the steps are let go.
TEST(DeviceArbitration, RollingStepsBeginAModelWithoutFinishingTheOnesInFlight) {
  engine::testing::TempDir dir;
  const std::string path = engine::testing::WriteTinyModel(dir, "a", {});
  HeldSteps held;
  DeviceArbitrationOptions arb;
  arb.rolling_steps = true;
  arb.notify_device_done = held.Notifier();
  auto w = Worker(arb);
  auto a = Engine("a", path, w.get());
  auto b = Engine("b", path, w.get());
  auto c = Engine("c", path, w.get());
  ASSERT_TRUE(w->Add(c).ok());
  Order order;
  Sink a0("a0", &order), b0("b0", &order), c0("c0", &order);
  ASSERT_TRUE(a->Submit(Req("a0", 8, 60000), &a0).ok());
  ASSERT_TRUE(b->Submit(Req("b0", 8, 60000), &b0).ok());
  AddBoth(w.get(), a, b);          // both begin in one pass
  ASSERT_TRUE(held.AwaitHeld(2));  // a's and b's first steps in flight
  ASSERT_TRUE(c->Submit(Req("c0", 8, 60000), &c0).ok());
  ASSERT_TRUE(held.AwaitHeld(3));  // c's step began beside them
  EXPECT_EQ(a0.tokens.load(), 0) << "a's step in flight was finished to begin c's";
  EXPECT_EQ(b0.tokens.load(), 0) << "b's step in flight was finished to begin c's";
  EXPECT_EQ(held.notified("a"), 1);
  held.Open();
  ASSERT_TRUE(WaitAll(&order, 3));
  for (Sink* s : {&a0, &b0, &c0}) {
    ASSERT_TRUE(s->result.ok()) << s->id << ": " << s->result.status();
    EXPECT_EQ(s->tokens.load(), 4) << s->id;
  }
  w->Stop();
}

}  // namespace
}  // namespace ballast::node_manager
