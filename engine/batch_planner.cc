#include "engine/batch_planner.h"

#include <algorithm>
#include <climits>
#include <utility>

namespace ballast::engine {

BatchPlanner::BatchPlanner(const BatchPlannerOptions& options, KvManager* kv)
    : options_(options), kv_(kv) {}

BatchPlanner::~BatchPlanner() {
  for (auto& s : running_) kv_->Free(&s->kv);
  for (auto& s : waiting_) kv_->Free(&s->kv);
}

namespace {

void AddChunk(StepPlan* plan, Sequence* s, int take) {
  const int end = s->num_computed + take;
  const bool last = end == static_cast<int>(s->tokens.size());
  const bool pending = s->tokens[static_cast<size_t>(s->num_computed)] == kPendingToken;
  plan->chunks.push_back({s, s->num_computed, take, last, pending ? s->pending_row : -1});
  // Everything but a single decode token is prefill work.
  if (!(take == 1 && last)) plan->prefill_tokens += take;
}

}  // namespace

StepPlan BatchPlanner::Plan(bool ahead) {
  StepPlan plan;
  int budget = options_.max_batch_tokens;
  PlanRunning(&plan, &budget, ahead);
  PlanAdmissions(&plan, &budget, ahead);
  PublishGrowth();
  return plan;
}

void BatchPlanner::PublishGrowth() { kv_->SetGrowthReserve(static_cast<int>(running_.size())); }

void BatchPlanner::PlanRunning(StepPlan* plan, int* budget, bool ahead) {
  // Oldest first. Preemption takes from the back, so indexes below i stay.
  for (size_t i = 0; i < running_.size() && *budget > 0; ++i) {
    Sequence* s = running_[i].get();
    const int take = std::min(s->remaining(), *budget);
    if (ahead) {
      if (s->pending() && static_cast<int>(s->tokens.size()) >= s->max_len) continue;  // ends
      if ((s->pending() && s->req.params.sampling.has_penalties()) ||
          !kv_->Reserve(&s->kv, s->num_computed + take)) {
        plan->drain = true;
        continue;
      }
      AddChunk(plan, s, take);
      *budget -= take;
      continue;
    }
    if (!ReserveOrPreempt(s, s->num_computed + take)) break;
    AddChunk(plan, s, take);
    *budget -= take;
  }
}

void BatchPlanner::PlanAdmissions(StepPlan* plan, int* budget, bool ahead) {
  bool reclaimed = ahead;  // ahead plans never reclaim
  while (*budget > 0 && !waiting_.empty() &&
         static_cast<int>(running_.size()) < options_.max_seqs) {
    Sequence* s = waiting_.front().get();
    // Checked before the prefix is attached (its blocks would be held by
    // a sequence that then waits).
    if (ahead && (s->req.lease || s->load || s->req.params.sampling.has_penalties())) {
      plan->drain = true;
      break;
    }
    AttachSessionPrefix(s);
    const int take = std::min(s->remaining(), *budget);
    const int tokens = s->num_computed + take;
    const int running = static_cast<int>(running_.size());
    auto fits = [&] {
      return kv_->FitsWatermark(s->kv, tokens, running) && kv_->Reserve(&s->kv, tokens);
    };
    bool ok = fits();
    if (!ok && options_.reclaim && !reclaimed) {
      // Other models' idle session KV (never their running sequences) is
      // free memory for an admission, as this engine's own is: without
      // this, a device whose arena other models' sessions fill admits
      // nothing, for good.
      // What they free serves this model only once it empties a slab (the
      // others' blocks are of other sizes): ask again while something is
      // freed and more room could still be ours.
      reclaimed = true;
      const int64_t headroom = kv_->HeadroomBlocks(running) * kv_->block_bytes();
      while (!ok && !kv_->AtCapacity() &&
             options_.reclaim(kv_->BytesNeeded(s->kv, tokens) + headroom,
                              std::numeric_limits<uint64_t>::max()) > 0) {
        ok = fits();
      }
    }
    // No room now: wait. Submit() refused requests that could never fit; in
    // elastic mode other models' running sequences may hold the memory for
    // a while. (An ahead plan could not ask the other models.)
    if (!ok) {
      const bool ask_later = ahead && options_.reclaim != nullptr;
      plan->drain = ask_later;
      if (!ask_later) s->kv_refused = true;
      break;
    }
    if (s->load) {
      plan->loads.push_back({s, std::move(s->load), s->load_from, s->load_resident_layers});
      s->load = nullptr;
    }
    AddChunk(plan, s, take);
    *budget -= take;
    s->admitted_once = true;
    s->kv_refused = false;
    s->admitted_at = KvRecencyNow();
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }
}

bool BatchPlanner::ReserveOrPreempt(Sequence* seq, int tokens) {
  const Sequence* reclaimed_for = nullptr;
  while (true) {
    if (kv_->Reserve(&seq->kv, tokens)) return true;
    if (running_.empty()) return false;
    // Other models' idle KV and sequences newer than our newest go first:
    // once per newest sequence (what they free may not serve this engine,
    // e.g. at its arena limit or in slabs of another block size; asking
    // again would strip them for nothing).
    const Sequence* victim = running_.back().get();
    if (options_.reclaim && reclaimed_for != victim) {
      reclaimed_for = victim;
      // Asked again while it frees something: only emptied slabs serve us.
      while (!kv_->AtCapacity() &&
             options_.reclaim(kv_->BytesNeeded(seq->kv, tokens), victim->admitted_at) > 0) {
        if (kv_->Reserve(&seq->kv, tokens)) return true;
      }
    }
    // Preempt the newest running sequence (possibly `seq` itself).
    PreemptAt(running_.size() - 1);
    if (victim == seq) return false;
  }
}

void BatchPlanner::AttachSessionPrefix(Sequence* seq) {
  if (seq->prefix_taken) return;
  seq->prefix_taken = true;
  int common = 0;
  const int layers = kv_->layout().num_layers;
  int resident = layers;
  if (!seq->req.session_id.empty()) {
    absl::Duration lead = absl::InfiniteDuration();
    common = kv_->TakePrefix(seq->req.session_id, seq->tokens, &seq->kv, &lead, &resident);
    if (common > 0) seq->result.kv_source = KvSource::kDevice;
    if (lead != absl::InfiniteDuration()) {
      seq->result.prefetch_lead_ms = absl::ToDoubleMilliseconds(lead);
    }
  }
  const KvPrefixLease* lease = seq->req.lease.get();
  const int cap = static_cast<int>(seq->tokens.size()) - 1;  // logits need one token
  const int covered = lease != nullptr ? std::min(lease->tokens, cap) : 0;
  if (resident < layers && common > 0) {
    // Only the first layers stayed on the device: the rest of the prefix
    // comes from the lease, or everything is recomputed.
    if (covered == 0) {
      kv_->Free(&seq->kv);
      common = 0;
      seq->result.kv_source = KvSource::kRecomputed;
    } else {
      common = std::min(common, covered);
      seq->load_resident_layers = resident;
    }
  }
  if (lease != nullptr && (covered > common || seq->load_resident_layers < layers)) {
    seq->load = seq->req.lease;
    seq->load_from = common;
    common = std::max(common, covered);
    seq->result.kv_source = lease->source;
  }
  seq->num_computed = common;
  seq->result.cached_tokens = common;
}

void BatchPlanner::PreemptAt(size_t i) {
  std::unique_ptr<Sequence> v = std::move(running_[i]);
  running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(i));
  kv_->Free(&v->kv);
  v->num_computed = 0;
  v->load = nullptr;  // recomputes everything
  v->load_resident_layers = std::numeric_limits<int>::max();
  ++v->result.preemptions;
  ++preemptions_;
  waiting_.push_front(std::move(v));
  PublishGrowth();
}

void BatchPlanner::Enqueue(std::unique_ptr<Sequence> seq) { waiting_.push_back(std::move(seq)); }

std::vector<std::unique_ptr<Sequence>> BatchPlanner::Remove(
    const absl::flat_hash_set<std::string>& ids) {
  std::vector<std::unique_ptr<Sequence>> out;
  if (ids.empty()) return out;
  auto take_from = [&](auto& container) {
    for (auto it = container.begin(); it != container.end();) {
      if (ids.contains((*it)->req.id)) {
        out.push_back(std::move(*it));
        it = container.erase(it);
      } else {
        ++it;
      }
    }
  };
  take_from(waiting_);
  take_from(running_);
  PublishGrowth();
  return out;
}

std::unique_ptr<Sequence> BatchPlanner::RemoveWaiting(const std::string& id) {
  for (auto it = waiting_.begin(); it != waiting_.end(); ++it) {
    if ((*it)->req.id != id) continue;
    std::unique_ptr<Sequence> s = std::move(*it);
    waiting_.erase(it);
    return s;
  }
  return nullptr;
}

std::vector<std::unique_ptr<Sequence>> BatchPlanner::TakeDone() {
  std::vector<std::unique_ptr<Sequence>> out;
  for (auto it = running_.begin(); it != running_.end();) {
    if ((*it)->done) {
      out.push_back(std::move(*it));
      it = running_.erase(it);
    } else {
      ++it;
    }
  }
  if (!out.empty()) PublishGrowth();
  return out;
}

std::vector<std::unique_ptr<Sequence>> BatchPlanner::TakeAll() {
  std::vector<std::unique_ptr<Sequence>> out;
  out.reserve(running_.size() + waiting_.size());
  while (!running_.empty()) {
    out.push_back(std::move(running_.back()));
    running_.pop_back();
  }
  for (auto& s : waiting_) out.push_back(std::move(s));
  waiting_.clear();
  PublishGrowth();
  return out;
}

bool HoldsItsPlace(const Sequence& s) {
  // Preempted; or waiting with the session prefix it took (KV blocks no
  // one else can use or shed): several such waiting sequences could each
  // hold what the other needs, so it is tried first, one at a time.
  return s.admitted_once || s.kv.num_blocks() > 0;
}

void BatchPlanner::SetAdmissionOrder(const absl::flat_hash_map<std::string, int>& rank) {
  // Keys once per sequence (not per comparison): those holding their
  // place first, then rank.
  std::vector<std::pair<std::pair<int, int>, std::unique_ptr<Sequence>>> keyed;
  keyed.reserve(waiting_.size());
  for (auto& s : waiting_) {
    auto it = rank.find(s->req.id);
    const std::pair<int, int> key =
        HoldsItsPlace(*s) ? std::pair<int, int>(0, 0)
                          : std::pair<int, int>(1, it == rank.end() ? INT_MAX : it->second);
    keyed.emplace_back(key, std::move(s));
  }
  std::stable_sort(keyed.begin(), keyed.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  waiting_.clear();
  for (auto& [key, s] : keyed) waiting_.push_back(std::move(s));
}

int64_t BatchPlanner::Preempt(const std::string& request_id) {
  // Newest first, should two running sequences share an id.
  for (size_t i = running_.size(); i-- > 0;) {
    if (running_[i]->req.id != request_id) continue;
    const int64_t bytes = kv_->BytesOf(running_[i]->kv);
    PreemptAt(i);
    ++shed_preemptions_;
    return bytes;
  }
  return 0;
}

std::vector<KvHolding> BatchPlanner::Holdings(bool with_slabs) const {
  std::vector<KvHolding> out;
  out.reserve(running_.size());
  for (const auto& s : running_) {
    KvHolding h;
    h.kind = KvHolding::Kind::kRunning;
    h.id = s->req.id;
    h.priority = s->req.priority;
    h.recency = s->admitted_at;
    h.bytes = kv_->BytesOf(s->kv);
    if (with_slabs) h.slabs = kv_->SlabsOf(s->kv);
    out.push_back(std::move(h));
  }
  return out;
}

void BatchPlanner::AppendTables(std::vector<SequenceKv*>* out) {
  for (auto& s : running_) out->push_back(&s->kv);
  for (auto& s : waiting_) out->push_back(&s->kv);
}

}  // namespace ballast::engine
