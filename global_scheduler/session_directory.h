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
//
// Lost history: a session whose history the scheduler no longer has is
// marked lost (MarkLost: a node still knew the id after a scheduler restart;
// Expire: idle past the TTL). Every turn of a lost session fails DATA_LOSS,
// naming why, until EndSession forgets it or it stays idle one more TTL;
// then the id is free for a new session. A lost session keeps no history.
//
// Limits: at most `max_sessions` sessions (lost ones included); Begin of a
// new one beyond that is RESOURCE_EXHAUSTED.
//
// Persistence: after Restore(store), every change is written through to the
// StateStore before the call returns, under the directory's lock (so the
// store sees changes in order). Acknowledged changes are never kept in
// memory only: a session created by Begin, a committed turn (before the
// client hears the turn ended) and an ended session are written first and
// refused (UNAVAILABLE, nothing changed) if the write fails. Bookkeeping
// writes that nobody waits on (affinity moves, losses, expiries, the erase
// of a session with no history) are logged and counted on failure
// (write_errors()). A turn's in-flight state and the last use of a session
// between turns are not stored: after a restart, idle time counts from the
// last committed turn.
// Thread-safety: all methods are thread-safe.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "ballast/v1/inference.pb.h"
#include "global_scheduler/state_store.h"

namespace ballast::global_scheduler {

struct SessionTurn {
  std::vector<int> history;               // tokens before this turn
  std::vector<v1::ChatMessage> messages;  // chat: the conversation so far
  std::string node_id;                    // affinity; empty if none yet
  bool fresh = false;                     // no committed turn yet
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
  explicit SessionDirectory(std::function<absl::Time()> clock = absl::Now,
                            int max_sessions = 100000)
      : clock_(std::move(clock)), max_sessions_(max_sessions) {}

  // `chat`: the turn sends messages (else a prompt). A session keeps the
  // tenant of its first turn; another tenant's turn is PERMISSION_DENIED.
  // A new session beyond `tenant_max_sessions` of its tenant (0: no cap)
  // is RESOURCE_EXHAUSTED.
  absl::StatusOr<SessionTurn> Begin(const std::string& session_id, const std::string& model,
                                    bool chat = false, const std::string& tenant = "",
                                    int tenant_max_sessions = 0);
  // What Advise needs of a session: NOT_FOUND if unknown, DATA_LOSS if
  // lost, PERMISSION_DENIED for another tenant.
  struct Snapshot {
    std::string model;
    std::vector<int> tokens;
    std::string node_id;
  };
  absl::StatusOr<Snapshot> Peek(const std::string& session_id, const std::string& tenant) const;
  // Moves a session's affinity (Advise prefetched its KV on `node_id`).
  void SetAffinity(const std::string& session_id, const std::string& node_id);
  // Records a finished turn. UNAVAILABLE (and the turn is dropped: the
  // session keeps its earlier history) if the store cannot write it.
  absl::Status Commit(const std::string& session_id, const std::string& node_id, TurnRecord turn);
  void Abort(const std::string& session_id);
  // Forgets a session; returns its affinity node if it existed;
  // UNAVAILABLE (nothing forgotten) if the store cannot erase it. With
  // `tenant`, a session of another tenant is PERMISSION_DENIED (checked and
  // erased under one lock).
  absl::StatusOr<std::optional<std::string>> End(
      const std::string& session_id, bool* existed,
      const std::optional<std::string>& tenant = std::nullopt);
  // Forgets affinity to a dead node (history is kept).
  void ForgetNode(const std::string& node_id);
  // Marks a session lost (see above) and ends its turn in flight.
  void MarkLost(const std::string& session_id, LostReason why);
  // Marks sessions idle for `ttl` (no turn in flight) lost, returning their
  // ids and affinity nodes (whose KV the caller frees); erases lost ones
  // idle another `ttl`.
  std::vector<std::pair<std::string, std::string>> Expire(absl::Duration ttl);
  int size() const;
  // Loads the sessions `store` holds (replacing none: call it before the
  // first turn) and writes every later change through to it. `store` must
  // outlive the directory. Errors are the store's (DATA_LOSS names the
  // damaged session).
  absl::Status Restore(StateStore* store);
  // Writes that failed after Begin (see Persistence above).
  int64_t write_errors() const { return write_errors_.load(std::memory_order_relaxed); }
  // The DATA_LOSS a turn of a lost session fails with.
  static absl::Status LostError(const std::string& session_id, LostReason why);

 private:
  struct Session {
    std::string model;
    std::vector<int> tokens;
    std::vector<v1::ChatMessage> messages;
    std::string node_id;
    std::string tenant;
    bool chat = false;
    bool busy = false;
    absl::Time last_used;
    std::optional<LostReason> lost;
  };
  const std::function<absl::Time()> clock_;
  const int max_sessions_;
  mutable absl::Mutex mu_;
  // Erases `it`, keeping per_tenant_ in step, and from the store unless
  // `stored` is false (the caller erased it there). REQUIRES: mu_ held.
  std::map<std::string, Session>::iterator Erase(std::map<std::string, Session>::iterator it,
                                                 bool stored = true)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes session `id` whole to the store (if any). REQUIRES: mu_ held.
  absl::Status Persist(const std::string& id, const Session& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Counts and logs a failed write after Begin. REQUIRES: mu_ held.
  void Note(const absl::Status& st) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  StateStore* store_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::atomic<int64_t> write_errors_{0};

  std::map<std::string, Session> sessions_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int> per_tenant_ ABSL_GUARDED_BY(mu_);  // sessions by tenant
};

}  // namespace ballast::global_scheduler
