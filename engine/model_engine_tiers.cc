// ModelEngine's side of session KV tiering (engine/kv_tiers.h): loading
// leases before a step, exporting finished turns, Advise imports and
// prefetch drops. Split from model_engine.cc by concept.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "engine/kv_export.h"
#include "engine/model_engine.h"
#include "spdlog/spdlog.h"

namespace ballast::engine {

absl::Status ModelEngine::RunLoads(const StepPlan& plan) {
  if (plan.loads.empty()) return absl::OkStatus();
  const absl::Time t0 = absl::Now();
  LayerKvCopies load;
  for (const PlannedLoad& l : plan.loads) {
    LayerKvCopies one;
    if (auto st = LeaseKvCopies(*kv_, *l.lease, l.from_token, l.seq->kv, &one, l.resident_layers);
        !st.ok()) {
      return st;
    }
    load.layers.resize(std::max(load.layers.size(), one.layers.size()));
    for (size_t i = 0; i < one.layers.size(); ++i) {
      for (const KvBlockCopy& c : one.layers[i]) {
        l.seq->result.kv_loaded_bytes += static_cast<int64_t>(c.bytes);
        load.layers[i].push_back(c);
      }
    }
  }
  absl::Status st = executor_->StartKvLoad(std::move(load));
  if (st.ok() && !options_.layerwise_kv_load) st = executor_->WaitKvLoad();
  const double ms = absl::ToDoubleMilliseconds(absl::Now() - t0);
  for (const PlannedLoad& l : plan.loads) {
    l.seq->result.kv_load_ms += ms;
    l.seq->result.kv_fetch_ms = l.seq->req.kv_fetch_ms;
  }
  return st;
}

bool ModelEngine::ExportSession(const Sequence& s) {
  if (!options_.kv_tiers) return false;
  // A failed export loses nothing: the session recomputes from its history.
  const absl::Status st =
      ExportSessionKv(*kv_, executor_.get(), options_.kv_tiers.get(), s.req.tenant, kv_fingerprint_,
                      absl::MakeConstSpan(s.tokens).first(s.num_computed), s.kv, s.req.session_id,
                      s.req.priority, &export_times_);
  if (!st.ok()) {
    spdlog::warn("model {}: session {} KV not exported to the lower tiers: {}", options_.name,
                 s.req.session_id, st.ToString());
  }
  return st.ok();
}

void ModelEngine::ImportSession(
    std::string session_id, std::vector<int> tokens, std::shared_ptr<const KvPrefixLease> lease,
    int priority, absl::Time deadline,
    std::function<void(absl::StatusOr<std::pair<int, KvSource>>)> done) {
  auto task = [this, session_id = std::move(session_id), tokens = std::move(tokens),
               lease = std::move(lease), priority, deadline, done]() mutable {
    done(Import(session_id, std::move(tokens), *lease, priority, deadline));
  };
  if (!QueueTask(std::move(task))) {
    done(absl::UnavailableError(absl::StrCat("model ", options_.name, " is unavailable")));
  }
}

bool ModelEngine::QueueTask(std::function<void()> task) {
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return false;
    tasks_.push_back(std::move(task));
  }
  if (wake_) wake_();
  return true;
}

absl::StatusOr<std::pair<int, KvSource>> ModelEngine::Import(const std::string& session_id,
                                                             std::vector<int> tokens,
                                                             const KvPrefixLease& lease,
                                                             int priority, absl::Time deadline) {
  if (const int have = kv_manager_->CachedTokens(session_id); have >= lease.tokens) {
    return std::make_pair(have, KvSource::kDevice);
  }
  kv_manager_->Drop(session_id);  // a shorter device copy: replaced
  SequenceKv kv;
  // Only free blocks and other cached sessions (least recently used
  // first): a prefetch never preempts a running sequence.
  if (!kv_manager_->Reserve(&kv, lease.tokens)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("model ", options_.name, ": no device memory free for the prefetch of ",
                     lease.tokens, " tokens without preempting running requests"));
  }
  if (auto st = LoadLeaseKv(*kv_, executor_.get(), lease, 0, kv); !st.ok()) {
    kv_manager_->Free(&kv);
    return st;
  }
  tokens.resize(lease.tokens);
  // The lease came from the tiers: they hold it.
  kv_manager_->Keep(session_id, std::move(kv), std::move(tokens), priority, deadline,
                    /*lower_copy=*/true);
  PublishStats();
  return std::make_pair(lease.tokens, lease.source);
}

void ModelEngine::DropPrefetch(std::vector<std::string> session_ids,
                               std::function<void(bool)> done) {
  if (!QueueTask([this, ids = std::move(session_ids), done] {
        bool dropped = false;
        for (const std::string& id : ids) dropped |= kv_manager_->DropPrefetch(id);
        done(dropped);
      })) {
    done(false);
  }
}

}  // namespace ballast::engine
