// SessionDirectory: for every multi-turn session, its model, the node that
// holds its KV (affinity) and its whole token history (prompts and replies),
// so any node can recompute the KV if the affinity node is lost. A chat
// session (its turns send GenerateRequest.messages) also keeps its
// conversation: every message and the assistant's replies, which the node
// renders again with the model's chat template at the next turn.
//
// A session runs one turn at a time: Begin() marks it busy and fails with
// FAILED_PRECONDITION while another turn is in flight; Commit() records a
// finished turn, Abort() ends a failed or cancelled one without changing
// the history. A session is a text or a chat session from its first turn
// on; a turn of the other kind is INVALID_ARGUMENT.
// Thread-safety: all methods are thread-safe.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "ballast/v1/inference.pb.h"

namespace ballast::global_scheduler {

struct SessionTurn {
  std::vector<int> history;               // tokens before this turn
  std::vector<v1::ChatMessage> messages;  // chat: the conversation so far
  std::string node_id;                    // affinity; empty if none yet
};

// A finished turn, as Commit records it.
struct TurnRecord {
  std::vector<int> prompt_tokens;
  std::vector<int> output_tokens;
  // Chat turns: prompt_tokens is the whole conversation (it replaces the
  // history); otherwise it extends it.
  bool prompt_replaces_history = false;
  // Chat turns: this turn's messages, then the assistant's reply.
  std::vector<v1::ChatMessage> messages;
};

class SessionDirectory {
 public:
  // `chat`: the turn sends messages (else a prompt).
  absl::StatusOr<SessionTurn> Begin(const std::string& session_id, const std::string& model,
                                    bool chat = false);
  void Commit(const std::string& session_id, const std::string& node_id, TurnRecord turn);
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
    std::vector<v1::ChatMessage> messages;
    std::string node_id;
    bool chat = false;
    bool busy = false;
  };
  mutable absl::Mutex mu_;
  std::map<std::string, Session> sessions_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ballast::global_scheduler
