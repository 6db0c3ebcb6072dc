// SessionDirectory: for every multi-turn session, its model, the node that
// holds its KV (affinity) and its whole token history (prompts and replies),
// so any node can recompute the KV if the affinity node is lost.
//
// A session runs one turn at a time: Begin() marks it busy and fails with
// FAILED_PRECONDITION while another turn is in flight; Commit() appends a
// finished turn, Abort() ends a failed or cancelled one without changing
// the history. Thread-safety: all methods are thread-safe.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace ballast::global_scheduler {

struct SessionTurn {
  std::vector<int> history;  // tokens before this turn
  std::string node_id;       // affinity; empty if none yet
};

class SessionDirectory {
 public:
  absl::StatusOr<SessionTurn> Begin(const std::string& session_id, const std::string& model);
  void Commit(const std::string& session_id, const std::string& node_id,
              const std::vector<int>& prompt_tokens, const std::vector<int>& output_tokens);
  void Abort(const std::string& session_id);
  // Forgets a session; returns its affinity node if it existed.
  std::optional<std::string> End(const std::string& session_id, bool* existed);
  // Forgets affinity to a dead node (history is kept).
  void ForgetNode(const std::string& node_id);
  int size() const;

 private:
  struct Session {
    std::string model;
    std::vector<int> tokens;
    std::string node_id;
    bool busy = false;
  };
  mutable absl::Mutex mu_;
  std::map<std::string, Session> sessions_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ballast::global_scheduler
