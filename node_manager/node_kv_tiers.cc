// NodeManager's session KV tiering: leases for requests, Advise prefetches,
// Invalidate, peer fetches and model fingerprints (kv_tier_store.h has the
// tier rules). Split from node_manager.cc by concept.
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "node_manager/model_fingerprint.h"
#include "node_manager/node_manager.h"

namespace ballast::node_manager {

absl::StatusOr<uint64_t> NodeManager::FingerprintOf(const std::string& path) {
  auto sig = ModelFileSignature(path);
  if (!sig.ok()) return sig.status();
  {
    absl::MutexLock lock(&mu_);
    auto it = fingerprints_.find(path);
    if (it != fingerprints_.end() && it->second.first == *sig) return it->second.second;
  }
  auto fp = ModelFingerprint(path);  // reads the whole checkpoint: outside the lock
  if (!fp.ok()) return fp.status();
  absl::MutexLock lock(&mu_);
  fingerprints_[path] = {*sig, *fp};
  return *fp;
}

std::shared_ptr<const engine::KvPrefixLease> NodeManager::AcquireLease(
    const engine::ModelEngine& e, const v1::NodeGenerateRequest& req,
    const std::vector<int>& prompt) {
  // The session's device copy is its longest prefix already; reading the
  // tiers too would only cost time.
  if (!req.session_id().empty() &&
      e.CachedSessionTokens(SessionKey(req.tenant(), req.session_id())) > 0) {
    return nullptr;
  }
  if (prompt.size() < 2) return nullptr;
  return tiers_->Acquire(req.tenant(), e.kv_fingerprint(), prompt,
                         static_cast<int>(prompt.size()) - 1, req.kv_peer(), &peer_client_);
}

absl::StatusOr<PrefetchResult> NodeManager::PrefetchKv(const v1::PrefetchKvRequest& req) {
  if (req.session_id().empty()) {
    return absl::InvalidArgumentError("PrefetchKv needs a session_id (the KV is kept for it)");
  }
  std::string device;
  auto engine = FindEngine(req.model(), &device);
  if (!engine) {
    return absl::NotFoundError(
        absl::StrCat("model ", req.model(), " is not resident on node ", options_.node_id));
  }
  const std::vector<int> tokens(req.tokens().begin(), req.tokens().end());
  PrefetchResult r;
  const std::string key = SessionKey(req.tenant(), req.session_id());
  if (const int have = engine->CachedSessionTokens(key); have > 0) {
    r.tokens = have;
    r.source = engine::KvSource::kDevice;
    return r;
  }
  if (!tiers_ || tokens.empty()) return r;
  auto lease = tiers_->Acquire(req.tenant(), engine->kv_fingerprint(), tokens,
                               static_cast<int>(tokens.size()), req.kv_peer(), &peer_client_);
  if (!lease) return r;
  absl::Notification done;
  absl::StatusOr<std::pair<int, engine::KvSource>> got;
  engine->ImportSession(key, tokens, std::move(lease), req.priority(),
                        absl::Now() + absl::Milliseconds(req.ttl_ms()),
                        [&](absl::StatusOr<std::pair<int, engine::KvSource>> v) {
                          got = std::move(v);
                          done.Notify();
                        });
  done.WaitForNotification();
  if (!got.ok()) return got.status();
  SessionKept(req.tenant(), req.session_id());
  r.tokens = got->first;
  r.source = got->second;
  return r;
}

absl::StatusOr<bool> NodeManager::DropPrefetch(const std::string& session_id,
                                               const std::string& model) {
  std::string device;
  auto engine = FindEngine(model, &device);
  if (!engine) {
    return absl::NotFoundError(
        absl::StrCat("model ", model, " is not resident on node ", options_.node_id));
  }
  bool dropped = false;
  absl::Notification done;
  engine->DropPrefetch(SessionKeys(session_id, /*forget=*/false), [&](bool d) {
    dropped = d;
    done.Notify();
  });
  done.WaitForNotification();
  return dropped;
}

std::vector<std::shared_ptr<const transfer::KvChunk>> NodeManager::ChunksForPeer(
    const v1::FetchKvRequest& req) {
  std::vector<std::shared_ptr<const transfer::KvChunk>> out;
  if (!tiers_) return out;
  const std::vector<int> tokens(req.tokens().begin(), req.tokens().end());
  auto lease = tiers_->Acquire(req.tenant(), req.kv_fingerprint(), tokens,
                               static_cast<int>(req.max_tokens()));
  if (!lease) return out;
  for (const auto& c : lease->chunks) {
    if (c->meta.first_token >= req.first_token()) out.push_back(c);
  }
  return out;
}

}  // namespace ballast::node_manager
