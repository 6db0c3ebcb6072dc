// DeviceWorker activation in elastic mode: a model whose weights need memory
// that another model's KV holds is added after that model sheds KV
// (preemption); the preempted requests finish with the outputs they would
// have had alone, and the new model serves correctly.
#include "node_manager/device_worker.h"
#include "node_manager/node_manager.h"

#include <atomic>
#include <cstdlib>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/synchronization/mutex.h"
#include "engine/model_engine.h"
#include "gtest/gtest.h"
#include "tests/unit/engine/test_util.h"
#include "tests/unit/node_manager/test_util.h"

namespace ballast::node_manager {
namespace {

using engine::GenerationRequest;
using engine::GenerationResult;
using engine::ModelEngine;
using engine::ModelEngineOptions;
using testing::Alone;
using testing::Done;
using testing::Req;
using testing::WaitFor;

// `model`'s preemptions by cause as the device reports them.
ModelPreemptions PreemptionsOf(const DeviceUsage& u, const std::string& model) {
  for (const ModelPreemptions& p : u.model_preemptions) {
    if (p.model == model) return p;
  }
  ADD_FAILURE() << "no preemptions reported for " << model;
  return {};
}

TEST(DeviceWorker, ActivationTakesKvFromOtherModelsAndTheirOutputsStayExact) {
  engine::testing::TempDir dir;
  engine::SyntheticModelSpec sa, sb;
  sa.seed = 31;
  sb.architecture = "qwen2";
  sb.seed = 32;
  const std::string a_path = engine::testing::WriteTinyModel(dir, "a", sa);
  const std::string b_path = engine::testing::WriteTinyModel(dir, "b", sb);
  constexpr int64_t kPage = 64 << 10;

  // Size the device so that B's weights fit only if A gives back KV.
  const DeviceMemoryOptions mem = testing::HostPages(kPage);
  auto pages_of = [&](const std::string& path) {
    ModelEngineOptions o;
    o.path = path;
    const int64_t b = *ModelEngine::WeightBytesNeeded(o);
    return (b + kPage - 1) / kPage * kPage;
  };
  const int64_t wa = pages_of(a_path), wb = pages_of(b_path);
  const int64_t memory = wa + wb + 6 * kPage;
  auto w = std::move(*DeviceWorker::Create("cpu:0", memory, mem));
  auto a_or = testing::Activate("a", a_path, w.get());
  ASSERT_TRUE(a_or.ok()) << a_or.status();
  std::shared_ptr<ModelEngine> a = std::move(*a_or);
  EXPECT_EQ(w->balloon()->stats().weight_bytes, wa);  // weights are balloon pages

  // A fills the arena: four requests of ~3 pages of KV each.
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 4; ++i) reqs.push_back(Req("a" + std::to_string(i), i, 300, 60));
  std::vector<std::unique_ptr<Done>> done;
  for (const auto& r : reqs) {
    done.push_back(std::make_unique<Done>());
    ASSERT_TRUE(a->Submit(r, done.back().get()).ok());
  }
  ASSERT_TRUE(
      WaitFor([&] { return memory - w->Usage().memory_used_bytes < wb; }, absl::Seconds(20)))
      << "A's KV never grew into B's share";
  const int64_t preempted_before = a->stats().preemptions;
  const int64_t map_calls_before = w->Usage().page_map_calls;
  auto b_or = testing::Activate("b", b_path, w.get());
  ASSERT_TRUE(b_or.ok()) << b_or.status();
  std::shared_ptr<ModelEngine> b = std::move(*b_or);
  EXPECT_GT(a->stats().preemptions, preempted_before);  // A shed KV by preemption
  {
    // Every one of A's sequences the device shed was for B's weights.
    const ModelPreemptions p = PreemptionsOf(w->Usage(), "a");
    EXPECT_GT(p.for_weights, 0);
    EXPECT_EQ(p.for_kv, 0);
    EXPECT_EQ(p.for_weights, a->stats().shed_preemptions);
    EXPECT_EQ(p.growth + p.for_weights, a->stats().preemptions);
    EXPECT_EQ(PreemptionsOf(w->Usage(), "b").for_weights, 0);
  }
  EXPECT_LE(w->Usage().memory_used_bytes, memory);
  EXPECT_EQ(w->balloon()->stats().weight_bytes, wa + wb);
  EXPECT_GT(w->Usage().page_map_calls, map_calls_before);

  Done db;
  const GenerationRequest rb = Req("b0", 9, 40, 20);
  ASSERT_TRUE(b->Submit(rb, &db).ok());
  ASSERT_TRUE(WaitFor(
      [&] {
        for (auto& d : done)
          if (!d->Finished()) return false;
        return db.Finished();
      },
      absl::Seconds(60)));
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_TRUE(done[i]->result.ok()) << done[i]->result.status();
    EXPECT_EQ(done[i]->result->output_tokens, Alone(a_path, reqs[i])) << reqs[i].id;
  }
  ASSERT_TRUE(db.result.ok()) << db.result.status();
  EXPECT_EQ(db.result->output_tokens, Alone(b_path, rb));

  // A model that cannot fit even after everyone sheds is refused, not added.
  const memory::BalloonStats before = w->balloon()->stats();
  EXPECT_EQ(w->ReserveWeights(memory).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(w->balloon()->stats().weight_bytes, before.weight_bytes);  // no trace

  // Evicting B gives its pages back; they are reused (same range) by the
  // next activation, and KV can grow into them meanwhile.
  ASSERT_TRUE(w->Remove("b"));
  b.reset();
  ASSERT_TRUE(WaitFor([&] { return w->balloon()->stats().weight_bytes == wa; }, absl::Seconds(10)));
  const int64_t ranges = w->balloon()->stats().weight_ranges_reserved;
  auto again = testing::Activate("b", b_path, w.get());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(w->balloon()->stats().weight_ranges_reserved, ranges);
  w->Stop();
}

// The device lists its engines in the order they were added (the ties of
// remapping's MRU donor order and of device-wide shedding go by it), not
// by name; a model loaded again comes last.
TEST(DeviceWorker, EnginesAreListedInActivationOrder) {
  engine::testing::TempDir dir;
  const std::string path = engine::testing::WriteTinyModel(dir, "m", {});
  constexpr int64_t kPage = 64 << 10;
  auto w = std::move(*DeviceWorker::Create("cpu:0", 64 << 20, testing::HostPages(kPage)));
  auto names = [&] {
    std::vector<std::string> out;
    for (const auto& e : w->Engines()) out.push_back(e->name());
    return out;
  };
  for (const char* name : {"b", "c", "a"}) ASSERT_TRUE(testing::Activate(name, path, w.get()).ok());
  EXPECT_EQ(names(), (std::vector<std::string>{"b", "c", "a"}));
  ASSERT_TRUE(w->Remove("b"));
  EXPECT_EQ(names(), (std::vector<std::string>{"c", "a"}));
  ASSERT_TRUE(testing::Activate("b", path, w.get()).ok());
  EXPECT_EQ(names(), (std::vector<std::string>{"c", "a", "b"}));
  w->Stop();
}

// Weights take room from part-used slabs by moving KV blocks, not by
// dropping them: kept sessions interleaved over the slabs, half of them
// forgotten, leave slabs half full; a reservation that fits only once the
// survivors are packed maps with every survivor still cached. One that
// needs more sheds only the sessions the ladder names for its bytes. The
// next turns read what is left with exact outputs.
TEST(DeviceWorker, WeightsTakeRoomByMovingKvOutOfPartUsedSlabs) {
  engine::testing::TempDir dir;
  const std::string path = engine::testing::WriteTinyModel(dir, "a");
  constexpr int64_t kPage = 64 << 10;
  ModelEngineOptions probe;
  probe.path = path;
  const int64_t wa = (*ModelEngine::WeightBytesNeeded(probe) + kPage - 1) / kPage * kPage;
  const int64_t memory = wa + 16 * kPage;
  auto w = std::move(*DeviceWorker::Create("cpu:0", memory, testing::HostPages(kPage)));
  absl::Cleanup stop = [&] { w->Stop(); };
  std::shared_ptr<ModelEngine> a = std::move(*testing::Activate("a", path, w.get()));
  std::vector<GenerationRequest> turns;
  std::vector<std::unique_ptr<Done>> done;
  for (int i = 0; i < 8; ++i) {
    turns.push_back(Req("t" + std::to_string(i), i, 100, 4));
    turns.back().session_id = "s" + std::to_string(i);
    done.push_back(std::make_unique<Done>());
    ASSERT_TRUE(a->Submit(turns.back(), done.back().get()).ok());
  }
  for (auto& d : done) ASSERT_TRUE(d->AwaitDone(absl::Seconds(30)));
  for (int i = 1; i < 8; i += 2) a->DropSession("s" + std::to_string(i));
  ASSERT_TRUE(WaitFor([&] { return a->CachedSessionTokens("s7") == 0; }, absl::Seconds(10)));
  // What packing the survivors' blocks leaves for weights.
  const memory::KvArenaStats as = w->arena()->stats();
  const int64_t per_slab = kPage / static_cast<int64_t>(a->kv_block_bytes());
  const int64_t packed = (as.blocks_used + per_slab - 1) / per_slab;
  ASSERT_GT(as.slabs_formatted, packed) << "the sessions left no slab part-used";
  const int64_t budget = w->balloon()->pool()->stats().budget_bytes;
  const int64_t want =
      (budget - w->balloon()->stats().weight_bytes - packed * kPage) / kPage * kPage;
  auto pages = w->ReserveWeights(want);
  ASSERT_TRUE(pages.ok()) << pages.status();
  const KvCompactions c = w->Usage().kv_compactions;
  EXPECT_EQ(c.drains, 1);
  EXPECT_GT(c.moved_bytes, 0);
  EXPECT_GE(c.freed_bytes, (as.slabs_formatted - packed) * kPage);
  EXPECT_EQ(c.failed, 0);
  for (int i = 0; i < 8; i += 2) {
    EXPECT_GT(a->CachedSessionTokens("s" + std::to_string(i)), 0) << i;
  }
  // Packed, two more slabs cost shedding: only the oldest sessions whose
  // bytes cover them go (the ladder), and their freed blocks are packed
  // into whole slabs; the newest survives.
  const int64_t session = kPage * 7 / 8;  // 104 tokens: 14 blocks of 16 a slab
  ASSERT_EQ(a->kv_block_bytes() * 14, session) << "the sizes below assume this model";
  auto more = w->ReserveWeights(2 * kPage);
  ASSERT_TRUE(more.ok()) << more.status();
  for (int i = 0; i < 6; i += 2) EXPECT_EQ(a->CachedSessionTokens("s" + std::to_string(i)), 0);
  EXPECT_GT(a->CachedSessionTokens("s6"), 0);
  pages->reset();  // room for the next turns' growth
  more->reset();
  for (int i = 0; i < 8; i += 2) {
    GenerationRequest next = turns[i];
    next.id = "next" + std::to_string(i);
    next.prompt.insert(next.prompt.end(), done[i]->result->output_tokens.begin(),
                       done[i]->result->output_tokens.end());
    next.prompt.push_back(5);
    Done d;
    ASSERT_TRUE(a->Submit(next, &d).ok());
    ASSERT_TRUE(d.AwaitDone(absl::Seconds(30)));
    ASSERT_TRUE(d.result.ok()) << d.result.status();
    EXPECT_EQ(d.result->cached_tokens > 0, i == 6) << i;
    next.session_id.clear();
    EXPECT_EQ(d.result->output_tokens, Alone(path, next)) << i;
  }
}

// An idle device reports nothing used, whenever it is asked: the node's
// heartbeats sample Usage() while the arena maps and unmaps its buffer of
// empty slabs, and a used figure off by a slab decides placement.
TEST(DeviceWorker, AnIdleDeviceReportsNothingUsedWhileItsArenaReplenishes) {
  constexpr int64_t kPage = 64 << 10;
  auto w = std::move(*DeviceWorker::Create("cpu:0", 64 * kPage, testing::HostPages(kPage)));
  memory::KvArena* arena = w->balloon()->arena().get();
  std::atomic<bool> stop{false};
  std::atomic<int64_t> cycles{0};
  std::thread churn([&] {
    while (!stop.load()) {
      arena->Replenish();
      arena->ReclaimFreeSlabs();
      cycles.fetch_add(1);
    }
  });
  int64_t wrong = 0, worst = 0;
  for (int i = 0; i < 20000 || cycles.load() < 100; ++i) {
    const int64_t used = w->Usage().memory_used_bytes;
    if (used != 0) ++wrong;
    if (std::abs(used) > std::abs(worst)) worst = used;
  }
  stop.store(true);
  churn.join();
  EXPECT_GT(cycles.load(), 0);
  EXPECT_EQ(wrong, 0) << "worst reading " << worst << " bytes";
  w->Stop();
}

// Steps overlap on a device (every engine's step begins before any
// finishes), so one model's KV growth can reclaim another's blocks while
// that model's step is in flight. The in-flight step must end before its
// sequences are preempted: otherwise it would stream a token of a
// sequence that then recomputes, and outputs would differ from a run alone.
TEST(DeviceWorker, KvReclaimedFromAModelWhoseStepIsInFlightKeepsOutputsExact) {
  engine::testing::TempDir dir;
  engine::SyntheticModelSpec sa, sb;
  sa.seed = 41;
  sb.seed = 42;
  const std::string a_path = engine::testing::WriteTinyModel(dir, "a", sa);
  const std::string b_path = engine::testing::WriteTinyModel(dir, "b", sb);
  constexpr int64_t kPage = 64 << 10;
  auto pages_of = [&](const std::string& path) {
    ModelEngineOptions o;
    o.path = path;
    const int64_t b = *ModelEngine::WeightBytesNeeded(o);
    return (b + kPage - 1) / kPage * kPage;
  };
  // Room for about six requests' KV between the two models.
  const int64_t memory = pages_of(a_path) + pages_of(b_path) + 10 * kPage;
  auto w = std::move(*DeviceWorker::Create("cpu:0", memory, testing::HostPages(kPage)));
  auto a = testing::Activate("a", a_path, w.get());
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = testing::Activate("b", b_path, w.get());
  ASSERT_TRUE(b.ok()) << b.status();

  // Three rounds: a round's interleaving of growth and steps varies.
  std::vector<std::pair<std::string, GenerationRequest>> reqs;
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < 6; ++i) {
      const std::string n = std::to_string(round * 10 + i);
      reqs.push_back({a_path, Req("a" + n, round * 20 + i, 200, 80)});
      reqs.push_back({b_path, Req("b" + n, round * 20 + 10 + i, 200, 80)});
    }
  }
  std::vector<std::unique_ptr<Done>> done;
  for (const auto& [path, r] : reqs) {
    done.push_back(std::make_unique<Done>());
    ModelEngine& e = path == a_path ? **a : **b;
    ASSERT_TRUE(e.Submit(r, done.back().get()).ok());
  }
  ASSERT_TRUE(WaitFor(
      [&] {
        for (auto& d : done)
          if (!d->Finished()) return false;
        return true;
      },
      absl::Seconds(120)));
  // The two models took KV from each other while both were stepping.
  EXPECT_GT((*a)->stats().preemptions + (*b)->stats().preemptions, 0);
  // Every preemption has one cause, and none was for weights.
  const DeviceUsage u = w->Usage();
  for (const auto& e : {*a, *b}) {
    const ModelPreemptions p = PreemptionsOf(u, e->name());
    EXPECT_EQ(p.growth + p.for_kv + p.for_weights, e->stats().preemptions) << e->name();
    EXPECT_EQ(p.for_kv, e->stats().shed_preemptions) << e->name();
    EXPECT_EQ(p.for_weights, 0) << e->name();
  }
  // No session KV is kept: shedding for growth ended only the shedding
  // model's steps (cause shed), never every step on the device.
  EXPECT_EQ(u.step_drains.reclaim, 0);
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_TRUE(done[i]->result.ok()) << done[i]->result.status();
    EXPECT_EQ(done[i]->result->output_tokens, Alone(reqs[i].first, reqs[i].second))
        << reqs[i].second.id;
  }
  w->Stop();
}

// The baseline: in static mode every model's KV pool is private, so memory
// another model's idle pool holds is not lent; in elastic mode the same
// device takes both models.
TEST(NodeManager, StaticModeRefusesToLendIdleKvMemory) {
  engine::testing::TempDir dir;
  engine::SyntheticModelSpec sb;
  sb.architecture = "qwen2";
  const std::string a_path = engine::testing::WriteTinyModel(dir, "a", {});
  const std::string b_path = engine::testing::WriteTinyModel(dir, "b", sb);
  int64_t wa = 0, wb = 0;
  {
    ModelEngineOptions o;
    o.path = a_path;
    wa = (*ModelEngine::Create(o))->weight_bytes();
    o.path = b_path;
    wb = (*ModelEngine::Create(o))->weight_bytes();
  }
  constexpr int64_t kPool = 1 << 20;
  for (const std::string mode : {"static", "elastic"}) {
    NodeOptions n;
    n.memory_mode = mode;
    n.devices = {DeviceOptions{"cpu:0", wa + wb + kPool + kPool / 2}};
    n.engine.kv_cache_bytes = kPool;
    auto node = std::move(*NodeManager::Create(n));
    ASSERT_TRUE(node->LoadModel("a", a_path, "auto", "").ok());
    auto b = node->LoadModel("b", b_path, "auto", "");
    if (mode == "static") {
      EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted) << "static lent memory";
    } else {
      EXPECT_TRUE(b.ok()) << b.status();
    }
    node->Shutdown();
  }
}

// Eviction keeps the weights in host memory; the next activation uses that
// copy (not the checkpoint) and serves exactly the same tokens. A hard
// eviction fails in-flight requests; a draining one lets them finish.
TEST(NodeManager, ReactivationUsesTheHostCopyAndDrainingLetsRequestsFinish) {
  engine::testing::TempDir dir;
  const std::string path = engine::testing::WriteTinyModel(dir, "a", {});
  NodeOptions n;
  n.devices = {DeviceOptions{"cpu:0", 64ll << 20}};
  auto node = std::move(*NodeManager::Create(n));
  auto first = node->LoadModel("a", path, "auto", "");
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_FALSE(first->from_host_copy());
  EXPECT_EQ(first->state(), v1::MODEL_STATE_READY);
  const GenerationRequest r = Req("r", 1, 30, 40);
  const std::vector<int> want = Alone(path, r);

  v1::NodeGenerateRequest req;
  req.set_model("a");
  req.set_prompt("draining keeps me");
  req.mutable_sampling()->set_max_tokens(40);
  req.mutable_sampling()->set_ignore_eos(true);
  req.set_request_id("d");
  Done in_flight;
  ASSERT_TRUE(node->Submit(req, &in_flight).ok());
  ASSERT_TRUE(node->EvictModel("a", /*drain=*/true).ok());
  // Drained before the model went: counted out as the engine hands over the
  // result, the hand-over itself completing at once (not before EvictModel
  // returns: a bare Finished() here raced the device worker).
  ASSERT_TRUE(in_flight.AwaitDone(absl::Seconds(10)));
  ASSERT_TRUE(in_flight.result.ok()) << in_flight.result.status();
  EXPECT_EQ(in_flight.result->output_tokens.size(), 40u);
  EXPECT_EQ(node->host_weights().stats().entries, 1);
  EXPECT_TRUE(node->ResidentModels().empty());

  auto again = node->LoadModel("a", path, "auto", "");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->from_host_copy());
  EXPECT_EQ(node->host_weights().stats().hits, 1);
  auto engine = node->devices()[0]->Find("a");
  Done d;
  ASSERT_TRUE(engine->Submit(r, &d).ok());
  ASSERT_TRUE(WaitFor([&] { return d.Finished(); }, absl::Seconds(30)));
  ASSERT_TRUE(d.result.ok()) << d.result.status();
  EXPECT_EQ(d.result->output_tokens, want);

  // A hard eviction fails what is in flight, with UNAVAILABLE.
  req.set_request_id("h");
  req.mutable_sampling()->set_max_tokens(200);
  Done hard;
  ASSERT_TRUE(node->Submit(req, &hard).ok());
  ASSERT_TRUE(node->EvictModel("a").ok());
  ASSERT_TRUE(WaitFor([&] { return hard.Finished(); }, absl::Seconds(10)));
  EXPECT_EQ(hard.result.status().code(), absl::StatusCode::kUnavailable);
  // The second eviction reused the copy it was activated from: no new one.
  EXPECT_EQ(node->host_weights().stats().puts, 1);
  EXPECT_EQ(node->host_weights().stats().entries, 1);
  node->Shutdown();
}

namespace remap {

engine::SyntheticModelSpec Spec(uint64_t seed) {
  engine::SyntheticModelSpec s;
  s.layers = 8;
  s.hidden = 128;
  s.intermediate = 512;
  s.seed = seed;
  return s;
}

constexpr int64_t kPage = 16 << 10;

// Two tiny models' weight pages plus 100 pages of KV (4 KiB a token: room
// for about two of five 150-token requests).
int64_t TwoModelsAndSomeKv(const std::string& a_path, const std::string& b_path) {
  auto pages_of = [&](const std::string& path) {
    ModelEngineOptions o;
    o.path = path;
    const int64_t b = *ModelEngine::WeightBytesNeeded(o);
    return (b + kPage - 1) / kPage * kPage;
  };
  return pages_of(a_path) + pages_of(b_path) + 100 * kPage;
}

// Mirage's two-model case on one device: a burst on A while B is idle.
// With remapping on, A's KV shortfall is met by B's weight layers first
// (B inactive), then A's own; every output stays exact, B serves a request
// while its layers stream, and once the burst is over the layers come back.
TEST(DeviceWorker, KvShortfallBorrowsAnIdleModelsLayersFirstAndGivesThemBack) {
  engine::testing::TempDir dir;
  const std::string a_path = engine::testing::WriteTinyModel(dir, "a", Spec(51));
  const std::string b_path = engine::testing::WriteTinyModel(dir, "b", Spec(52));
  const int64_t memory = TwoModelsAndSomeKv(a_path, b_path);
  DeviceMemoryOptions mem = testing::HostPages(kPage);
  mem.remap.enabled = true;
  mem.remap.revert_after = absl::Seconds(2);  // sanitizer builds step slowly
  auto w = std::move(*DeviceWorker::Create("cpu:0", memory, mem));
  auto a = testing::Activate("a", a_path, w.get());
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = testing::Activate("b", b_path, w.get());
  ASSERT_TRUE(b.ok()) << b.status();
  const int64_t weights = w->balloon()->stats().weight_bytes;

  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 5; ++i) reqs.push_back(Req("a" + std::to_string(i), 60 + i, 120, 30));
  std::vector<std::unique_ptr<Done>> done;
  // The worker stops before the sinks go, whatever fails below.
  auto stop = absl::MakeCleanup([&] { w->Stop(); });
  for (const auto& r : reqs) {
    done.push_back(std::make_unique<Done>());
    ASSERT_TRUE((*a)->Submit(r, done.back().get()).ok());
  }
  // A's shortfall lends layers (B, inactive, first: memory::PlanRemap's
  // order, tested in remap_plan_test). The counter moves at once; the
  // per-model gauge only at the next pass.
  ASSERT_TRUE(WaitFor([&] { return w->Usage().remap.remap_events > 0; }, absl::Seconds(120)))
      << "no layer was ever lent";
  EXPECT_LT(w->balloon()->stats().weight_bytes, weights);
  // B serves while its layers stream.
  Done db;
  const GenerationRequest rb = Req("b0", 70, 30, 20);
  ASSERT_TRUE((*b)->Submit(rb, &db).ok());
  for (auto& d : done) ASSERT_TRUE(d->AwaitDone(absl::Seconds(120)));
  ASSERT_TRUE(db.AwaitDone(absl::Seconds(60)));
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_TRUE(done[i]->result.ok()) << done[i]->result.status();
    EXPECT_EQ(done[i]->result->output_tokens, Alone(a_path, reqs[i])) << reqs[i].id;
  }
  ASSERT_TRUE(db.result.ok()) << db.result.status();
  EXPECT_EQ(db.result->output_tokens, Alone(b_path, rb));
  const RemapStats during = w->Usage().remap;
  EXPECT_GT(during.remap_events, 0);
  EXPECT_GT(during.streamed_bytes, 0);
  // The burst is over: every layer comes back, one per pass.
  ASSERT_TRUE(WaitFor(
      [&] {
        for (const auto& [m, n] : w->Usage().remap.layers)
          if (n > 0) return false;
        return true;
      },
      absl::Seconds(30)))
      << "layers were not taken back";
  EXPECT_EQ(w->balloon()->stats().weight_bytes, weights);
  EXPECT_GT(w->Usage().remap.revert_events, 0);
  // And the models still serve exactly with everything resident.
  Done da;
  ASSERT_TRUE((*a)->Submit(reqs[0], &da).ok());
  ASSERT_TRUE(da.AwaitDone(absl::Seconds(60)));
  ASSERT_TRUE(da.result.ok());
  EXPECT_EQ(da.result->output_tokens, Alone(a_path, reqs[0]));
  w->Stop();
}

// An idle lender that gets a request is over its cap: with T_T profiled
// at 10 s a layer (layer_transfer), a busy model's cap is 0, so only the
// idle B lends to A's burst, and once B has work every layer it lent
// must come back. A's burst holds the KV, so A's newest sequences give
// theirs back for them (preempted, recomputed: every output stays exact).
// The quiet time is long, so only that forced revert takes layers back.
TEST(DeviceWorker, AnIdleLenderThatGetsARequestTakesItsLayersBackAtOnce) {
  engine::testing::TempDir dir;
  const std::string a_path = engine::testing::WriteTinyModel(dir, "a", Spec(61));
  const std::string b_path = engine::testing::WriteTinyModel(dir, "b", Spec(62));
  const int64_t memory = TwoModelsAndSomeKv(a_path, b_path);
  DeviceMemoryOptions mem = testing::HostPages(kPage);
  mem.remap.enabled = true;
  mem.remap.revert_after = absl::Seconds(600);
  mem.remap.layer_transfer = absl::Seconds(10);
  auto w = std::move(*DeviceWorker::Create("cpu:0", memory, mem));
  // Both models' T_c is timed at activation (a busy model's cap needs it:
  // with none known, a cap is the floor).
  auto a = testing::Activate("a", a_path, w.get(), /*prepare_remap=*/true);
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = testing::Activate("b", b_path, w.get(), /*prepare_remap=*/true);
  ASSERT_TRUE(b.ok()) << b.status();
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 5; ++i) reqs.push_back(Req("a" + std::to_string(i), 80 + i, 120, 60));
  std::vector<std::unique_ptr<Done>> done;
  auto stop = absl::MakeCleanup([&] { w->Stop(); });
  for (const auto& r : reqs) {
    done.push_back(std::make_unique<Done>());
    ASSERT_TRUE((*a)->Submit(r, done.back().get()).ok());
  }
  ASSERT_TRUE(WaitFor([&] { return w->Usage().remap.remap_events > 0; }, absl::Seconds(120)))
      << "no layer was ever lent";
  Done db;
  const GenerationRequest rb = Req("b0", 90, 30, 120);
  ASSERT_TRUE((*b)->Submit(rb, &db).ok());
  RemapStats forced;  // the counters when the forced revert is first seen
  ASSERT_TRUE(WaitFor(
      [&] {
        forced = w->Usage().remap;
        return forced.forced_reverts > 0;
      },
      absl::Seconds(120)))
      << "B's layers never came back while A held the KV";
  EXPECT_GT(forced.forced_shed_bytes, 0);
  EXPECT_EQ(forced.layers.at("b"), 0);  // back to its cap (0) in one go
  ASSERT_TRUE(db.AwaitDone(absl::Seconds(120)));
  ASSERT_TRUE(db.result.ok()) << db.result.status();
  EXPECT_EQ(db.result->output_tokens, Alone(b_path, rb));
  int preemptions = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_TRUE(done[i]->AwaitDone(absl::Seconds(120)));
    ASSERT_TRUE(done[i]->result.ok()) << done[i]->result.status();
    EXPECT_EQ(done[i]->result->output_tokens, Alone(a_path, reqs[i])) << reqs[i].id;
    preemptions += done[i]->result->preemptions;
  }
  EXPECT_GT(preemptions, 0);  // the newest gave their KV back
  // Once no model could lend more (B at its floor, then both busy: caps
  // 0), A's blocked admissions were answered without waiting for the
  // device's steps.
  EXPECT_GT(w->Usage().kv_reclaims.nothing, 0);
  w->Stop();
}

}  // namespace remap

}  // namespace
}  // namespace ballast::node_manager
