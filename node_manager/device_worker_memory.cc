// DeviceWorker's memory ladder across its models (device_worker.h): a
// model short of KV asking the others (ReclaimFor), operators shedding KV
// (ShedKv), and weights mapped for an activation (ReserveWeights), each by
// ShedForShortfall over every engine's holdings.
#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "memory/memory_ladder.h"
#include "node_manager/device_worker.h"
#include "spdlog/spdlog.h"

namespace ballast::node_manager {

int64_t DeviceWorker::ReclaimFor(const std::string& model, int64_t bytes, uint64_t newer_than) {
  const std::shared_ptr<engine::ModelEngine> engine = Find(model);
  if (!engine) return 0;
  // The steps already on the device hold their sequences' blocks (and
  // read their weights): they end before any of those is shed or lent.
  // Ending them all (a drain) is a wait for the device, so each rung waits
  // only for the steps that read what it takes:
  //  * lent layers: the lenders' own steps (the others read neither their
  //    weights nor the pages lent). With no idle session KV on the device
  //    they are the ladder's first rung, for an admission and for a
  //    running sequence's growth alike (the growth of the sequences that
  //    lent layers let in used to drain the device at every lend);
  //  * idle session KV: every step (a step in flight may keep a session;
  //    ending it may also free the room);
  //  * newer running sequences (growth): the steps of the models the
  //    shedding plan takes them from (they hold the blocks); the others'
  //    steps go on (before, each growth's shedding ended every model's
  //    steps: 20-80 ms of the device's overlap each on the H200).
  // Under KV pressure every blocked admission (newer_than max: idle
  // session KV and lent layers only) asks at every step boundary, so an
  // admission's ask that nothing could answer (no idle session KV, and no
  // model below its remapping cap) returns at once; a session a step in
  // flight keeps is seen at the next boundary's ask, the request admitted
  // a step later.
  const bool admission = newer_than == std::numeric_limits<uint64_t>::max();
  const bool sessions = AnyIdleSessionKv(engine.get());
  const bool layers = remap_ && remap_->CanLend(Engines());
  if (admission && !sessions && !layers) {
    absl::MutexLock lock(&mu_);
    ++reclaims_.nothing;
    return 0;
  }
  {
    absl::MutexLock lock(&mu_);
    ++reclaims_.asked;
  }
  // Where the ask's time goes (logged when slow): lends, the idle
  // sessions' drain and shedding, the victims' steps ending, and the
  // victims' sequences shed.
  AskTimes times;
  const absl::Time began = absl::Now();
  auto timed = [](double* ms, const auto& f) {
    const absl::Time t0 = absl::Now();
    const auto r = f();
    *ms += absl::ToDoubleMilliseconds(absl::Now() - t0);
    return r;
  };
  auto lend = [&](int64_t want) {
    return timed(&times.lend_ms, [&] {
      return remap_->Lend(Engines(), want, absl::Now(), [this](const engine::ModelEngine& donor) {
        DrainEngine(donor, &StepDrains::lender);
      });
    });
  };
  // The ladder's rungs 2-4 and 6 (device_worker.h): idle session KV, lent
  // weight layers, then newer running sequences.
  int64_t freed = 0;
  if (!sessions && layers) {
    freed = lend(bytes);
    if (freed >= bytes || admission)
      return LogSlowAsk(model, bytes, admission, freed, began, times);
  }
  if (sessions) {
    freed += timed(&times.sessions_ms, [&] {
      Drain(&StepDrains::reclaim);
      return ShedForShortfall(bytes - freed, ShedFor::kModel, engine.get(),
                              std::numeric_limits<uint64_t>::max());
    });
    if (freed < bytes && remap_) freed += lend(bytes - freed);
  }
  if (freed < bytes && !admission) {
    times.victims = timed(&times.victims_ms,
                          [&] { return DrainVictims(bytes - freed, engine.get(), newer_than); });
    // The plan DrainVictims drained for: the other models' steps go on.
    freed += timed(&times.shed_ms, [&] {
      return ShedForShortfall(bytes - freed, ShedFor::kModel, engine.get(), newer_than,
                              /*peek=*/true);
    });
  }
  return LogSlowAsk(model, bytes, admission, freed, began, times);
}

int64_t DeviceWorker::LogSlowAsk(const std::string& model, int64_t bytes, bool admission,
                                 int64_t freed, absl::Time began, const AskTimes& t) {
  const absl::Time now = absl::Now();
  const double ms = absl::ToDoubleMilliseconds(now - began);
  if (ms < kSlowAskMs) return freed;
  if (now - slow_ask_logged_ < kSlowAskLogEvery) {
    ++slow_asks_unlogged_;
    return freed;
  }
  slow_ask_logged_ = now;
  const int64_t unlogged = std::exchange(slow_asks_unlogged_, 0);
  spdlog::info(
      "model {}: asked the other models for {} bytes of KV ({}) in {:.1f} ms: lends {:.1f}, idle "
      "sessions {:.1f}, {} victim model(s)' steps ended in {:.1f}, their sequences shed in "
      "{:.1f}; {} bytes freed{}",
      model, bytes, admission ? "an admission" : "growth", ms, t.lend_ms, t.sessions_ms, t.victims,
      t.victims_ms, t.shed_ms, freed,
      unlogged > 0 ? absl::StrCat(" (", unlogged, " slow ask(s) before it not logged)") : "");
  return freed;
}

int DeviceWorker::DrainVictims(int64_t shortfall_bytes, const engine::ModelEngine* spare,
                               uint64_t running_after) {
  // A victim's steps ending may finish sequences and change the plan, so
  // plan again until every model it takes from has no step in flight;
  // nothing else changes the holdings meanwhile (this thread plans every
  // model's steps), so the shedding that follows takes from these.
  std::vector<const engine::ModelEngine*> drained;
  for (bool more = true; more;) {
    more = false;
    for (const engine::ModelEngine* v : ShedVictims(shortfall_bytes, spare, running_after)) {
      if (std::find(drained.begin(), drained.end(), v) != drained.end()) continue;
      DrainEngine(*v, &StepDrains::shed);
      drained.push_back(v);
      more = true;
    }
  }
  return static_cast<int>(drained.size());
}

std::vector<const engine::ModelEngine*> DeviceWorker::ShedVictims(int64_t shortfall_bytes,
                                                                  const engine::ModelEngine* spare,
                                                                  uint64_t running_after) {
  // As planned (no step ends): only the plan's engines are drained.
  const ShedPlan plan = PlanShed(shortfall_bytes, spare, running_after, /*peek=*/true);
  // Every owner in the plan: ShedForShortfall takes at most these (it
  // stops once the room is made, maybe before the plan's last).
  std::vector<const engine::ModelEngine*> out;
  for (size_t i : plan.order) {
    const engine::ModelEngine* e = plan.engines[static_cast<size_t>(plan.holders[i].owner)].get();
    if (std::find(out.begin(), out.end(), e) == out.end()) out.push_back(e);
  }
  return out;
}

DeviceWorker::ShedPlan DeviceWorker::PlanShed(int64_t shortfall_bytes,
                                              const engine::ModelEngine* spare,
                                              uint64_t running_after, bool peek) {
  ShedPlan p;
  GatherHolders(spare, running_after, /*with_slabs=*/false, &p.engines, &p.holders, &p.source,
                peek);
  p.order = memory::PlanKvShedding(p.holders, std::max<int64_t>(shortfall_bytes, 1));
  return p;
}

bool DeviceWorker::AnyIdleSessionKv(const engine::ModelEngine* spare) const {
  for (const auto& e : Engines()) {
    if (e.get() != spare && e->KeepsSessionKv()) return true;
  }
  return false;
}

std::function<int64_t(int64_t, uint64_t)> DeviceWorker::ReclaimKvFor(const std::string& model) {
  if (!balloon_) return nullptr;
  return [this, model](int64_t bytes, uint64_t newer_than) {
    return ReclaimFor(model, bytes, newer_than);
  };
}

absl::StatusOr<int64_t> DeviceWorker::ShedKv(int64_t bytes) {
  int64_t freed = 0;
  if (auto st = RunOnStepThread([&] {
        freed = ShedForShortfall(bytes, ShedFor::kAnyone);
        return absl::OkStatus();
      });
      !st.ok()) {
    return st;
  }
  return freed;
}

absl::StatusOr<std::unique_ptr<memory::WeightPages>> DeviceWorker::ReserveWeights(int64_t bytes) {
  if (!balloon_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "device ", name_, " has static memory: weights are not mapped from a balloon"));
  }
  std::unique_ptr<memory::WeightPages> pages;
  absl::Status st = RunOnStepThread([&]() -> absl::Status {
    auto p = ReclaimAndMap(bytes);
    if (!p.ok()) return p.status();
    pages = std::move(*p);
    return absl::OkStatus();
  });
  if (!st.ok()) return st;
  return pages;
}

absl::StatusOr<std::unique_ptr<memory::WeightPages>> DeviceWorker::ReclaimAndMap(int64_t bytes) {
  memory::KvArena& arena = *balloon_->arena();
  auto pages = balloon_->MapWeights(static_cast<size_t>(bytes));
  if (pages.ok()) return pages;
  arena.ReclaimFreeSlabs();  // the ready-slab buffer first
  pages = balloon_->MapWeights(static_cast<size_t>(bytes));
  // The memory ladder (memory_ladder.h) across every model on the device,
  // only as far as the shortfall, with the freed blocks packed into whole
  // slabs (ShedAndCompact). Should pages still not map (a model whose
  // blocks could not move), the ladder's order again until they do or
  // nothing is left to shed.
  int64_t shed = 0;
  if (!pages.ok()) {
    shed += ShedAndCompact(bytes, nullptr);
    pages = balloon_->MapWeights(static_cast<size_t>(bytes));
  }
  while (!pages.ok()) {
    const int64_t got = ShedForShortfall(bytes - balloon_->HeadroomBytes(), ShedFor::kWeights);
    if (got == 0) break;
    shed += got;
    arena.ReclaimFreeSlabs();
    pages = balloon_->MapWeights(static_cast<size_t>(bytes));
  }
  if (!pages.ok()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "weights need ", bytes, " bytes but device ", name_, " has ", balloon_->FreeBytes(),
        " free even after the resident models gave back ", shed, " bytes of KV"));
  }
  if (shed > 0)
    spdlog::info("device {}: resident models shed {} bytes of KV for weights", name_, shed);
  return pages;
}

int64_t DeviceWorker::MakeRoomForWeights(int64_t bytes, const engine::ModelEngine* spare) {
  // The memory ladder's rungs as ReclaimAndMap climbs them, the other
  // models' holdings first, then the spared model's own too: a model left
  // over its cap stalls every step on its copies.
  int64_t shed = 0;
  for (const engine::ModelEngine* skip :
       {spare, static_cast<const engine::ModelEngine*>(nullptr)}) {
    shed += ShedAndCompact(bytes, skip);
  }
  return shed;
}

int64_t DeviceWorker::ShedAndCompact(int64_t bytes, const engine::ModelEngine* spare) {
  int64_t shed = 0;
  std::vector<int64_t> stuck;  // slabs a drain left part-used
  while (balloon_->FreeBytes() < bytes) {
    const Compaction c = CompactForWeights(bytes, &stuck);
    if (balloon_->FreeBytes() >= bytes) break;
    // Blocks that could not move keep their slabs: shed whole ones.
    if (c.failed) shed += ShedWholeSlabs(bytes, spare);
    if (balloon_->FreeBytes() >= bytes) break;
    const int64_t got =
        ShedForShortfall(bytes - balloon_->HeadroomBytes(), ShedFor::kWeights, spare);
    if (got == 0) break;
    shed += got;
  }
  return shed;
}

void DeviceWorker::TickRemap(const std::vector<std::shared_ptr<engine::ModelEngine>>& engines,
                             absl::Time now) {
  remap_->Tick(
      engines, *balloon_, slab_bytes_, now,
      [this](int64_t bytes, const engine::ModelEngine* spare) {
        return MakeRoomForWeights(bytes, spare);
      },
      [this] { Drain(&StepDrains::remap); });
}

void DeviceWorker::GatherHolders(const engine::ModelEngine* spare, uint64_t running_after,
                                 bool with_slabs,
                                 std::vector<std::shared_ptr<engine::ModelEngine>>* engines,
                                 std::vector<memory::KvHolder>* holders,
                                 std::vector<engine::KvHolding>* source, bool peek) {
  *engines = Engines();
  for (size_t i = 0; i < engines->size(); ++i) {
    if ((*engines)[i].get() == spare) continue;
    engine::ModelEngine& e = *(*engines)[i];
    for (engine::KvHolding& h : peek ? e.PeekKvHoldings(with_slabs) : e.KvHoldings(with_slabs)) {
      if (h.kind == engine::KvHolding::Kind::kRunning && h.recency <= running_after) continue;
      memory::KvHolder m;
      m.kind = h.kind == engine::KvHolding::Kind::kCachedSession
                   ? memory::KvHolder::Kind::kIdleSession
                   : memory::KvHolder::Kind::kRunning;
      m.owner = static_cast<int>(i);
      m.id = h.id;
      m.priority = h.priority;
      m.recency = static_cast<int64_t>(h.recency);
      m.bytes = h.bytes;
      m.slabs = std::move(h.slabs);
      holders->push_back(std::move(m));
      source->push_back(std::move(h));
    }
  }
}

DeviceWorker::Compaction DeviceWorker::CompactForWeights(int64_t bytes,
                                                         std::vector<int64_t>* stuck) {
  if (balloon_->FreeBytes() >= bytes) return {};
  memory::KvArena& arena = *balloon_->arena();
  arena.ReclaimFreeSlabs();
  const auto slab = static_cast<int64_t>(arena.slab_bytes());
  const int64_t headroom = balloon_->HeadroomBytes();
  const int64_t shortfall = bytes - headroom;
  if (shortfall <= 0) return {};
  const int64_t releases = arena.stats().releases;
  const std::vector<int64_t> slabs =
      arena.BeginDrain((shortfall + slab - 1) / slab, stuck ? *stuck : std::vector<int64_t>{});
  if (slabs.empty()) return {};
  int64_t moved = 0, failed = 0;
  for (const auto& e : Engines()) {
    auto m = e->MoveKvOutOf(slabs);
    if (m.ok()) {
      moved += *m;
    } else {
      ++failed;
      spdlog::warn("device {}: model {} could not move its KV out of {} slab(s): {}", name_,
                   e->name(), slabs.size(), m.status().ToString());
    }
  }
  const std::vector<int64_t> left = arena.draining();
  arena.EndDrain();
  arena.ReclaimFreeSlabs();
  // Slabs unmapped since the drain began (emptied ones past the free-slab
  // buffer went at once): the budget itself may move meanwhile.
  const int64_t freed = (arena.stats().releases - releases) * slab;
  if (stuck != nullptr && !left.empty()) {
    stuck->insert(stuck->end(), left.begin(), left.end());
    std::sort(stuck->begin(), stuck->end());
  }
  spdlog::info(
      "device {}: moved {} bytes of KV out of {} slab(s) ({} left part-used); {} bytes "
      "of pages freed for weights",
      name_, moved, slabs.size(), left.size(), freed);
  absl::MutexLock lock(&mu_);
  ++compactions_.drains;
  compactions_.moved_bytes += moved;
  compactions_.freed_bytes += freed;
  compactions_.failed += failed;
  return {freed, failed > 0};
}

int64_t DeviceWorker::ShedWholeSlabs(int64_t bytes, const engine::ModelEngine* spare) {
  // Nothing to do where the room is there: the ready-slab buffer stays.
  if (balloon_->FreeBytes() >= bytes) return 0;
  memory::KvArena& arena = *balloon_->arena();
  arena.ReclaimFreeSlabs();
  // Unclamped: over budget, the slabs to empty cover the excess too.
  const int64_t shortfall = bytes - balloon_->HeadroomBytes();
  if (shortfall <= 0) return 0;
  const auto slab = static_cast<int64_t>(arena.slab_bytes());
  std::vector<std::shared_ptr<engine::ModelEngine>> engines;
  std::vector<memory::KvHolder> holders;
  std::vector<engine::KvHolding> source;
  GatherHolders(spare, 0, /*with_slabs=*/true, &engines, &holders, &source);
  int64_t freed = 0;
  for (size_t i :
       memory::PlanSlabShedding(holders, arena.SlabsInUse(), (shortfall + slab - 1) / slab)) {
    freed += ShedHolding(*engines[static_cast<size_t>(holders[i].owner)], source[i], -1,
                         ShedFor::kWeights);
  }
  arena.ReclaimFreeSlabs();
  return freed;
}

int64_t DeviceWorker::ShedForShortfall(int64_t shortfall_bytes, ShedFor what,
                                       const engine::ModelEngine* spare, uint64_t running_after,
                                       bool peek) {
  const ShedPlan plan = PlanShed(shortfall_bytes, spare, running_after, peek);
  int64_t freed = 0;
  for (size_t i : plan.order) {
    if (freed >= std::max<int64_t>(shortfall_bytes, 1)) break;
    // The last holding may give back only part (a session's later layers),
    // where those blocks serve the beneficiary as they are.
    engine::ModelEngine& e = *plan.engines[static_cast<size_t>(plan.holders[i].owner)];
    const bool partial =
        what == ShedFor::kAnyone || (what == ShedFor::kModel && spare != nullptr &&
                                     spare->kv_block_bytes() == e.kv_block_bytes());
    freed += ShedHolding(e, plan.source[i],
                         partial ? std::max<int64_t>(shortfall_bytes - freed, 1) : -1, what);
  }
  return freed;
}

int64_t DeviceWorker::ShedHolding(engine::ModelEngine& e, const engine::KvHolding& holding,
                                  int64_t bytes, ShedFor what) {
  const int64_t freed = e.Shed(holding, bytes);
  if (holding.kind == engine::KvHolding::Kind::kRunning && freed > 0) {
    absl::MutexLock lock(&mu_);
    auto it = sheds_.find(e.name());
    if (it != sheds_.end())
      ++(what == ShedFor::kWeights ? it->second.for_weights : it->second.for_kv);
  }
  return freed;
}

}  // namespace ballast::node_manager
