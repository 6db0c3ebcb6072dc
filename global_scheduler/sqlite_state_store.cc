// SqliteStateStore: StateStore in one SQLite database (state_store.h).
//
// Schema (PRAGMA user_version 2):
//   models(name PK, registered 0|1, path, kv_dtype, ttft_ms, tpot_ms,
//          replicas, kv_floor_bytes, kv_limit_bytes, quantization)
//   sessions(id PK, model, tenant, chat, node,
//            lost NULL|0 forgotten|1 expired, last_used_us)
//   session_turns(session_id, seq, tokens BLOB (int32 LE),
//                 messages BLOB (length-delimited v1::ChatMessage)):
//     a session's history is its rows in seq order, concatenated; a turn
//     appends a row, so its cost does not grow with the history.
// The connection runs in WAL mode with locking_mode=EXCLUSIVE, taken at
// open, so the file has one writer process for the store's life.
// Version 1 (no models.quantization) is upgraded in place at open: the
// column is added with ALTER TABLE, its rows reading 'none'.
#include <sqlite3.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <map>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "global_scheduler/state_codec.h"
#include "global_scheduler/state_store.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/util/delimited_message_util.h"

namespace ballast::global_scheduler {
namespace {

// Returns Fail(rc, what) from the enclosing member when `expr` is not OK.
#define RETURN_IF_SQL(expr, what)                         \
  do {                                                    \
    if (const int sql_rc = (expr); sql_rc != SQLITE_OK) { \
      return Fail(sql_rc, what);                          \
    }                                                     \
  } while (0)

constexpr int kSchemaVersion = 2;

constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS models(
  name TEXT PRIMARY KEY, registered INTEGER NOT NULL, path TEXT NOT NULL,
  kv_dtype TEXT NOT NULL, ttft_ms INTEGER NOT NULL, tpot_ms INTEGER NOT NULL,
  replicas INTEGER NOT NULL, kv_floor_bytes INTEGER NOT NULL,
  kv_limit_bytes INTEGER NOT NULL,
  quantization TEXT NOT NULL DEFAULT 'none') WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS sessions(
  id TEXT PRIMARY KEY, model TEXT NOT NULL, tenant TEXT NOT NULL,
  chat INTEGER NOT NULL, node TEXT NOT NULL, lost INTEGER,
  last_used_us INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS session_turns(
  session_id TEXT NOT NULL, seq INTEGER NOT NULL, tokens BLOB NOT NULL,
  messages BLOB NOT NULL, PRIMARY KEY(session_id, seq));
CREATE INDEX IF NOT EXISTS sessions_by_node ON sessions(node);
)sql";

// A status for SQLite result `rc` while doing `what` on `path`.
absl::Status SqlError(int rc, sqlite3* db, const std::string& path, const std::string& what) {
  const std::string msg = absl::StrCat("state store ", path, ": ", what, ": ",
                                       db ? sqlite3_errmsg(db) : sqlite3_errstr(rc));
  switch (rc & 0xff) {
    case SQLITE_FULL:
      return absl::ResourceExhaustedError(
          absl::StrCat(msg, " (free disk space or raise scheduler.state.max_mb)"));
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
      return absl::DataLossError(
          absl::StrCat(msg, " (the file is damaged or not a Ballast state database)"));
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
      return absl::FailedPreconditionError(
          absl::StrCat(msg, " (another scheduler holds this state file)"));
    case SQLITE_CANTOPEN:
    case SQLITE_PERM:
    case SQLITE_READONLY:
      return absl::PermissionDeniedError(msg);
    default:
      return absl::UnavailableError(msg);
  }
}

// A prepared statement in use: one prepared for this use (finalized on
// destruction), or a kept one (SqliteStateStore::Kept: reset and unbound on
// destruction, for the next use).
class Stmt {
 public:
  Stmt(sqlite3* db, const char* sql) { rc_ = sqlite3_prepare_v2(db, sql, -1, &s_, nullptr); }
  // Borrows `kept` (null when its preparation failed with `rc`).
  Stmt(sqlite3_stmt* kept, int rc) : s_(kept), rc_(rc), owned_(false) {}
  ~Stmt() {
    if (owned_) {
      sqlite3_finalize(s_);
    } else if (s_) {
      sqlite3_reset(s_);
      sqlite3_clear_bindings(s_);
    }
  }
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;
  int prepare_rc() const { return rc_; }
  Stmt& Text(int i, const std::string& v) {
    sqlite3_bind_text(s_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
    return *this;
  }
  Stmt& Int(int i, int64_t v) {
    sqlite3_bind_int64(s_, i, v);
    return *this;
  }
  Stmt& Blob(int i, const std::string& v) {
    sqlite3_bind_blob64(s_, i, v.data(), v.size(), SQLITE_TRANSIENT);
    return *this;
  }
  Stmt& Null(int i) {
    sqlite3_bind_null(s_, i);
    return *this;
  }
  int Step() { return sqlite3_step(s_); }
  std::string ColText(int i) const {
    const auto* p = sqlite3_column_text(s_, i);
    return p ? std::string(reinterpret_cast<const char*>(p),
                           static_cast<size_t>(sqlite3_column_bytes(s_, i)))
             : std::string();
  }
  std::string ColBlob(int i) const {
    const void* p = sqlite3_column_blob(s_, i);
    return p ? std::string(static_cast<const char*>(p),
                           static_cast<size_t>(sqlite3_column_bytes(s_, i)))
             : std::string();
  }
  int64_t ColInt(int i) const { return sqlite3_column_int64(s_, i); }
  bool ColNull(int i) const { return sqlite3_column_type(s_, i) == SQLITE_NULL; }

 private:
  sqlite3_stmt* s_ = nullptr;
  int rc_ = SQLITE_OK;
  bool owned_ = true;
};

class SqliteStateStore final : public StateStore {
 public:
  SqliteStateStore(std::string path, sqlite3* db) : path_(std::move(path)), db_(db) {}
  ~SqliteStateStore() override ABSL_NO_THREAD_SAFETY_ANALYSIS {
    for (auto& [sql, stmt] : kept_) sqlite3_finalize(stmt);
    sqlite3_close_v2(db_);
  }

  // Pragmas, the exclusive lock and the schema. REQUIRES: not yet shared.
  absl::Status Init(const SqliteStateOptions& options) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    RETURN_IF_SQL(Exec("PRAGMA locking_mode=EXCLUSIVE"), "set the locking mode");
    // The pragma answers the mode now in force (a file that cannot switch
    // answers its old mode).
    if (auto mode = Text("PRAGMA journal_mode=WAL"); mode != "wal") {
      return mode ? absl::FailedPreconditionError(absl::StrCat(
                        "state store ", path_, ": cannot use WAL (journal mode ", *mode, ")"))
                  : Fail(sqlite3_errcode(db_), "switch to WAL");
    }
    RETURN_IF_SQL(Exec(options.sync == StateSync::kFull ? "PRAGMA synchronous=FULL"
                                                        : "PRAGMA synchronous=NORMAL"),
                  "set synchronous");
    // Takes the exclusive lock now, so a second scheduler fails at start.
    RETURN_IF_SQL(Exec("BEGIN EXCLUSIVE"), "lock the file");
    int64_t version = 0;
    {
      Stmt q(db_, "PRAGMA user_version");
      if (q.prepare_rc() != SQLITE_OK) return Fail(q.prepare_rc(), "read the schema version");
      if (const int rc = q.Step(); rc != SQLITE_ROW) return Fail(rc, "read the schema version");
      version = q.ColInt(0);
    }
    if (version > kSchemaVersion) {
      Exec("ROLLBACK");
      return absl::FailedPreconditionError(
          absl::StrCat("state store ", path_, ": schema version ", version,
                       " was written by a newer Ballast (this one reads ", kSchemaVersion, ")"));
    }
    RETURN_IF_SQL(Exec(kSchema), "create the schema");
    if (auto st = Upgrade(); !st.ok()) {
      Exec("ROLLBACK");
      return st;
    }
    RETURN_IF_SQL(Exec(absl::StrCat("PRAGMA user_version=", kSchemaVersion).c_str()),
                  "set the schema version");
    RETURN_IF_SQL(Exec("COMMIT"), "create the schema");
    if (options.max_bytes > 0) {
      const int64_t page = sqlite3_int64(Scalar("PRAGMA page_size").value_or(4096));
      const int64_t pages = std::max<int64_t>(1, options.max_bytes / std::max<int64_t>(1, page));
      RETURN_IF_SQL(Exec(absl::StrCat("PRAGMA max_page_count=", pages).c_str()),
                    "cap the file size");
    }
    return absl::OkStatus();
  }

  absl::StatusOr<StoredCatalogue> LoadCatalogue() override {
    absl::MutexLock lock(&mu_);
    Stmt q(db_,
           "SELECT name, registered, path, kv_dtype, ttft_ms, tpot_ms, replicas, kv_floor_bytes, "
           "kv_limit_bytes, quantization FROM models ORDER BY name");
    if (q.prepare_rc() != SQLITE_OK) return Fail(q.prepare_rc(), "read the models");
    StoredCatalogue out;
    int rc;
    while ((rc = q.Step()) == SQLITE_ROW) {
      if (!q.ColInt(1)) {
        out.unregistered.push_back(q.ColText(0));
        continue;
      }
      ModelSpec s;
      s.name = q.ColText(0);
      s.path = q.ColText(2);
      s.kv_dtype = q.ColText(3);
      s.ttft_ms = static_cast<uint32_t>(q.ColInt(4));
      s.tpot_ms = static_cast<uint32_t>(q.ColInt(5));
      s.replicas = static_cast<int>(q.ColInt(6));
      s.kv_floor_bytes = q.ColInt(7);
      s.kv_limit_bytes = q.ColInt(8);
      s.quantization = q.ColText(9);
      out.registered.push_back(std::move(s));
    }
    if (rc != SQLITE_DONE) return Fail(rc, "read the models");
    return out;
  }

  absl::StatusOr<std::vector<StoredSession>> LoadSessions() override {
    absl::MutexLock lock(&mu_);
    std::vector<StoredSession> out;
    std::map<std::string, size_t> index;
    {
      Stmt q(db_,
             "SELECT id, model, tenant, chat, node, lost, last_used_us FROM sessions ORDER BY id");
      if (q.prepare_rc() != SQLITE_OK) return Fail(q.prepare_rc(), "read the sessions");
      int rc;
      while ((rc = q.Step()) == SQLITE_ROW) {
        StoredSession s;
        s.id = q.ColText(0);
        s.model = q.ColText(1);
        s.tenant = q.ColText(2);
        s.chat = q.ColInt(3) != 0;
        s.node_id = q.ColText(4);
        if (!q.ColNull(5)) {
          const int64_t lost = q.ColInt(5);
          if (lost != 0 && lost != 1) {
            return absl::DataLossError(absl::StrCat("state store ", path_, ": session ", s.id,
                                                    ": lost: ", lost, " is not 0 or 1"));
          }
          s.lost = lost == 1 ? LostReason::kExpired : LostReason::kForgotten;
        }
        s.last_used = absl::FromUnixMicros(q.ColInt(6));
        index[s.id] = out.size();
        out.push_back(std::move(s));
      }
      if (rc != SQLITE_DONE) return Fail(rc, "read the sessions");
    }
    Stmt q(db_, "SELECT session_id, tokens, messages FROM session_turns ORDER BY session_id, seq");
    if (q.prepare_rc() != SQLITE_OK) return Fail(q.prepare_rc(), "read the session turns");
    int rc;
    while ((rc = q.Step()) == SQLITE_ROW) {
      const std::string id = q.ColText(0);
      auto it = index.find(id);
      if (it == index.end()) {
        return absl::DataLossError(absl::StrCat("state store ", path_, ": turns of session ", id,
                                                ", which is not stored"));
      }
      StoredSession& s = out[it->second];
      if (auto st = DecodeTokens(path_, id, q.ColBlob(1), &s.tokens); !st.ok()) return st;
      if (auto st = DecodeMessages(path_, id, q.ColBlob(2), &s.messages); !st.ok()) return st;
    }
    if (rc != SQLITE_DONE) return Fail(rc, "read the session turns");
    return out;
  }

  absl::Status PutRegistered(const ModelSpec& s) override {
    absl::MutexLock lock(&mu_);
    Stmt q = Kept(
        "INSERT OR REPLACE INTO models(name, registered, path, kv_dtype, ttft_ms, tpot_ms, "
        "replicas, kv_floor_bytes, kv_limit_bytes, quantization) "
        "VALUES (?1, 1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)");
    q.Text(1, s.name).Text(2, s.path).Text(3, s.kv_dtype).Int(4, s.ttft_ms).Int(5, s.tpot_ms);
    q.Int(6, s.replicas).Int(7, s.kv_floor_bytes).Int(8, s.kv_limit_bytes);
    q.Text(9, s.quantization);
    return Run(q, absl::StrCat("record model ", s.name));
  }

  absl::Status PutUnregistered(const std::string& name) override {
    absl::MutexLock lock(&mu_);
    Stmt q = Kept(
        "INSERT OR REPLACE INTO models(name, registered, path, kv_dtype, ttft_ms, tpot_ms, "
        "replicas, kv_floor_bytes, kv_limit_bytes) VALUES (?1, 0, '', '', 0, 0, 0, 0, 0)");
    q.Text(1, name);
    return Run(q, absl::StrCat("record the unregistration of model ", name));
  }

  absl::Status PutSession(const StoredSession& s) override {
    const std::string tokens = EncodeTokens(s.tokens);
    const std::string messages = EncodeMessages(s.messages);
    const std::string what = absl::StrCat("record session ", s.id);
    absl::MutexLock lock(&mu_);
    return InTransaction(what, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      Stmt q = Kept("INSERT OR REPLACE INTO sessions VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)");
      q.Text(1, s.id).Text(2, s.model).Text(3, s.tenant).Int(4, s.chat).Text(5, s.node_id);
      if (s.lost) {
        q.Int(6, *s.lost == LostReason::kExpired ? 1 : 0);
      } else {
        q.Null(6);
      }
      q.Int(7, absl::ToUnixMicros(s.last_used));
      if (auto st = Run(q, what); !st.ok()) return st;
      Stmt erase = Kept("DELETE FROM session_turns WHERE session_id = ?1");
      erase.Text(1, s.id);
      if (auto st = Run(erase, what); !st.ok()) return st;
      if (tokens.empty() && messages.empty()) return absl::OkStatus();
      Stmt turn = Kept("INSERT INTO session_turns VALUES (?1, 0, ?2, ?3)");
      turn.Text(1, s.id).Blob(2, tokens).Blob(3, messages);
      return Run(turn, what);
    });
  }

  absl::Status AppendTurn(const SessionTurnRecord& t) override {
    const std::string tokens = EncodeTokens(t.tokens);
    const std::string messages = EncodeMessages(t.messages);
    const std::string what = absl::StrCat("record a turn of session ", t.id);
    absl::MutexLock lock(&mu_);
    return InTransaction(what, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      Stmt meta =
          Kept("UPDATE sessions SET node = ?2, last_used_us = ?3, lost = NULL WHERE id = ?1");
      meta.Text(1, t.id).Text(2, t.node_id).Int(3, absl::ToUnixMicros(t.last_used));
      if (auto st = Run(meta, what); !st.ok()) return st;
      if (sqlite3_changes(db_) != 1) {
        return absl::NotFoundError(
            absl::StrCat("state store ", path_, ": ", what, ": the session is not stored"));
      }
      if (t.rewrite) {
        Stmt erase = Kept("DELETE FROM session_turns WHERE session_id = ?1");
        erase.Text(1, t.id);
        if (auto st = Run(erase, what); !st.ok()) return st;
      }
      Stmt turn = Kept(
          "INSERT INTO session_turns VALUES (?1, (SELECT COALESCE(MAX(seq) + 1, 0) FROM "
          "session_turns WHERE session_id = ?1), ?2, ?3)");
      turn.Text(1, t.id).Blob(2, tokens).Blob(3, messages);
      return Run(turn, what);
    });
  }

  absl::Status SetAffinity(const std::string& id, const std::string& node_id) override {
    absl::MutexLock lock(&mu_);
    Stmt q = Kept("UPDATE sessions SET node = ?2 WHERE id = ?1");
    q.Text(1, id).Text(2, node_id);
    return Run(q, absl::StrCat("record session ", id, "'s node"));
  }

  absl::Status ForgetNode(const std::string& node_id) override {
    absl::MutexLock lock(&mu_);
    Stmt q = Kept("UPDATE sessions SET node = '' WHERE node = ?1");
    q.Text(1, node_id);
    return Run(q, absl::StrCat("forget node ", node_id, "'s sessions"));
  }

  absl::Status EraseSession(const std::string& id) override {
    const std::string what = absl::StrCat("erase session ", id);
    absl::MutexLock lock(&mu_);
    return InTransaction(what, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      for (const char* sql : {"DELETE FROM sessions WHERE id = ?1",
                              "DELETE FROM session_turns WHERE session_id = ?1"}) {
        Stmt q = Kept(sql);
        q.Text(1, id);
        if (auto st = Run(q, what); !st.ok()) return st;
      }
      return absl::OkStatus();
    });
  }

  std::string Describe() const override { return absl::StrCat("sqlite:", path_); }

 private:
  // The statement for `sql`, prepared on its first use and kept until the
  // store closes: the writes of every turn skip SQLite's parse and plan.
  // `sql` must be a string literal (kept statements are found by its
  // address). REQUIRES: mu_ held.
  Stmt Kept(const char* sql) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = kept_.find(sql);
    if (it == kept_.end()) {
      sqlite3_stmt* stmt = nullptr;
      const int rc = sqlite3_prepare_v3(db_, sql, -1, SQLITE_PREPARE_PERSISTENT, &stmt, nullptr);
      if (rc != SQLITE_OK) {
        sqlite3_finalize(stmt);
        return Stmt(nullptr, rc);
      }
      it = kept_.emplace(sql, stmt).first;
    }
    return Stmt(it->second, SQLITE_OK);
  }
  // Brings a version 1 file's tables to this schema (CREATE TABLE IF NOT
  // EXISTS leaves an existing table as it is): models.quantization, added
  // when missing, reads 'none' on the rows it did not have. REQUIRES: in
  // the opening transaction.
  absl::Status Upgrade() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    bool has_quantization = false;
    {
      Stmt q(db_, "SELECT name FROM pragma_table_info('models')");
      if (q.prepare_rc() != SQLITE_OK) return Fail(q.prepare_rc(), "read the models' columns");
      int rc;
      while ((rc = q.Step()) == SQLITE_ROW) has_quantization |= q.ColText(0) == "quantization";
      if (rc != SQLITE_DONE) return Fail(rc, "read the models' columns");
    }
    if (has_quantization) return absl::OkStatus();
    RETURN_IF_SQL(Exec("ALTER TABLE models ADD COLUMN quantization TEXT NOT NULL DEFAULT 'none'"),
                  "add models.quantization (upgrading from schema version 1)");
    return absl::OkStatus();
  }
  int Exec(const char* sql) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return sqlite3_exec(db_, sql, nullptr, nullptr, nullptr);
  }
  std::optional<std::string> Text(const char* sql) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    Stmt q(db_, sql);
    if (q.prepare_rc() != SQLITE_OK || q.Step() != SQLITE_ROW) return std::nullopt;
    return q.ColText(0);
  }
  std::optional<int64_t> Scalar(const char* sql) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    Stmt q(db_, sql);
    if (q.prepare_rc() != SQLITE_OK || q.Step() != SQLITE_ROW) return std::nullopt;
    return q.ColInt(0);
  }
  absl::Status Fail(int rc, const std::string& what) const ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return SqlError(rc, db_, path_, what);
  }
  // Runs `body` (its statements) as one transaction: all of it or none.
  // REQUIRES: mu_ held.
  absl::Status InTransaction(const std::string& what, const std::function<absl::Status()>& body)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (const int rc = Exec("BEGIN"); rc != SQLITE_OK) return Fail(rc, what);
    absl::Status st = body();
    if (st.ok()) {
      const int rc = Exec("COMMIT");
      if (rc == SQLITE_OK) return absl::OkStatus();
      st = Fail(rc, what);
    }
    Exec("ROLLBACK");
    return st;
  }
  // Runs a write statement. REQUIRES: mu_ held.
  absl::Status Run(Stmt& q, const std::string& what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (q.prepare_rc() != SQLITE_OK) return Fail(q.prepare_rc(), what);
    const int rc = q.Step();
    return rc == SQLITE_DONE ? absl::OkStatus() : Fail(rc, what);
  }
  const std::string path_;
  absl::Mutex mu_;
  sqlite3* const db_ ABSL_PT_GUARDED_BY(mu_);
  absl::flat_hash_map<const char*, sqlite3_stmt*> kept_ ABSL_GUARDED_BY(mu_);  // see Kept
};

}  // namespace

absl::StatusOr<std::unique_ptr<StateStore>> OpenSqliteStateStore(
    const std::string& path, const SqliteStateOptions& options) {
  const auto dir = std::filesystem::path(path).parent_path();
  if (!dir.empty() && !std::filesystem::is_directory(dir)) {
    return absl::InvalidArgumentError(
        absl::StrCat("state store ", path, ": directory ", dir.string(), " does not exist"));
  }
  sqlite3* db = nullptr;
  const int rc = sqlite3_open_v2(
      path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, nullptr);
  if (rc != SQLITE_OK) {
    absl::Status st = SqlError(rc, db, path, "open");
    sqlite3_close_v2(db);
    return st;
  }
  auto store = std::make_unique<SqliteStateStore>(path, db);
  if (auto st = store->Init(options); !st.ok()) return st;
  return store;
}

#undef RETURN_IF_SQL

}  // namespace ballast::global_scheduler
