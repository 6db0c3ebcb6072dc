// The SQLite StateStore and the session directory's write-through: what a
// directory acknowledged is what a directory restored from the same file
// holds (compared against the live directory, operation by operation); a
// store that cannot write refuses new sessions and counts later failures;
// a full store is RESOURCE_EXHAUSTED; a damaged row or a newer schema is
// refused naming the file; a file of the previous schema is upgraded.
#include <sqlite3.h>
#include <unistd.h>

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "global_scheduler/session_directory.h"
#include "global_scheduler/state_store.h"
#include "gtest/gtest.h"
#include "tests/unit/global_scheduler/faulty_state_store.h"
#include "tests/unit/global_scheduler/state_store_sample.h"

namespace ballast::global_scheduler {
namespace {

namespace fs = std::filesystem;

using testing::Msg;

TurnRecord Turn(std::vector<int> prompt, std::vector<int> output) {
  TurnRecord t;
  t.prompt_tokens = std::move(prompt);
  t.output_tokens = std::move(output);
  return t;
}

// Runs `sql` on the file directly (the store must be closed).
void RawSql(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  char* err = nullptr;
  const int rc = sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &err);
  EXPECT_EQ(rc, SQLITE_OK) << (err ? err : "");
  sqlite3_free(err);
  sqlite3_close(db);
}

class StateStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / absl::StrCat("state_", getpid());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    path_ = (dir_ / "state.db").string();
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
  std::string path_;
};

TEST_F(StateStoreTest, SessionsAndTheCatalogueReadBackExactly) {
  {
    auto store = *OpenSqliteStateStore(path_);
    testing::WriteSample(store.get());
  }
  auto store = *OpenSqliteStateStore(path_);
  testing::ExpectSample(store.get());
}

// Whatever the live directory acknowledged, a directory restored from the
// file answers the same.
TEST_F(StateStoreTest, ARestoredDirectoryMatchesTheLiveOne) {
  absl::Time now = absl::FromUnixSeconds(1000);
  auto clock = [&now] { return now; };
  auto store = *OpenSqliteStateStore(path_);
  SessionDirectory live(clock);
  ASSERT_TRUE(live.Restore(store.get()).ok());
  ASSERT_TRUE(live.Begin("text", "m", false, "acme").ok());
  EXPECT_TRUE(live.Commit("text", "node-1", Turn({1, 2, 3}, {4, 5})).ok());
  ASSERT_TRUE(live.Begin("text", "m", false, "acme").ok());
  EXPECT_TRUE(live.Commit("text", "node-1", Turn({6}, {7})).ok());
  ASSERT_TRUE(live.Begin("chat", "m", true).ok());
  TurnRecord chat = Turn({10, 11}, {12});
  chat.prompt_replaces_history = true;
  chat.messages = {Msg("user", "hi"), Msg("assistant", "hello")};
  EXPECT_TRUE(live.Commit("chat", "node-2", chat).ok());
  live.SetAffinity("chat", "node-3");
  ASSERT_TRUE(live.Begin("ended", "m").ok());
  EXPECT_TRUE(live.Commit("ended", "node-1", Turn({1}, {2})).ok());
  bool existed = false;
  ASSERT_TRUE(live.End("ended", &existed).ok());
  ASSERT_TRUE(live.Begin("aborted", "m").ok());  // no history: an abort forgets it
  live.Abort("aborted");
  ASSERT_TRUE(live.Begin("old", "m").ok());
  EXPECT_TRUE(live.Commit("old", "node-2", Turn({9}, {9})).ok());
  live.ForgetNode("node-2");  // "old" loses its affinity, "chat" is on node-3
  now += absl::Minutes(31);
  ASSERT_TRUE(live.Begin("text", "m", false, "acme").ok());  // keeps "text" fresh
  EXPECT_TRUE(live.Commit("text", "node-1", Turn({8}, {})).ok());
  ASSERT_EQ(live.Expire(absl::Minutes(30)).size(), 2u);  // "chat" and "old"
  ASSERT_TRUE(live.Begin("lost", "m").ok());
  live.MarkLost("lost", LostReason::kForgotten);
  ASSERT_TRUE(live.Begin("chat2", "m", true).ok());
  EXPECT_TRUE(live.Commit("chat2", "node-1", chat).ok());
  // A chat turn whose rendering extends the tokens (stored as a delta), then
  // one that does not (stored whole).
  TurnRecord extends = Turn({10, 11, 12, 20}, {21});
  extends.prompt_replaces_history = true;
  extends.messages = {Msg("user", "more"), Msg("assistant", "sure")};
  ASSERT_TRUE(live.Begin("chat2", "m", true).ok());
  EXPECT_TRUE(live.Commit("chat2", "node-1", extends).ok());
  TurnRecord differs = Turn({30, 31}, {32});
  differs.prompt_replaces_history = true;
  differs.messages = {Msg("user", "again"), Msg("assistant", "ok")};
  ASSERT_TRUE(live.Begin("chat2", "m", true).ok());
  EXPECT_TRUE(live.Commit("chat2", "node-1", differs).ok());
  store.reset();  // the restart

  auto reopened = *OpenSqliteStateStore(path_);
  SessionDirectory restored(clock);
  ASSERT_TRUE(restored.Restore(reopened.get()).ok());
  EXPECT_EQ(restored.size(), live.size());
  for (const char* id : {"text", "chat", "chat2", "lost", "ended", "aborted", "old"}) {
    for (const char* tenant : {"", "acme"}) {
      auto want = live.Peek(id, tenant);
      auto got = restored.Peek(id, tenant);
      ASSERT_EQ(got.status(), want.status()) << id << " " << tenant;
      if (!want.ok()) continue;
      EXPECT_EQ(got->model, want->model) << id;
      EXPECT_EQ(got->tokens, want->tokens) << id;
      EXPECT_EQ(got->node_id, want->node_id) << id;
    }
  }
  auto turn = restored.Begin("text", "m", false, "acme");
  ASSERT_TRUE(turn.ok()) << turn.status();
  EXPECT_FALSE(turn->fresh);
  EXPECT_EQ(turn->history, (std::vector<int>{1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(turn->node_id, "node-1");
  EXPECT_EQ(restored.Begin("text", "m", false, "other").status().code(),
            absl::StatusCode::kPermissionDenied);
  auto chat2 = restored.Begin("chat2", "m", true);
  ASSERT_TRUE(chat2.ok()) << chat2.status();
  EXPECT_EQ(chat2->history, (std::vector<int>{30, 31, 32}));
  std::vector<std::string> contents;
  for (const auto& m : chat2->messages) contents.push_back(m.content());
  EXPECT_EQ(contents, (std::vector<std::string>{"hi", "hello", "more", "sure", "again", "ok"}));
  // The per-tenant count is restored: "acme" holds one session.
  EXPECT_EQ(restored.Begin("another", "m", false, "acme", 1).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(restored.Begin("another", "m", false, "acme", 2).ok());
  // The lost-reasons survive too: "lost" was forgotten, "chat" expired.
  EXPECT_NE(restored.Begin("lost", "m").status().message().find("restarted"), std::string::npos);
  EXPECT_NE(restored.Begin("chat", "m", true).status().message().find("expired"),
            std::string::npos);
}

TEST_F(StateStoreTest, TurnsAppendAndRewrite) {
  auto store = *OpenSqliteStateStore(path_);
  EXPECT_EQ(store->AppendTurn({"nobody", "n", absl::UnixEpoch(), {1}, {}, false}).code(),
            absl::StatusCode::kNotFound);
  ASSERT_TRUE(
      store
          ->PutSession(
              {"s", "m", "", false, "", {1, 2}, {}, LostReason::kExpired, absl::UnixEpoch()})
          .ok());
  ASSERT_TRUE(store->AppendTurn({"s", "n1", absl::FromUnixSeconds(5), {3}, {}, false}).ok());
  ASSERT_TRUE(store->AppendTurn({"s", "n2", absl::FromUnixSeconds(6), {4, 5}, {}, false}).ok());
  auto sessions = *store->LoadSessions();
  ASSERT_EQ(sessions.size(), 1u);
  EXPECT_EQ(sessions[0].tokens, (std::vector<int>{1, 2, 3, 4, 5}));
  EXPECT_EQ(sessions[0].node_id, "n2");
  EXPECT_EQ(sessions[0].last_used, absl::FromUnixSeconds(6));
  EXPECT_FALSE(sessions[0].lost.has_value());  // a turn clears it
  ASSERT_TRUE(store->AppendTurn({"s", "n2", absl::FromUnixSeconds(7), {9}, {}, true}).ok());
  EXPECT_EQ((*store->LoadSessions())[0].tokens, (std::vector<int>{9}));
  ASSERT_TRUE(store->EraseSession("s").ok());
  EXPECT_TRUE(store->LoadSessions()->empty());
  // The erase took the turns too: a new session of that id starts empty.
  ASSERT_TRUE(
      store->PutSession({"s", "m", "", false, "", {}, {}, std::nullopt, absl::UnixEpoch()}).ok());
  EXPECT_TRUE((*store->LoadSessions())[0].tokens.empty());
}

TEST_F(StateStoreTest, AStoreThatCannotWriteRefusesWhatWouldBeAcknowledged) {
  {
    testing::FaultyStateStore store(*OpenSqliteStateStore(path_));
    SessionDirectory d;
    ASSERT_TRUE(d.Restore(&store).ok());
    ASSERT_TRUE(d.Begin("s", "m").ok());
    ASSERT_TRUE(d.Commit("s", "node-1", Turn({1}, {2})).ok());
    store.FailWrites(true);
    auto refused = d.Begin("new", "m");
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
    EXPECT_NE(refused.status().message().find("injected"), std::string::npos) << refused.status();
    EXPECT_EQ(d.size(), 1);  // nothing left of the refused session
    // A turn that cannot be saved is not acknowledged and not in the
    // history, in memory or in the file.
    ASSERT_TRUE(d.Begin("s", "m").ok());
    const absl::Status st = d.Commit("s", "node-1", Turn({3}, {4}));
    EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
    EXPECT_EQ(d.Peek("s", "")->tokens, (std::vector<int>{1, 2}));
    // An end that cannot be saved is refused: the session would come back.
    bool existed = false;
    EXPECT_EQ(d.End("s", &existed).status().code(), absl::StatusCode::kUnavailable);
    EXPECT_EQ(d.size(), 1);
    d.ForgetNode("node-1");  // bookkeeping nobody waits on: counted
    EXPECT_EQ(d.write_errors(), 1);
    // The turn ended: the next one may start (and is saved once the store
    // writes again).
    store.FailWrites(false);
    ASSERT_TRUE(d.Begin("s", "m").ok());
    ASSERT_TRUE(d.Commit("s", "node-2", Turn({5}, {6})).ok());
  }
  auto reopened = *OpenSqliteStateStore(path_);
  SessionDirectory restored;
  ASSERT_TRUE(restored.Restore(reopened.get()).ok());
  EXPECT_EQ(restored.Peek("s", "")->tokens, (std::vector<int>{1, 2, 5, 6}));
}

// A session restored with no committed turn (created just before a
// restart) is new to the lost-history check again.
TEST_F(StateStoreTest, ARestoredSessionWithNoTurnIsFresh) {
  {
    auto store = *OpenSqliteStateStore(path_);
    SessionDirectory d;
    ASSERT_TRUE(d.Restore(store.get()).ok());
    ASSERT_TRUE(d.Begin("s", "m").ok());  // the turn never finished
  }
  auto store = *OpenSqliteStateStore(path_);
  SessionDirectory d;
  ASSERT_TRUE(d.Restore(store.get()).ok());
  auto turn = d.Begin("s", "m");
  ASSERT_TRUE(turn.ok()) << turn.status();
  EXPECT_TRUE(turn->fresh);
}

TEST_F(StateStoreTest, AFullStoreIsResourceExhaustedNamingTheFile) {
  auto store = *OpenSqliteStateStore(path_, {StateSync::kFull, 256 << 10});
  absl::Status st;
  std::vector<int> tokens(16 << 10, 7);  // 64 KiB a session
  for (int i = 0; i < 16 && st.ok(); ++i) {
    st = store->PutSession(
        {absl::StrCat("s", i), "m", "", false, "", tokens, {}, std::nullopt, absl::UnixEpoch()});
  }
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
  EXPECT_NE(st.message().find(path_), std::string::npos) << st;
  EXPECT_NE(st.message().find("max_mb"), std::string::npos) << st;
  // What was committed before is intact and readable.
  auto sessions = store->LoadSessions();
  ASSERT_TRUE(sessions.ok()) << sessions.status();
  EXPECT_GE(sessions->size(), 1u);
  for (const auto& s : *sessions) EXPECT_EQ(s.tokens, tokens);
}

TEST_F(StateStoreTest, DamagedRowsAndNewerSchemasAreRefusedNamingTheFile) {
  { auto store = *OpenSqliteStateStore(path_); }
  RawSql(path_,
         "INSERT INTO sessions VALUES ('bad', 'm', '', 0, '', NULL, 0);"
         "INSERT INTO session_turns VALUES ('bad', 0, x'010203', x'');");
  {
    auto store = *OpenSqliteStateStore(path_);
    auto sessions = store->LoadSessions();
    EXPECT_EQ(sessions.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_NE(sessions.status().message().find(path_ + ": session bad: tokens"), std::string::npos)
        << sessions.status();
  }
  RawSql(path_, "UPDATE session_turns SET tokens = x'', messages = x'05ff';");
  {
    auto store = *OpenSqliteStateStore(path_);
    EXPECT_EQ(store->LoadSessions().status().code(), absl::StatusCode::kDataLoss);
  }
  RawSql(path_,
         "DELETE FROM session_turns; INSERT INTO session_turns VALUES ('ghost', 0, x'', x'');");
  {
    auto store = *OpenSqliteStateStore(path_);
    auto sessions = store->LoadSessions();
    EXPECT_EQ(sessions.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_NE(sessions.status().message().find("ghost"), std::string::npos) << sessions.status();
  }
  RawSql(path_, "PRAGMA user_version = 99;");
  auto newer = OpenSqliteStateStore(path_);
  EXPECT_EQ(newer.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(newer.status().message().find("newer Ballast"), std::string::npos) << newer.status();
}

// A file written by the schema before models.quantization (version 1)
// opens: the column is added, its models read "none", and it then stores
// and reads back a quantization like a new file.
TEST_F(StateStoreTest, AVersionOneFileGainsTheQuantizationColumn) {
  RawSql(path_,
         "CREATE TABLE models(name TEXT PRIMARY KEY, registered INTEGER NOT NULL, "
         "path TEXT NOT NULL, kv_dtype TEXT NOT NULL, ttft_ms INTEGER NOT NULL, "
         "tpot_ms INTEGER NOT NULL, replicas INTEGER NOT NULL, kv_floor_bytes INTEGER NOT NULL, "
         "kv_limit_bytes INTEGER NOT NULL) WITHOUT ROWID;"
         "CREATE TABLE sessions(id TEXT PRIMARY KEY, model TEXT NOT NULL, tenant TEXT NOT NULL, "
         "chat INTEGER NOT NULL, node TEXT NOT NULL, lost INTEGER, "
         "last_used_us INTEGER NOT NULL);"
         "CREATE TABLE session_turns(session_id TEXT NOT NULL, seq INTEGER NOT NULL, "
         "tokens BLOB NOT NULL, messages BLOB NOT NULL, PRIMARY KEY(session_id, seq));"
         "CREATE INDEX sessions_by_node ON sessions(node);"
         "INSERT INTO models VALUES ('kept', 1, '/models/kept', 'bf16', 300, 40, 2, 0, 0);"
         "INSERT INTO models VALUES ('gone', 0, '', '', 0, 0, 0, 0, 0);"
         "INSERT INTO sessions VALUES ('s', 'kept', '', 0, 'node-1', NULL, 5);"
         "PRAGMA user_version = 1;");
  {
    auto store = OpenSqliteStateStore(path_);
    ASSERT_TRUE(store.ok()) << store.status();
    auto catalogue = (*store)->LoadCatalogue();
    ASSERT_TRUE(catalogue.ok()) << catalogue.status();
    ASSERT_EQ(catalogue->registered.size(), 1u);
    EXPECT_EQ(catalogue->registered[0].name, "kept");
    EXPECT_EQ(catalogue->registered[0].kv_dtype, "bf16");
    EXPECT_EQ(catalogue->registered[0].replicas, 2);
    EXPECT_EQ(catalogue->registered[0].quantization, "none");
    EXPECT_EQ(catalogue->unregistered, std::vector<std::string>{"gone"});
    EXPECT_EQ((*store)->LoadSessions()->size(), 1u);
    ModelSpec fp8{"fp8", "/models/fp8"};
    fp8.quantization = "fp8";
    ASSERT_TRUE((*store)->PutRegistered(fp8).ok());
    ASSERT_TRUE((*store)->PutUnregistered("gone2").ok());
  }
  auto store = OpenSqliteStateStore(path_);  // upgraded once: opens as it is
  ASSERT_TRUE(store.ok()) << store.status();
  auto catalogue = *(*store)->LoadCatalogue();
  ASSERT_EQ(catalogue.registered.size(), 2u);
  EXPECT_EQ(catalogue.registered[0].name, "fp8");
  EXPECT_EQ(catalogue.registered[0].quantization, "fp8");
  EXPECT_EQ(catalogue.registered[1].quantization, "none");
  EXPECT_EQ(catalogue.unregistered, (std::vector<std::string>{"gone", "gone2"}));
}

}  // namespace
}  // namespace ballast::global_scheduler
