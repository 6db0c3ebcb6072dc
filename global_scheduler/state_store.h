// StateStore: what the scheduler keeps across a restart, behind one narrow
// interface so the backend can change (SQLite by default; etcd for a highly
// available pair of schedulers, etcd_client.h) and tests can inject faults.
//
// What is stored:
//   - the catalogue's Admin changes: specs registered through the Admin API
//     (including their KV floors and limits) and names unregistered through
//     it (CatalogueStore applies them to the config's models at start);
//   - the session directory: every session's model, tenant, kind, affinity
//     node, whole token history, chat messages, lost state and last use
//     (SessionDirectory writes through on every change it acknowledges).
//
// Durability: every write returns once it is committed. With
// StateSync::kNormal (SQLite WAL, synchronous=NORMAL) a committed write
// survives the process being killed (kill -9); with kFull it also survives
// power loss, at the cost of an fsync per write.
//
// Errors name the file and what failed; a full store (the disk, or
// max_bytes) is RESOURCE_EXHAUSTED; a damaged file is DATA_LOSS; a file
// held by another scheduler is FAILED_PRECONDITION.
//
// Thread-safety: implementations are thread-safe; writes are serialized.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "ballast/v1/inference.pb.h"
#include "global_scheduler/model_registry.h"

namespace ballast::global_scheduler {

// Why a session was marked lost (the DATA_LOSS message says it).
enum class LostReason { kForgotten, kExpired };

// One session as stored (SessionDirectory's record of it, less the turn in
// flight, which is never stored: a restarted scheduler has none).
struct StoredSession {
  std::string id;
  std::string model;
  std::string tenant;
  bool chat = false;
  std::string node_id;  // affinity; empty if none
  std::vector<int> tokens;
  std::vector<v1::ChatMessage> messages;
  std::optional<LostReason> lost;
  absl::Time last_used = absl::UnixEpoch();
};

// A committed turn, as the store records it: the session's new affinity
// and last use, and what the turn added to its history (appended), or,
// with `rewrite`, its whole token history and conversation (replacing what
// is stored: a chat turn whose rendering does not extend the old tokens).
struct SessionTurnRecord {
  std::string id;
  std::string node_id;
  absl::Time last_used = absl::UnixEpoch();
  std::vector<int> tokens;
  std::vector<v1::ChatMessage> messages;
  bool rewrite = false;
};

// The Admin API's changes to the catalogue.
struct StoredCatalogue {
  std::vector<ModelSpec> registered;
  std::vector<std::string> unregistered;
};

class StateStore {
 public:
  virtual ~StateStore() = default;

  // Everything stored, read at start.
  virtual absl::StatusOr<StoredCatalogue> LoadCatalogue() = 0;
  virtual absl::StatusOr<std::vector<StoredSession>> LoadSessions() = 0;

  // A registration (replacing an earlier one or an unregistration of that
  // name), or an unregistration (replacing a registration).
  virtual absl::Status PutRegistered(const ModelSpec& spec) = 0;
  virtual absl::Status PutUnregistered(const std::string& name) = 0;

  // Writes a session whole (inserting or replacing it).
  virtual absl::Status PutSession(const StoredSession& session) = 0;
  // Records a committed turn of a stored session: its cost is the turn's,
  // not the history's (unless `rewrite`). NOT_FOUND if the session is not
  // stored.
  virtual absl::Status AppendTurn(const SessionTurnRecord& turn) = 0;
  // Changes only a session's affinity (no-op for an unknown id).
  virtual absl::Status SetAffinity(const std::string& id, const std::string& node_id) = 0;
  // Clears the affinity of every session on `node_id`.
  virtual absl::Status ForgetNode(const std::string& node_id) = 0;
  virtual absl::Status EraseSession(const std::string& id) = 0;

  // Where the state lives, for messages ("sqlite:/var/lib/ballast/state.db").
  virtual std::string Describe() const = 0;
};

// How hard each write is pushed to the disk.
enum class StateSync {
  kNormal,  // WAL, synchronous=NORMAL: survives kill -9, not power loss
  kFull,    // WAL, synchronous=FULL: survives power loss; an fsync a write
};

struct SqliteStateOptions {
  StateSync sync = StateSync::kNormal;
  // Largest size of the database file; writes past it fail
  // RESOURCE_EXHAUSTED as a full disk does. 0: no cap. Default 0. The WAL
  // beside it is not counted (it is checkpointed into the file every 1000
  // pages); a cap below the file's current size is raised to that size.
  int64_t max_bytes = 0;
};

// Opens (creating if missing) the SQLite database at `path`; its directory
// must exist. The file is locked for this process until the store is
// destroyed: a second scheduler on the same file fails FAILED_PRECONDITION.
absl::StatusOr<std::unique_ptr<StateStore>> OpenSqliteStateStore(
    const std::string& path, const SqliteStateOptions& options = {});

class EtcdClient;

struct EtcdStateOptions {
  // Every key lives under it ("/ballast": "/ballast/models/...").
  std::string prefix = "/ballast";
  // Each write commits only while this key's create_revision is
  // fence_revision (the leader election's key and LeaderElection::
  // won_revision(), etcd_client.h): a deposed leader's writes are refused.
  // fence_id names this scheduler in messages. Empty key: no fence (a
  // single scheduler). Default empty.
  std::string fence_key;
  int64_t fence_revision = 0;
  std::string fence_id;
};

// The state in etcd (etcd_state_store.cc gives the key layout); a write
// returns once etcd committed it (a majority of members, fsynced). Fails
// now if etcd cannot be reached. A deposed leader's writes fail
// FAILED_PRECONDITION. A session's history may be any size (written in
// pieces), but one appended turn must fit etcd's request limit (1.5 MiB by
// default: about 390,000 tokens).
absl::StatusOr<std::unique_ptr<StateStore>> OpenEtcdStateStore(std::shared_ptr<EtcdClient> client,
                                                               const EtcdStateOptions& options);

}  // namespace ballast::global_scheduler
