// The etcd StateStore and leader election against a real etcd (Debian's
// etcd-server, started by the test on loopback ports): what was written
// reads back exactly; turns append and rewrite; a leader's writes are
// fenced once another scheduler leads; a standby takes over when the
// leader's lease expires; a leader cut off from etcd learns it has lost;
// a campaign can be cancelled; an unreachable etcd is an error naming it.
// Skips when etcd is not installed (deploy/install-deps.sh installs it).
#include <filesystem>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "global_scheduler/etcd_client.h"
#include "global_scheduler/state_store.h"
#include "gtest/gtest.h"
#include "tests/integration/etcd_process.h"
#include "tests/unit/global_scheduler/state_store_sample.h"

namespace ballast::global_scheduler {
namespace {

namespace fs = std::filesystem;

class EtcdTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!ballast::testing::EtcdProcess::Installed()) GTEST_SKIP() << "etcd missing (etcd-server)";
    dir_ = fs::path(::testing::TempDir()) / absl::StrCat("etcd_", getpid());
    fs::remove_all(dir_);
    etcd_ = std::make_unique<ballast::testing::EtcdProcess>(dir_);
    ASSERT_TRUE(etcd_->ok()) << etcd_->Log();
    port_ = etcd_->port();
    client_ = *EtcdClient::Create(etcd_->endpoint(), absl::Seconds(5));
    // The port accepts before the member serves: the first call waits.
    for (int i = 0; i < 100 && !client_->Range("/probe", false).ok(); ++i) {
      absl::SleepFor(absl::Milliseconds(50));
    }
  }
  void TearDown() override {
    etcd_.reset();
    fs::remove_all(dir_);
  }
  std::unique_ptr<StateStore> Store(const LeaderElection* fence = nullptr) {
    EtcdStateOptions o;
    o.prefix = "/t";
    if (fence != nullptr) {
      o.fence_key = fence->key();
      o.fence_revision = fence->won_revision();
      o.fence_id = fence->id();
    }
    auto s = OpenEtcdStateStore(client_, o);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? std::move(*s) : nullptr;
  }
  fs::path dir_;
  int port_ = 0;
  std::unique_ptr<ballast::testing::EtcdProcess> etcd_;
  std::shared_ptr<EtcdClient> client_;
};

using testing::Msg;

TEST_F(EtcdTest, WhatWasWrittenReadsBackExactly) {
  testing::WriteSample(Store().get());
  auto store = Store();  // a new store over the same etcd: what a restart reads
  EXPECT_EQ(store->Describe(), absl::StrCat("etcd:127.0.0.1:", port_, "/t"));
  testing::ExpectSample(store.get());
}

TEST_F(EtcdTest, TurnsAppendAndRewrite) {
  auto store = Store();
  EXPECT_EQ(store->AppendTurn({"nobody", "n", absl::UnixEpoch(), {1}, {}, false}).code(),
            absl::StatusCode::kNotFound);
  ASSERT_TRUE(
      store
          ->PutSession(
              {"s", "m", "", false, "", {1, 2}, {}, LostReason::kExpired, absl::UnixEpoch()})
          .ok());
  ASSERT_TRUE(store->AppendTurn({"s", "n1", absl::FromUnixSeconds(5), {3}, {}, false}).ok());
  ASSERT_TRUE(
      store->AppendTurn({"s", "n2", absl::FromUnixSeconds(6), {4, 5}, {Msg("user", "x")}, false})
          .ok());
  auto sessions = *store->LoadSessions();
  ASSERT_EQ(sessions.size(), 1u);
  EXPECT_EQ(sessions[0].tokens, (std::vector<int>{1, 2, 3, 4, 5}));
  EXPECT_EQ(sessions[0].messages.size(), 1u);
  EXPECT_EQ(sessions[0].node_id, "n2");
  EXPECT_EQ(sessions[0].last_used, absl::FromUnixSeconds(6));
  EXPECT_FALSE(sessions[0].lost.has_value());  // a turn clears it
  ASSERT_TRUE(store->AppendTurn({"s", "n2", absl::FromUnixSeconds(7), {9}, {}, true}).ok());
  EXPECT_EQ((*store->LoadSessions())[0].tokens, (std::vector<int>{9}));
  EXPECT_TRUE((*store->LoadSessions())[0].messages.empty());
  // A whole rewrite keeps one turn key, not the history's.
  EXPECT_EQ(client_->Range("/t/session-turns/s/", true)->size(), 1u);
  ASSERT_TRUE(store->EraseSession("s").ok());
  EXPECT_TRUE(store->LoadSessions()->empty());
  EXPECT_TRUE(client_->Range("/t/session-turns/s/", true)->empty());
}

// A history past etcd's 1.5 MiB request limit (600,000 tokens, 2.4 MB, and
// 3 MB of chat text) is written in pieces and reads back whole; turns
// append after it, one of them past the limit itself; a whole rewrite
// replaces all the pieces.
TEST_F(EtcdTest, AHistoryPastEtcdsRequestLimitIsStoredInPieces) {
  std::vector<int> tokens(600000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int>(i * 7919 % 150000);
  std::vector<v1::ChatMessage> messages;
  for (int i = 0; i < 6; ++i) messages.push_back(Msg("user", std::string(500000, 'a' + i)));
  auto store = Store();
  ASSERT_TRUE(store
                  ->PutSession(
                      {"big", "m", "", true, "", tokens, messages, std::nullopt, absl::UnixEpoch()})
                  .ok());
  ASSERT_TRUE(store->AppendTurn({"big", "n", absl::FromUnixSeconds(3), {42}, {}, false}).ok());
  // A turn past the limit too (450,000 tokens, 1.8 MB, and two messages of
  // 1 MB): appended in pieces, after the history, before the next turn. (A
  // single message must fit one etcd request: pieces split between
  // messages, not inside one.)
  std::vector<int> turn(450000);
  for (size_t i = 0; i < turn.size(); ++i) turn[i] = static_cast<int>(i * 31 % 150000);
  const v1::ChatMessage ask = Msg("user", std::string(1000000, 'y'));
  const v1::ChatMessage reply = Msg("assistant", std::string(1000000, 'z'));
  const absl::Status appended =
      store->AppendTurn({"big", "n", absl::FromUnixSeconds(3), turn, {ask, reply}, false});
  ASSERT_TRUE(appended.ok()) << appended;
  ASSERT_TRUE(store->AppendTurn({"big", "n", absl::FromUnixSeconds(3), {43}, {}, false}).ok());
  auto sessions = *Store()->LoadSessions();
  ASSERT_EQ(sessions.size(), 1u);
  tokens.push_back(42);
  tokens.insert(tokens.end(), turn.begin(), turn.end());
  tokens.push_back(43);
  EXPECT_EQ(sessions[0].tokens, tokens);
  ASSERT_EQ(sessions[0].messages.size(), 8u);
  EXPECT_EQ(sessions[0].messages[5].content(), messages[5].content());
  EXPECT_EQ(sessions[0].messages[6].content(), ask.content());
  EXPECT_EQ(sessions[0].messages[7].content(), reply.content());
  ASSERT_TRUE(store->AppendTurn({"big", "n", absl::FromUnixSeconds(4), {1, 2}, {}, true}).ok());
  EXPECT_EQ((*Store()->LoadSessions())[0].tokens, (std::vector<int>{1, 2}));
  EXPECT_EQ(client_->Range("/t/session-turns/big/", true)->size(), 1u);
}

// The store remembers the session records it wrote: a record changed
// behind its back makes the next write fail (etcd's revision check), and
// the one after that reads etcd again and succeeds.
TEST_F(EtcdTest, ASessionRecordChangedElsewhereIsReadAgain) {
  auto store = Store();
  ASSERT_TRUE(
      store->PutSession({"s", "m", "", false, "", {1}, {}, std::nullopt, absl::UnixEpoch()}).ok());
  ASSERT_TRUE(store->AppendTurn({"s", "n1", absl::FromUnixSeconds(5), {2}, {}, false}).ok());
  auto other = Store();  // another writer (no fence): moves the affinity
  ASSERT_TRUE(other->SetAffinity("s", "n9").ok());
  const absl::Status stale =
      store->AppendTurn({"s", "n1", absl::FromUnixSeconds(6), {3}, {}, false});
  EXPECT_EQ(stale.code(), absl::StatusCode::kFailedPrecondition) << stale;
  ASSERT_TRUE(store->AppendTurn({"s", "n1", absl::FromUnixSeconds(7), {4}, {}, false}).ok());
  const auto sessions = *Store()->LoadSessions();
  ASSERT_EQ(sessions.size(), 1u);
  EXPECT_EQ(sessions[0].tokens, (std::vector<int>{1, 2, 4}));  // the refused turn is not there
  EXPECT_EQ(sessions[0].node_id, "n1");
}

TEST_F(EtcdTest, ALeadersWritesAreFencedOnceAnotherLeads) {
  LeaderElection a(client_, {"/t/leader", "a", 2});
  ASSERT_TRUE(a.Campaign(nullptr).ok());
  auto store_a = Store(&a);
  ASSERT_TRUE(store_a->PutUnregistered("x").ok());
  ASSERT_TRUE(a.Resign().ok());
  LeaderElection b(client_, {"/t/leader", "b", 2});
  ASSERT_TRUE(b.Campaign(nullptr).ok());
  auto store_b = Store(&b);
  const absl::Status late = store_a->PutUnregistered("y");
  EXPECT_EQ(late.code(), absl::StatusCode::kFailedPrecondition) << late;
  EXPECT_NE(late.message().find("this scheduler (a) no longer holds /t/leader"), std::string::npos)
      << late;
  EXPECT_TRUE(store_b->PutUnregistered("z").ok());
  EXPECT_EQ(store_b->LoadCatalogue()->unregistered, (std::vector<std::string>{"x", "z"}));
}

TEST_F(EtcdTest, AStandbyTakesOverWhenTheLeadersLeaseExpires) {
  auto a = std::make_unique<LeaderElection>(client_, LeaderElectionOptions{"/t/leader", "a", 2});
  ASSERT_TRUE(a->Campaign(nullptr).ok());
  LeaderElection b(client_, {"/t/leader", "b", 2});
  absl::Notification b_leads;
  absl::Status b_status;
  std::thread standby([&] {
    b_status = b.Campaign(nullptr);
    b_leads.Notify();
  });
  EXPECT_FALSE(b_leads.WaitForNotificationWithTimeout(absl::Seconds(3)))
      << "b led while a kept its lease alive";
  const absl::Time died = absl::Now();
  a.reset();  // a dies: its keep-alive stops, its lease is not revoked
  ASSERT_TRUE(b_leads.WaitForNotificationWithTimeout(absl::Seconds(10)));
  standby.join();
  ASSERT_TRUE(b_status.ok()) << b_status;
  const double took = absl::ToDoubleSeconds(absl::Now() - died);
  std::cout << "standby led " << took << " s after the leader died (lease TTL 2 s)\n";
  EXPECT_LT(took, 2 + 3.0);  // the TTL (etcd may round it up) and one watch round trip
  EXPECT_EQ((*client_->Range("/t/leader", false))[0].value(), "b");
}

TEST_F(EtcdTest, ALeaderCutOffFromEtcdLearnsItLost) {
  LeaderElection a(client_, {"/t/leader", "a", 2});
  absl::Notification lost;
  absl::Status why;
  ASSERT_TRUE(a.Campaign([&](const absl::Status& st) {
                 why = st;
                 lost.Notify();
               }).ok());
  EXPECT_FALSE(lost.WaitForNotificationWithTimeout(absl::Seconds(3)));  // renewals succeed
  etcd_->Signal(SIGSTOP);
  const bool noticed = lost.WaitForNotificationWithTimeout(absl::Seconds(10));
  etcd_->Signal(SIGCONT);
  ASSERT_TRUE(noticed);
  EXPECT_NE(why.message().find("leadership of /t/leader lost"), std::string::npos) << why;
}

TEST_F(EtcdTest, ACampaignCanBeCancelled) {
  LeaderElection a(client_, {"/t/leader", "a", 5});
  ASSERT_TRUE(a.Campaign(nullptr).ok());
  LeaderElection b(client_, {"/t/leader", "b", 5});
  absl::Status st;
  std::thread standby([&] { st = b.Campaign(nullptr); });
  absl::SleepFor(absl::Milliseconds(500));  // b is watching
  b.Cancel();
  standby.join();
  EXPECT_EQ(st.code(), absl::StatusCode::kCancelled) << st;
  EXPECT_EQ((*client_->Range("/t/leader", false))[0].value(), "a");
}

TEST(EtcdUnreachable, OpeningFailsNamingTheEndpoint) {
  const std::string target = absl::StrCat("127.0.0.1:", ballast::testing::FreePort());
  auto client = *EtcdClient::Create(target, absl::Milliseconds(300));
  auto store = OpenEtcdStateStore(client, {});
  ASSERT_FALSE(store.ok());
  EXPECT_NE(store.status().message().find("etcd " + target), std::string::npos) << store.status();
  EtcdStateOptions bad;
  bad.prefix = "ballast/";
  EXPECT_EQ(OpenEtcdStateStore(client, bad).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ballast::global_scheduler
