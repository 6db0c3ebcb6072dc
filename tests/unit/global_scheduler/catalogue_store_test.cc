// CatalogueStore and the scheduler's use of it: Admin registrations and
// unregistrations survive a restart (a new Scheduler on the same SQLite
// file), the Admin's latest word wins over the config, a failed write
// changes nothing and is reported, a damaged file is refused naming it, and
// a second scheduler cannot open a file the first holds.
#include "global_scheduler/catalogue_store.h"

#include <filesystem>
#include <fstream>

#include "global_scheduler/scheduler.h"
#include "gtest/gtest.h"
#include "tests/unit/global_scheduler/faulty_state_store.h"

namespace ballast::global_scheduler {
namespace {

namespace fs = std::filesystem;

class CatalogueStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / absl::StrCat("catalogue_", getpid());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    path_ = (dir_ / "state.db").string();
  }
  void TearDown() override { fs::remove_all(dir_); }
  SchedulerOptions Options() const {
    SchedulerOptions o;
    o.models = {{"base", "/models/base"}, {"old", "/models/old"}};
    o.state_path = path_;
    return o;
  }
  static std::vector<std::string> Names(const Scheduler& s) {
    std::vector<std::string> names;
    const v1::ListModelsResponse list = s.ListModels();
    for (const auto& m : list.models()) names.push_back(m.name());
    return names;
  }
  fs::path dir_;
  std::string path_;
};

TEST_F(CatalogueStoreTest, AdminChangesSurviveARestart) {
  {
    auto s = *Scheduler::Create(Options());
    ModelSpec tuned{"tuned", "/models/tuned"};
    tuned.replicas = 2;
    tuned.ttft_ms = 300;
    ASSERT_TRUE(s->RegisterModel(tuned).ok());
    ASSERT_TRUE(s->UnregisterModel("old").ok());  // a config model
    ModelSpec base{"base", "/models/base"};
    base.kv_limit_bytes = 1 << 20;  // a limit change of a config model
    ASSERT_TRUE(s->RegisterModel(base).ok());
  }
  auto s = *Scheduler::Create(Options());  // the restart
  EXPECT_EQ(Names(*s), (std::vector<std::string>{"base", "tuned"}));
  EXPECT_EQ(s->Spec("tuned")->replicas, 2);
  EXPECT_EQ(s->Spec("tuned")->ttft_ms, 300u);
  EXPECT_EQ(s->Spec("base")->kv_limit_bytes, 1 << 20);
  ASSERT_TRUE(s->RegisterModel({"old", "/models/old"}).ok());  // back again
  s.reset();  // the file has one scheduler at a time
  auto again = *Scheduler::Create(Options());
  EXPECT_EQ(Names(*again), (std::vector<std::string>{"base", "old", "tuned"}));
}

TEST_F(CatalogueStoreTest, AFailedWriteChangesNothing) {
  auto faulty = std::make_shared<testing::FaultyStateStore>(*OpenSqliteStateStore(path_));
  SchedulerOptions o = Options();
  o.state_store = faulty;
  {
    auto s = *Scheduler::Create(o);
    ASSERT_TRUE(s->RegisterModel({"kept", "/models/kept"}).ok());
    faulty->FailWrites(true);
    const absl::Status st = s->RegisterModel({"lost", "/models/lost"});
    EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable);
    EXPECT_NE(st.message().find(path_), std::string::npos) << st.message();
    EXPECT_FALSE(s->HasModel("lost"));
    EXPECT_EQ(s->UnregisterModel("kept").code(), absl::StatusCode::kUnavailable);
    EXPECT_TRUE(s->HasModel("kept"));
    ModelSpec limited{"kept", "/models/kept"};
    limited.kv_limit_bytes = 1 << 20;  // a limit change refused is not applied
    EXPECT_EQ(s->RegisterModel(limited).code(), absl::StatusCode::kUnavailable);
    EXPECT_EQ(s->Spec("kept")->kv_limit_bytes, 0);
  }
  faulty.reset();  // the last references: the file's lock goes with them
  o.state_store.reset();
  auto again = *Scheduler::Create(Options());
  EXPECT_EQ(Names(*again), (std::vector<std::string>{"base", "kept", "old"}));
}

TEST_F(CatalogueStoreTest, ADamagedFileIsRefusedNamingTheFile) {
  std::ofstream(path_) << "this is not a database, but long enough to look like a header....";
  auto s = Scheduler::Create(Options());
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kDataLoss) << s.status().message();
  EXPECT_NE(s.status().message().find(path_), std::string::npos) << s.status().message();
  SchedulerOptions o = Options();
  o.state_path = (dir_ / "missing-dir" / "state.db").string();
  auto u = Scheduler::Create(o);
  ASSERT_FALSE(u.ok());
  EXPECT_NE(u.status().message().find("does not exist"), std::string::npos);
}

TEST_F(CatalogueStoreTest, ASecondSchedulerOnTheSameFileIsRefused) {
  auto first = *Scheduler::Create(Options());
  auto second = Scheduler::Create(Options());
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition)
      << second.status().message();
  EXPECT_NE(second.status().message().find("another scheduler"), std::string::npos)
      << second.status().message();
  first.reset();
  EXPECT_TRUE(Scheduler::Create(Options()).ok());  // the lock went with it
}

TEST_F(CatalogueStoreTest, ManyChangesReadBackInOrder) {
  auto state = *OpenSqliteStateStore(path_);
  auto store = *CatalogueStore::Create(state.get());
  for (int i = 0; i < 20; ++i) {
    ASSERT_TRUE(store->RecordRegistered({absl::StrCat("m", i), "/models/x"}).ok());
  }
  ASSERT_TRUE(store->RecordUnregistered("m3").ok());
  store.reset();
  state.reset();
  auto state2 = *OpenSqliteStateStore(path_);
  auto reread = *CatalogueStore::Create(state2.get());
  const auto models = reread->Apply({{"m3", "/config/m3"}, {"c", "/config/c"}});
  ASSERT_EQ(models.size(), 20u);  // c + m0..m19 without m3
  EXPECT_EQ(models[0].name, "c");
}

}  // namespace
}  // namespace ballast::global_scheduler
