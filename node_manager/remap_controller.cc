#include "node_manager/remap_controller.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace ballast::node_manager {
namespace {

// A remapping whose undo failed lost weight layers: the engine would serve
// garbage or fault, so it fails its requests and refuses new ones from now
// on (the model must be reloaded).
void CloseIfBroken(engine::ModelEngine& e, const absl::Status& why) {
  if (e.remapper() == nullptr || !e.remapper()->broken()) return;
  spdlog::error("model {}: closed: its weight layers were lost while remapping ({})", e.name(),
                why.ToString());
  e.Close(absl::InternalError(absl::StrCat("model ", e.name(),
                                           " lost weight layers in a failed remapping (",
                                           why.message(), "); evict and load it again")));
}

// The most bytes taking `e`'s lent layers back to `target` maps again:
// what it lends now less what `target` layers free at least. Layers lend
// their whole pages only, so their sizes differ (an 8B layer of 6.5
// 64 MiB pages lends 5 or 6), and the smallest layer's bytes times the
// layers undercounts: the exchange then fails on the budget every pass
// while the room made for it is taken again.
int64_t RevertBytes(const engine::ModelEngine& e, int target, int64_t least) {
  const std::shared_ptr<memory::WeightPages>& pages = e.options().weight_pages;
  const int64_t lent = pages != nullptr ? pages->lent_bytes() : 0;
  return std::max<int64_t>(0, lent - target * least);
}

// The model lending most past its cap (its decode steps got faster than
// its copies, or the other busy models' copies took the link), -1 if
// none: its copies hold most of the link, and the others' caps may allow
// theirs once it is back. Ties: the reverse of donor order, as for any
// revert.
int FurthestOverCap(const std::vector<memory::RemapCandidate>& cands) {
  int next = -1, most = 0;
  const std::vector<size_t> order = memory::DonorOrder(cands);
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const memory::RemapCandidate& c = cands[*it];
    if (c.alpha - c.alpha_cap > most) {
      most = c.alpha - c.alpha_cap;
      next = static_cast<int>(*it);
    }
  }
  return next;
}

}  // namespace

void RemapController::ApplyProfile(
    const std::vector<std::shared_ptr<engine::ModelEngine>>& engines) const {
  if (options_.layer_transfer <= absl::ZeroDuration()) return;
  for (const auto& e : engines) {
    if (engine::WeightRemapper* r = e->remapper(); r != nullptr) {
      r->set_t_transfer(absl::ToDoubleSeconds(options_.layer_transfer));
    }
  }
}

void RemapController::ShareLink(
    const std::vector<std::shared_ptr<engine::ModelEngine>>& engines) const {
  // Only a model with requests steps, so only its copies take the link.
  double total = 0;
  std::vector<double> own(engines.size(), 0.0);
  for (size_t i = 0; i < engines.size(); ++i) {
    const engine::WeightRemapper* r = engines[i]->remapper();
    if (r != nullptr && engines[i]->HasWork()) own[i] = r->link_share();
    total += own[i];
  }
  for (size_t i = 0; i < engines.size(); ++i) {
    if (engine::WeightRemapper* r = engines[i]->remapper(); r != nullptr) {
      r->set_link_share(total - own[i]);
    }
  }
}

void RemapController::NoteEngines(
    const std::vector<std::shared_ptr<engine::ModelEngine>>& engines) {
  if (engines.size() == last_active_.size() &&
      std::all_of(engines.begin(), engines.end(),
                  [&](const auto& e) { return last_active_.count(e->name()) > 0; })) {
    return;  // the same models (every pass: a lookup each)
  }
  std::map<std::string, int64_t> now;
  for (const auto& e : engines) {
    auto it = last_active_.find(e->name());
    now[e->name()] = it != last_active_.end() ? it->second : ++clock_;
  }
  last_active_ = std::move(now);
}

std::vector<memory::RemapCandidate> RemapController::Candidates(
    const std::vector<std::shared_ptr<engine::ModelEngine>>& engines) const {
  ShareLink(engines);
  std::vector<memory::RemapCandidate> out;
  for (size_t i = 0; i < engines.size(); ++i) {
    const engine::WeightRemapper* r = engines[i]->remapper();
    memory::RemapCandidate c;
    c.owner = static_cast<int>(i);
    if (r != nullptr) {
      c.active = engines[i]->HasWork();
      auto it = last_active_.find(engines[i]->name());
      c.last_active = it == last_active_.end() ? 0 : it->second;
      c.alpha = r->alpha();
      // An inactive model's streaming costs nothing until it runs (then
      // Tick gives back what its cap no longer allows): the floor alone.
      c.alpha_cap = r->AlphaCap(options_.max_fraction, options_.respect_timing && c.active);
      c.layer_bytes = r->layer_bytes();
    }
    out.push_back(c);
  }
  return out;
}

bool RemapController::CanLend(
    const std::vector<std::shared_ptr<engine::ModelEngine>>& engines) const {
  ApplyProfile(engines);
  for (const memory::RemapCandidate& c : Candidates(engines)) {
    if (c.layer_bytes > 0 && c.alpha < c.alpha_cap) return true;
  }
  return false;
}

int64_t RemapController::Lend(const std::vector<std::shared_ptr<engine::ModelEngine>>& engines,
                              int64_t shortfall_bytes, absl::Time now,
                              const BeforeLend& before_lend) {
  last_shortfall_ = now;
  if (shortfall_bytes <= 0) return 0;
  ApplyProfile(engines);
  int64_t freed = 0;
  int64_t events = 0;
  std::vector<bool> asked(engines.size(), false);
  // One donor at a time, each asked once: a busy donor's copies take link
  // time from the next ones, whose caps are computed again after it.
  while (freed < shortfall_bytes) {
    std::vector<memory::RemapCandidate> cands = Candidates(engines);
    for (size_t i = 0; i < cands.size(); ++i) {
      if (asked[i]) cands[i].alpha_cap = std::min(cands[i].alpha_cap, cands[i].alpha);
    }
    const std::vector<int> target = memory::PlanRemap(cands, shortfall_bytes - freed);
    int next = -1;
    for (size_t i : memory::DonorOrder(cands)) {
      if (target[i] > cands[i].alpha) {
        next = static_cast<int>(i);
        break;
      }
    }
    if (next < 0) break;
    const auto i = static_cast<size_t>(next);
    asked[i] = true;
    // Timed for the log line only (the decisions take no clock).
    const absl::Time t0 = absl::Now();
    if (before_lend) before_lend(*engines[i]);
    const absl::Time t1 = absl::Now();
    engine::WeightRemapper* r = engines[i]->remapper();
    r->set_respect_timing(options_.respect_timing && cands[i].active);
    auto got = r->SetAlpha(target[i]);
    if (!got.ok()) {
      spdlog::warn("model {}: lending {} weight layers to KV failed: {}", engines[i]->name(),
                   target[i], got.status().ToString());
      CloseIfBroken(*engines[i], got.status());
      continue;
    }
    freed += *got;
    ++events;
    spdlog::info(
        "model {}: {} of {} weight layers lent to KV ({} slot(s), T_T {:.3f} ms, "
        "T_c {:.3f} ms per layer (x{:.2f} for measured stalls), {:.0f}% of the link taken by "
        "other models; its steps in flight ended in {:.1f} ms, the exchange took {:.1f} ms)",
        engines[i]->name(), r->alpha(), r->num_layers(), r->plan().slots, r->t_transfer() * 1e3,
        r->t_compute() * 1e3, r->stall_factor(), r->link_others() * 100,
        absl::ToDoubleMilliseconds(t1 - t0), absl::ToDoubleMilliseconds(absl::Now() - t1));
  }
  absl::MutexLock lock(&mu_);
  stats_.remap_events += events;
  if (freed < shortfall_bytes) ++stats_.capped_events;
  return std::max<int64_t>(freed, 0);
}

void RemapController::Tick(const std::vector<std::shared_ptr<engine::ModelEngine>>& engines,
                           memory::Balloon& balloon, size_t slab_bytes, absl::Time now,
                           const MakeRoom& make_room, const Quiesce& quiesce) {
  RemapStats sample;
  for (const auto& e : engines) {
    const engine::WeightRemapper* r = e->remapper();
    if (r == nullptr) continue;
    sample.layers[e->name()] = r->alpha();
  }
  ApplyProfile(engines);
  std::vector<memory::RemapCandidate> cands = Candidates(engines);
  // A model lending more than its cap now allows goes first and needs no
  // quiet time: its streaming stalls every step. Else the reverse donor
  // order, once quiet.
  int next = FurthestOverCap(cands);
  const bool over = next >= 0;
  if (next < 0 && now - last_shortfall_ >= options_.revert_after) next = memory::RevertNext(cands);
  Reverted done;
  if (next >= 0) {
    memory::RemapCandidate& c = cands[static_cast<size_t>(next)];
    done = Revert(*engines[static_cast<size_t>(next)], &c, over, balloon, slab_bytes, make_room,
                  quiesce);
    if (done.reverted > 0) sample.layers[engines[static_cast<size_t>(next)]->name()] = c.alpha;
  }
  absl::MutexLock lock(&mu_);
  CountStreaming(engines);
  stats_.layers = std::move(sample.layers);
  stats_.lendable_bytes = memory::LendableBytes(cands);
  stats_.revert_events += done.reverted;
  stats_.forced_reverts += done.forced;
  stats_.forced_shed_bytes += done.shed;
}

RemapController::Reverted RemapController::Revert(engine::ModelEngine& e, memory::RemapCandidate* c,
                                                  bool over, memory::Balloon& balloon,
                                                  size_t slab_bytes, const MakeRoom& make_room,
                                                  const Quiesce& quiesce) {
  // Over its cap: back to the cap at once. Else one layer.
  const int target = over ? c->alpha_cap : c->alpha - 1;
  const int64_t need = RevertBytes(e, target, c->layer_bytes) + static_cast<int64_t>(slab_bytes);
  // Empty slabs are unmapped only when they and the free budget suffice:
  // else every pass would unmap the ready buffer and remap it when idle.
  const int64_t empty = balloon.arena()->stats().slabs_empty * static_cast<int64_t>(slab_bytes);
  const bool room = balloon.FreeBytes() + empty >= need;
  // Nothing changes unless it fits or may be made to fit: the steps in
  // flight keep running.
  if (!room && !(over && make_room)) return {};
  if (quiesce) quiesce();
  if (room) balloon.arena()->ReclaimFreeSlabs();
  Reverted done;
  if (over && balloon.FreeBytes() < need && make_room) done.shed = make_room(need, &e);
  if (balloon.FreeBytes() < need) return done;
  auto got = e.remapper()->SetAlpha(target);
  if (!got.ok()) {
    spdlog::warn("model {}: taking {} weight layer(s) back from KV failed: {}", e.name(),
                 c->alpha - target, got.status().ToString());
    CloseIfBroken(e, got.status());
    return done;
  }
  done.reverted = 1;
  done.forced = done.shed > 0 ? 1 : 0;
  const double fix = e.remapper()->stall_factor();
  spdlog::info("model {}: took {} weight layer(s) back from KV ({} still lent{}{})", e.name(),
               c->alpha - target, e.remapper()->alpha(),
               done.shed > 0 ? absl::StrCat("; running sequences gave back ", done.shed, " bytes")
                             : std::string(),
               fix < 1 ? fmt::format("; its copies stalled: T_c x{:.2f}", fix) : std::string());
  c->alpha = e.remapper()->alpha();
  return done;
}

void RemapController::CountStreaming(
    const std::vector<std::shared_ptr<engine::ModelEngine>>& engines) {
  for (const auto& e : engines) {
    if (e->remapper() == nullptr) continue;
    const engine::LayerStreamingStats now_stats = e->remapper()->streaming_stats();
    engine::LayerStreamingStats& seen = seen_[e->name()];
    if (now_stats.streamed_bytes >= seen.streamed_bytes) {
      stats_.streamed_bytes += now_stats.streamed_bytes - seen.streamed_bytes;
      stats_.stall_seconds += std::max(0.0, now_stats.stall_seconds - seen.stall_seconds);
    } else {  // a new engine of the same name
      stats_.streamed_bytes += now_stats.streamed_bytes;
      stats_.stall_seconds += now_stats.stall_seconds;
    }
    seen = now_stats;
  }
}

RemapStats RemapController::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

}  // namespace ballast::node_manager
