// RemapController over two CPU engines sharing one balloon: busy models'
// copies share the device's one host-to-device link, so a second busy
// model lends no layer the first one's copies leave no link time for; an
// idle model lends to its floor whatever the link; and when the link is
// oversubscribed (an idle lender got requests), the model furthest past
// its cap takes its layers back first; a busy model whose copies stall
// takes its layers back. Timings are
// set by hand (T_T from the options, T_c from an activation decode), so
// the caps are computed here: the test does not time anything.
#include "node_manager/remap_controller.h"

#include "engine/model_engine.h"
#include "engine/tokenizer.h"
#include "gtest/gtest.h"
#include "memory/balloon.h"
#include "memory/page_pool.h"
#include "tests/unit/engine/test_util.h"

namespace ballast::node_manager {
namespace {

using engine::ModelEngine;
using engine::testing::TempDir;

class Sink : public engine::GenerationSink {
 public:
  void OnToken(int, const std::string&, const engine::TokenLogprobs*) override {}
  void OnDone(absl::StatusOr<engine::GenerationResult>) override {}
};

struct Device {
  std::shared_ptr<memory::Balloon> balloon;
  std::vector<std::shared_ptr<ModelEngine>> engines;
};

// Two 8-layer models on one 64 MiB balloon, each with T_c 1 ms a layer.
Device TwoModels(const TempDir& dir, size_t page_bytes = 4096, size_t slab_bytes = 64 << 10) {
  Device d;
  auto pool = memory::HostPagePool::Create(page_bytes, 64 << 20);
  EXPECT_TRUE(pool.ok());
  memory::BalloonOptions bo;
  bo.memory_bytes = 64 << 20;
  bo.slab_bytes = slab_bytes;
  d.balloon = *memory::Balloon::Create(std::shared_ptr<memory::PagePool>(std::move(*pool)), bo);
  engine::SyntheticModelSpec spec;
  spec.layers = 8;
  for (const char* name : {"a", "b"}) {
    engine::ModelEngineOptions o;
    o.name = name;
    o.path = engine::testing::WriteTinyModel(dir, name, spec);
    auto need = ModelEngine::WeightBytesNeeded(o);
    EXPECT_TRUE(need.ok());
    auto pages = d.balloon->MapWeights(static_cast<size_t>(*need));
    EXPECT_TRUE(pages.ok()) << pages.status();
    o.weight_pages = std::move(*pages);
    o.kv_arena = d.balloon->arena();
    auto e = ModelEngine::Create(o);
    EXPECT_TRUE(e.ok()) << e.status();
    EXPECT_NE((*e)->remapper(), nullptr);
    (*e)->remapper()->SetActivationDecode(8e-3);
    d.engines.push_back(std::move(*e));
  }
  return d;
}

void Busy(ModelEngine& e, const std::string& id, Sink* sink) {
  engine::GenerationRequest req;
  req.id = id;
  req.prompt = {engine::ByteTokenizer::kBos, 65, 66};
  req.params.max_tokens = 4;
  ASSERT_TRUE(e.Submit(req, sink).ok());
  ASSERT_TRUE(e.HasWork());
}

// Remapping on, T_T 2.5 ms a layer: a busy model (T_c 1 ms) lends one
// layer alone.
RemapOptions SlowLink() {
  RemapOptions options;
  options.enabled = true;
  options.layer_transfer = absl::Microseconds(2500);
  return options;
}

TEST(RemapController, BusyModelsShareOneCopyLink) {
  TempDir dir;
  Sink sink;  // outlives the engines, which fail their requests into it
  Device d = TwoModels(dir);
  ModelEngine& a = *d.engines[0];
  ModelEngine& b = *d.engines[1];
  RemapController c(SlowLink());
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  Busy(a, "a1", &sink);
  Busy(b, "b1", &sink);

  // Alone, each busy model may lend one layer: its 2 copies of 2.5 ms
  // hide in the 3 ms between a slot's readers. a gives first (owner
  // order among equals); its copies then hold 62.5% of the link, so b's
  // copy would take 6.7 ms: b lends none, and the ask is capped.
  const int64_t huge = int64_t{1} << 30;
  EXPECT_GT(c.Lend(d.engines, huge, t0), 0);
  EXPECT_EQ(a.remapper()->alpha(), 1);
  EXPECT_EQ(b.remapper()->alpha(), 0);
  EXPECT_DOUBLE_EQ(a.remapper()->link_share(), 0.625);
  EXPECT_DOUBLE_EQ(b.remapper()->link_others(), 0.625);
  EXPECT_EQ(c.stats().capped_events, 1);
  EXPECT_FALSE(c.CanLend(d.engines));

  // a goes idle: it copies nothing now, so b has the link to itself, and
  // a, idle, lends to its floor (half its layers) first.
  a.Cancel("a1");
  for (int i = 0; i < 8 && a.HasWork(); ++i) a.Step();
  ASSERT_FALSE(a.HasWork());
  EXPECT_TRUE(c.CanLend(d.engines));
  c.Lend(d.engines, huge, t0);
  EXPECT_EQ(a.remapper()->alpha(), 4);
  EXPECT_EQ(b.remapper()->alpha(), 1);

  // a gets a request: its 6 copies a step (α 4 through 2 slots) and b's
  // 2 ask 250% of the link. Both are over their caps (0 each beside the
  // other); a, 4 past its cap against b's 1, takes its layers back first,
  // and then b has the link to itself again: within its cap, it keeps its
  // layer.
  Busy(a, "a2", &sink);
  const size_t slab = 64 << 10;
  c.Tick(d.engines, *d.balloon, slab, t0);  // t0: no quiet time, so only reverts past a cap
  EXPECT_EQ(a.remapper()->alpha(), 0);
  EXPECT_EQ(b.remapper()->alpha(), 1);
  c.Tick(d.engines, *d.balloon, slab, t0);  // within every cap now: nothing moves
  EXPECT_EQ(a.remapper()->alpha(), 0);
  EXPECT_EQ(b.remapper()->alpha(), 1);
  EXPECT_DOUBLE_EQ(b.remapper()->link_others(), 0.0);
  const RemapStats st = c.stats();
  EXPECT_EQ(st.revert_events, 1);
  EXPECT_EQ(st.forced_reverts, 0);  // the balloon had room: nothing shed
  EXPECT_EQ(st.layers.at("a"), 0);
  EXPECT_EQ(st.layers.at("b"), 1);
}

// Mirage's MRU among equal donors is of the most recently activated model:
// two idle models that never stepped lend in the order they were loaded,
// the later first (NoteEngines, in the engines' order); one loaded again
// after it left counts anew. Without NoteEngines, owner order.
TEST(RemapController, TheModelLoadedLastLendsFirst) {
  TempDir dir;
  Device d = TwoModels(dir);
  ModelEngine& a = *d.engines[0];
  ModelEngine& b = *d.engines[1];
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  const int64_t layer = a.remapper()->layer_bytes();
  {
    RemapController c(SlowLink());
    c.Lend(d.engines, layer, t0);  // owner order among equals
    EXPECT_EQ(a.remapper()->alpha(), 1);
    EXPECT_EQ(b.remapper()->alpha(), 0);
    ASSERT_TRUE(a.remapper()->SetAlpha(0).ok());
  }
  RemapController c(SlowLink());
  c.NoteEngines(d.engines);  // a, then b: b is the most recently activated
  c.Lend(d.engines, layer, t0);
  EXPECT_EQ(a.remapper()->alpha(), 0);
  EXPECT_EQ(b.remapper()->alpha(), 1);
  ASSERT_TRUE(b.remapper()->SetAlpha(0).ok());
  c.NoteEngines({d.engines[1]});  // a left
  c.NoteEngines(d.engines);       // and came back: now the latest
  c.Lend(d.engines, layer, t0);
  EXPECT_EQ(a.remapper()->alpha(), 1);
  EXPECT_EQ(b.remapper()->alpha(), 0);
  ASSERT_TRUE(a.remapper()->SetAlpha(0).ok());
  // Seen together, in the order given (the device's: activation), not by
  // name: b then a makes a the latest.
  RemapController c2(SlowLink());
  c2.NoteEngines({d.engines[1], d.engines[0]});
  c2.Lend(d.engines, layer, t0);
  EXPECT_EQ(a.remapper()->alpha(), 1);
  EXPECT_EQ(b.remapper()->alpha(), 0);
}

// Under rolling steps the device worker finishes steps in flight only for
// what reads the memory that changes: Lend hands each donor to
// `before_lend` before its layers go (its own steps read them), and Tick
// calls `quiesce` once, before a revert, and never for a tick that
// changes nothing (every tick used to drain the device, ten times a
// second).
TEST(RemapController, OnlyAChangeWaitsForTheStepsInFlight) {
  TempDir dir;
  Sink sink;  // outlives the engines, which fail their requests into it
  Device d = TwoModels(dir);
  ModelEngine& a = *d.engines[0];
  ModelEngine& b = *d.engines[1];
  RemapOptions options = SlowLink();
  options.revert_after = absl::Seconds(1);
  RemapController c(options);
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  const size_t slab = 64 << 10;
  std::vector<std::pair<std::string, int>> donors;  // name, alpha when handed over
  c.Lend(d.engines, int64_t{1} << 30, t0,
         [&](const ModelEngine& e) { donors.emplace_back(e.name(), e.remapper()->alpha()); });
  // Both idle: each lends to its floor, each handed over once, before.
  EXPECT_EQ(donors, (std::vector<std::pair<std::string, int>>{{"a", 0}, {"b", 0}}));
  EXPECT_EQ(a.remapper()->alpha(), 4);
  EXPECT_EQ(b.remapper()->alpha(), 4);

  int quiesced = 0;
  int alpha_seen = -1;
  auto quiesce = [&] {
    ++quiesced;
    alpha_seen = a.remapper()->alpha();
  };
  c.Tick(d.engines, *d.balloon, slab, t0, nullptr, quiesce);  // idle, no quiet time
  EXPECT_EQ(quiesced, 0);
  EXPECT_EQ(a.remapper()->alpha(), 4);

  Busy(a, "a1", &sink);  // a is now past its cap of 1: back at once
  c.Tick(d.engines, *d.balloon, slab, t0, nullptr, quiesce);
  EXPECT_EQ(quiesced, 1);
  EXPECT_EQ(alpha_seen, 4);  // before the change
  EXPECT_EQ(a.remapper()->alpha(), 1);
  c.Tick(d.engines, *d.balloon, slab, t0, nullptr, quiesce);  // within every cap
  EXPECT_EQ(quiesced, 1);

  // Quiet for revert_after: one layer a tick comes back, each a change.
  c.Tick(d.engines, *d.balloon, slab, t0 + absl::Seconds(2), nullptr, quiesce);
  EXPECT_EQ(quiesced, 2);
  EXPECT_EQ(a.remapper()->alpha() + b.remapper()->alpha(), 4);
}

// Each tick counts what the models could still lend (the heartbeat's
// kv_bytes_lendable, which the scheduler's KV-pressure eviction counts as
// room): an idle model up to its floor, a busy one up to its timed cap,
// less what each lends already.
TEST(RemapController, ATickCountsWhatTheModelsCouldStillLend) {
  TempDir dir;
  Sink sink;  // outlives the engines, which fail their requests into it
  Device d = TwoModels(dir);
  ModelEngine& a = *d.engines[0];
  const int64_t layer = a.remapper()->layer_bytes();
  ASSERT_GT(layer, 0);
  ASSERT_EQ(d.engines[1]->remapper()->layer_bytes(), layer);
  RemapController c(SlowLink());
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  const size_t slab = 64 << 10;
  EXPECT_EQ(c.stats().lendable_bytes, 0);  // no tick yet
  c.Tick(d.engines, *d.balloon, slab, t0);
  EXPECT_EQ(c.stats().lendable_bytes, (4 + 4) * layer);  // both idle: half their 8 layers
  Busy(a, "a1", &sink);
  c.Tick(d.engines, *d.balloon, slab, t0);
  EXPECT_EQ(c.stats().lendable_bytes, (1 + 4) * layer);  // a's copies hide for one layer only
  c.Lend(d.engines, int64_t{1} << 30, t0);
  EXPECT_EQ(a.remapper()->alpha(), 1);
  EXPECT_EQ(d.engines[1]->remapper()->alpha(), 4);
  c.Tick(d.engines, *d.balloon, slab, t0);  // no quiet time: nothing comes back
  EXPECT_EQ(c.stats().lendable_bytes, 0);
}

// T_c is measured beside other models' steps, and on the card a busy
// model's copies stalled a third of each step at a cap that predicted
// none. The measured stall corrects T_c: the model, now over its cap,
// takes its layers back at the next tick, and lends none until its copies
// would hide again.
TEST(RemapController, ABusyModelWhoseCopiesStallTakesItsLayersBack) {
  TempDir dir;
  Sink sink;
  Device d = TwoModels(dir);
  ModelEngine& a = *d.engines[0];
  const RemapOptions options = SlowLink();
  RemapController c(options);
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  const size_t slab = 64 << 10;
  Busy(a, "a1", &sink);
  const int64_t huge = int64_t{1} << 30;
  c.Lend({d.engines[0]}, huge, t0);
  ASSERT_EQ(a.remapper()->alpha(), 1);  // 2 copies of 2.5 ms hide in 3 ms
  c.Tick(d.engines, *d.balloon, slab, t0);
  EXPECT_EQ(a.remapper()->alpha(), 1);  // within its cap
  // Its streaming steps (8 ms forwards) waited 4 ms each for the copies.
  for (int i = 0; i < memory::StallCorrection::kWindow; ++i) {
    a.remapper()->ObserveStep(8e-3, 4e-3, /*decode_only=*/true);
  }
  EXPECT_DOUBLE_EQ(a.remapper()->stall_factor(), 0.5);
  EXPECT_DOUBLE_EQ(a.remapper()->t_compute(), 0.5e-3);
  EXPECT_EQ(a.remapper()->AlphaCap(options.max_fraction), 0);
  c.Tick(d.engines, *d.balloon, slab, t0);
  EXPECT_EQ(a.remapper()->alpha(), 0);
  EXPECT_EQ(c.stats().revert_events, 1);
  // Asked again, it lends nothing: the ask is capped.
  EXPECT_EQ(c.Lend({d.engines[0]}, huge, t0), 0);
  EXPECT_EQ(a.remapper()->alpha(), 0);
  EXPECT_EQ(c.stats().capped_events, 2);
}

TEST(RemapController, ATakeBackMakesRoomForEveryPageItMaps) {
  // Layers lend their whole pages only, so with pages that do not divide
  // a layer some lend a page more than the smallest. a lends 4 idle; busy,
  // its cap is 0 (T_T 10 ms against 3 ms of compute between a slot's
  // readers). KV fills the balloon to less than a's lent pages but more
  // than 4 of its smallest layers: the room must be made for the pages
  // (here by make_room, which frees the test's KV), and the layers come
  // back at the first tick.
  TempDir dir;
  Sink sink;  // outlives the engines
  RemapOptions options;
  options.enabled = true;
  options.layer_transfer = absl::Milliseconds(10);
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  // The first page size (a page is a slab here) at which a's first four
  // lent layers lend more than four of its smallest.
  Device d;
  std::unique_ptr<RemapController> c;
  int64_t least = 0, lent = 0, slab = 0;
  for (int pages = 3; pages <= 24 && lent <= 4 * least + slab; ++pages) {
    slab = 4096 * pages;
    d = TwoModels(dir, static_cast<size_t>(slab), static_cast<size_t>(slab));
    c = std::make_unique<RemapController>(options);
    least = d.engines[0]->remapper()->layer_bytes();
    c->Lend(d.engines, 4 * least, t0);
    ASSERT_EQ(d.engines[0]->remapper()->alpha(), 4);
    lent = d.engines[0]->options().weight_pages->lent_bytes();
  }
  ASSERT_GT(lent, 4 * least + slab) << "no page size tried splits the layers unevenly";
  ModelEngine& a = *d.engines[0];
  auto kv = *d.balloon->arena()->CreateAllocator(static_cast<size_t>(slab));
  std::vector<int> blocks;
  while (d.balloon->FreeBytes() >= lent) {
    auto b = kv->Allocate(1);
    ASSERT_TRUE(b.ok()) << b.status();
    blocks.push_back((*b)[0]);
  }
  ASSERT_GE(d.balloon->FreeBytes(), 4 * least + slab);
  Busy(a, "a1", &sink);
  int64_t asked = 0;
  auto make_room = [&](int64_t bytes, const engine::ModelEngine* spare) {
    EXPECT_EQ(spare, &a);
    asked = bytes;
    int64_t freed = 0;
    while (d.balloon->FreeBytes() < bytes && !blocks.empty()) {
      EXPECT_TRUE(kv->Free({blocks.back()}).ok());
      blocks.pop_back();
      d.balloon->arena()->ReclaimFreeSlabs();
      freed += slab;
    }
    return freed;
  };
  c->Tick(d.engines, *d.balloon, static_cast<size_t>(slab), t0, make_room);
  EXPECT_EQ(a.remapper()->alpha(), 0);
  EXPECT_EQ(a.options().weight_pages->lent_bytes(), 0);
  EXPECT_EQ(asked, lent + slab);
  EXPECT_EQ(c->stats().forced_reverts, 1);
  ASSERT_TRUE(kv->Free(blocks).ok());
}

}  // namespace
}  // namespace ballast::node_manager
