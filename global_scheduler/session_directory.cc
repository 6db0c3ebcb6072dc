#include "global_scheduler/session_directory.h"

#include "absl/strings/str_cat.h"

namespace ballast::global_scheduler {

absl::StatusOr<SessionTurn> SessionDirectory::Begin(const std::string& session_id,
                                                    const std::string& model) {
  absl::MutexLock lock(&mu_);
  auto [it, inserted] = sessions_.try_emplace(session_id);
  Session& s = it->second;
  if (inserted) s.model = model;
  if (s.model != model) {
    return absl::InvalidArgumentError(
        absl::StrCat("session ", session_id, " belongs to model ", s.model, ", not ", model));
  }
  if (s.busy) {
    return absl::FailedPreconditionError(absl::StrCat(
        "session ", session_id, " already has a turn in flight; wait for it to finish"));
  }
  s.busy = true;
  return SessionTurn{s.tokens, s.node_id};
}

void SessionDirectory::Commit(const std::string& session_id, const std::string& node_id,
                              const std::vector<int>& prompt_tokens,
                              const std::vector<int>& output_tokens) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) return;  // ended meanwhile
  Session& s = it->second;
  s.tokens.insert(s.tokens.end(), prompt_tokens.begin(), prompt_tokens.end());
  s.tokens.insert(s.tokens.end(), output_tokens.begin(), output_tokens.end());
  s.node_id = node_id;
  s.busy = false;
}

void SessionDirectory::Abort(const std::string& session_id) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) return;
  it->second.busy = false;
  if (it->second.tokens.empty()) sessions_.erase(it);
}

std::optional<std::string> SessionDirectory::End(const std::string& session_id, bool* existed) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(session_id);
  *existed = it != sessions_.end();
  if (!*existed) return std::nullopt;
  std::optional<std::string> node;
  if (!it->second.node_id.empty()) node = it->second.node_id;
  sessions_.erase(it);
  return node;
}

void SessionDirectory::ForgetNode(const std::string& node_id) {
  absl::MutexLock lock(&mu_);
  for (auto& [id, s] : sessions_)
    if (s.node_id == node_id) s.node_id.clear();
}

int SessionDirectory::size() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(sessions_.size());
}

}  // namespace ballast::global_scheduler
