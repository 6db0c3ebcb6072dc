#include "global_scheduler/session_directory.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace ballast::global_scheduler {

absl::Status SessionDirectory::LostError(const std::string& session_id, LostReason why) {
  return absl::DataLossError(
      absl::StrCat("session ", session_id, "'s history was lost (",
                   why == LostReason::kExpired ? "it expired after scheduler.session_ttl_ms idle"
                                               : "the scheduler restarted and forgot it",
                   "); call EndSession and start over, or use a new session_id"));
}

namespace {
absl::Status OtherTenant(const std::string& session_id) {
  return absl::PermissionDeniedError(
      absl::StrCat("session ", session_id, " belongs to another tenant"));
}
}  // namespace

std::map<std::string, SessionDirectory::Session>::iterator SessionDirectory::Erase(
    std::map<std::string, Session>::iterator it, bool stored) {
  if (store_ && stored) Note(store_->EraseSession(it->first));
  auto t = per_tenant_.find(it->second.tenant);
  if (t != per_tenant_.end() && --t->second <= 0) per_tenant_.erase(t);
  return sessions_.erase(it);
}

absl::Status SessionDirectory::Persist(const std::string& id, const Session& s) {
  if (!store_) return absl::OkStatus();
  return store_->PutSession(StoredSession{id, s.model, s.tenant, s.chat, s.node_id, s.tokens,
                                          s.messages, s.lost, s.last_used});
}

void SessionDirectory::Note(const absl::Status& st) {
  if (st.ok()) return;
  write_errors_.fetch_add(1, std::memory_order_relaxed);
  spdlog::error("session directory: {} (the change is kept in memory only)", st.ToString());
}

absl::Status SessionDirectory::Restore(StateStore* store) {
  auto stored = store->LoadSessions();
  if (!stored.ok()) return stored.status();
  absl::MutexLock lock(&mu_);
  for (StoredSession& r : *stored) {
    Session& s = sessions_[r.id];
    s.model = std::move(r.model);
    s.tenant = std::move(r.tenant);
    s.chat = r.chat;
    s.node_id = std::move(r.node_id);
    s.tokens = std::move(r.tokens);
    s.messages = std::move(r.messages);
    s.lost = r.lost;
    s.last_used = r.last_used;
    ++per_tenant_[s.tenant];
  }
  store_ = store;
  return absl::OkStatus();
}

absl::StatusOr<SessionTurn> SessionDirectory::Begin(const std::string& session_id,
                                                    const std::string& model, bool chat,
                                                    const std::string& tenant,
                                                    int tenant_max_sessions) {
  absl::MutexLock lock(&mu_);
  auto [it, inserted] = sessions_.try_emplace(session_id);
  Session& s = it->second;
  if (inserted) {
    if (static_cast<int>(sessions_.size()) > max_sessions_) {
      sessions_.erase(it);
      return absl::ResourceExhaustedError(
          absl::StrCat("the scheduler tracks ", max_sessions_,
                       " sessions (scheduler.max_sessions); end finished ones with EndSession"));
    }
    int& held = per_tenant_[tenant];
    if (tenant_max_sessions > 0 && held >= tenant_max_sessions) {
      if (held == 0) per_tenant_.erase(tenant);
      sessions_.erase(it);
      return absl::ResourceExhaustedError(
          absl::StrCat("the tenant holds ", tenant_max_sessions,
                       " sessions, its limit (scheduler.quotas max_sessions); end finished ones "
                       "with EndSession"));
    }
    s.model = model;
    s.chat = chat;
    s.tenant = tenant;
    s.last_used = clock_();
    if (auto st = Persist(session_id, s); !st.ok()) {
      if (held == 0) per_tenant_.erase(tenant);
      sessions_.erase(it);
      return absl::UnavailableError(
          absl::StrCat("session ", session_id, " not started: ", st.message()));
    }
    ++held;
  }
  if (s.tenant != tenant) return OtherTenant(session_id);
  if (s.lost) return LostError(session_id, *s.lost);
  if (s.model != model) {
    return absl::InvalidArgumentError(
        absl::StrCat("session ", session_id, " belongs to model ", s.model, ", not ", model));
  }
  if (s.chat != chat) {
    return absl::InvalidArgumentError(absl::StrCat(
        "session ", session_id, " is a ", s.chat ? "chat" : "text", " session: its turns send ",
        s.chat ? "messages" : "a prompt", ", not ", chat ? "messages" : "a prompt"));
  }
  if (s.busy) {
    return absl::FailedPreconditionError(absl::StrCat(
        "session ", session_id, " already has a turn in flight; wait for it to finish"));
  }
  s.busy = true;
  s.last_used = clock_();
  // A session with no committed turn is new to the lost-history check too
  // (one restored from the store may have been created just before a
  // restart, while a node already served it).
  const bool fresh = inserted || (s.tokens.empty() && s.messages.empty());
  return SessionTurn{s.tokens, s.messages, s.node_id, fresh};
}

absl::StatusOr<SessionDirectory::Snapshot> SessionDirectory::Peek(const std::string& session_id,
                                                                  const std::string& tenant) const {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) {
    return absl::NotFoundError(absl::StrCat("session ", session_id, " is unknown"));
  }
  const Session& s = it->second;
  if (s.tenant != tenant) return OtherTenant(session_id);
  if (s.lost) return LostError(session_id, *s.lost);
  return Snapshot{s.model, s.tokens, s.node_id};
}

void SessionDirectory::SetAffinity(const std::string& session_id, const std::string& node_id) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(session_id);
  if (it == sessions_.end() || it->second.node_id == node_id) return;
  it->second.node_id = node_id;
  if (store_) Note(store_->SetAffinity(session_id, node_id));
}

absl::Status SessionDirectory::Commit(const std::string& session_id, const std::string& node_id,
                                      TurnRecord turn) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) return absl::OkStatus();  // ended meanwhile
  Session& s = it->second;
  // What the turn adds: its tokens after the history, or (a chat turn's
  // prompt replaces the history) the new tokens past the old ones when they
  // extend them, else the whole new history.
  std::vector<int> added = std::move(turn.prompt_tokens);
  added.insert(added.end(), turn.output_tokens.begin(), turn.output_tokens.end());
  bool rewrite = false;
  if (turn.prompt_replaces_history) {
    if (added.size() >= s.tokens.size() &&
        std::equal(s.tokens.begin(), s.tokens.end(), added.begin())) {
      added.erase(added.begin(), added.begin() + static_cast<ptrdiff_t>(s.tokens.size()));
    } else {
      rewrite = true;
    }
  }
  const absl::Time now = clock_();
  if (store_) {
    SessionTurnRecord record{session_id, node_id, now, {}, {}, rewrite};
    if (rewrite) {
      record.tokens = added;
      record.messages = s.messages;
    } else {
      record.tokens = added;
    }
    record.messages.insert(record.messages.end(), turn.messages.begin(), turn.messages.end());
    if (auto st = store_->AppendTurn(record); !st.ok()) {
      s.busy = false;  // the turn ends; the history stays as it was
      s.last_used = now;
      return absl::UnavailableError(absl::StrCat(
          "session ", session_id,
          ": the turn could not be saved, so it is not part of the session's history (",
          st.message(), "); send it again"));
    }
  }
  if (rewrite) s.tokens.clear();
  s.tokens.insert(s.tokens.end(), added.begin(), added.end());
  for (auto& m : turn.messages) s.messages.push_back(std::move(m));
  s.node_id = node_id;
  s.busy = false;
  s.last_used = now;
  return absl::OkStatus();
}

void SessionDirectory::Abort(const std::string& session_id) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) return;
  it->second.busy = false;
  it->second.last_used = clock_();
  if (it->second.lost) return;
  if (it->second.tokens.empty() && it->second.messages.empty()) Erase(it);
}

absl::StatusOr<std::optional<std::string>> SessionDirectory::End(
    const std::string& session_id, bool* existed, const std::optional<std::string>& tenant) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(session_id);
  *existed = it != sessions_.end();
  if (!*existed) return std::optional<std::string>();
  if (tenant && it->second.tenant != *tenant) return OtherTenant(session_id);
  if (store_) {
    if (auto st = store_->EraseSession(session_id); !st.ok()) {
      return absl::UnavailableError(
          absl::StrCat("session ", session_id, " not ended: ", st.message()));
    }
  }
  std::optional<std::string> node;
  if (!it->second.node_id.empty()) node = it->second.node_id;
  Erase(it, /*stored=*/false);
  return node;
}

void SessionDirectory::ForgetNode(const std::string& node_id) {
  absl::MutexLock lock(&mu_);
  for (auto& [id, s] : sessions_)
    if (s.node_id == node_id) s.node_id.clear();
  if (store_) Note(store_->ForgetNode(node_id));
}

void SessionDirectory::MarkLost(const std::string& session_id, LostReason why) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) return;
  Session& s = it->second;
  s.lost = why;
  s.busy = false;
  s.tokens = {};
  s.messages = {};
  s.node_id.clear();
  s.last_used = clock_();
  Note(Persist(session_id, s));
}

std::vector<std::pair<std::string, std::string>> SessionDirectory::Expire(absl::Duration ttl) {
  std::vector<std::pair<std::string, std::string>> expired;
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_();
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    Session& s = it->second;
    if (s.busy || now - s.last_used < ttl) {
      ++it;
    } else if (s.lost) {
      it = Erase(it);  // a tombstone idle another TTL
    } else {
      expired.emplace_back(it->first, s.node_id);
      s.lost = LostReason::kExpired;
      s.tokens = {};
      s.messages = {};
      s.node_id.clear();
      s.last_used = now;
      Note(Persist(it->first, s));
      ++it;
    }
  }
  return expired;
}

int SessionDirectory::size() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(sessions_.size());
}

}  // namespace ballast::global_scheduler
