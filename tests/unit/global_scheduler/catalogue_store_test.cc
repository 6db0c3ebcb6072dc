// CatalogueStore and the scheduler's use of it: Admin registrations and
// unregistrations survive a restart (a new Scheduler on the same file), the
// Admin's latest word wins over the config, a failed write changes nothing
// and is reported, and a damaged file is refused naming the file and key.
#include "global_scheduler/catalogue_store.h"

#include <filesystem>
#include <fstream>

#include "global_scheduler/scheduler.h"
#include "gtest/gtest.h"

namespace ballast::global_scheduler {
namespace {

namespace fs = std::filesystem;

class CatalogueStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / absl::StrCat("catalogue_", getpid());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    path_ = (dir_ / "catalogue.json").string();
  }
  void TearDown() override { fs::remove_all(dir_); }
  SchedulerOptions Options() const {
    SchedulerOptions o;
    o.models = {{"base", "/models/base"}, {"old", "/models/old"}};
    o.catalogue_file = path_;
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
  auto again = *Scheduler::Create(Options());
  EXPECT_EQ(Names(*again), (std::vector<std::string>{"base", "old", "tuned"}));
}

TEST_F(CatalogueStoreTest, AFailedWriteChangesNothing) {
  auto s = *Scheduler::Create(Options());
  ASSERT_TRUE(s->RegisterModel({"kept", "/models/kept"}).ok());
  // The temporary's name is taken by a directory: every write fails (even
  // as root, unlike a read-only directory).
  fs::create_directory(path_ + ".tmp");
  const absl::Status st = s->RegisterModel({"lost", "/models/lost"});
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(st.message().find(path_), std::string::npos) << st.message();
  EXPECT_FALSE(s->HasModel("lost"));
  EXPECT_EQ(s->UnregisterModel("kept").code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(s->HasModel("kept"));
  fs::remove(path_ + ".tmp");
  auto again = *Scheduler::Create(Options());
  EXPECT_EQ(Names(*again), (std::vector<std::string>{"base", "kept", "old"}));
}

TEST_F(CatalogueStoreTest, ADamagedFileIsRefusedNamingFileAndKey) {
  std::ofstream(path_)
      << "{\"version\": 1, \"registered\": [{\"name\": \"m\", \"replicas\": \"two\"}]}";
  auto s = Scheduler::Create(Options());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find(path_ + ": registered[0].replicas"), std::string::npos)
      << s.status().message();
  std::ofstream(path_) << "{not json";
  auto t = CatalogueStore::Open(path_);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(t.status().message().find(path_), std::string::npos) << t.status().message();
  for (const char* text : {"{\"version\": \"1\"}", "{\"version\": 1, \"registered\": {}}",
                           "{\"version\": 1, \"unregistered\": [{}]}", "[1, 2]"}) {
    std::ofstream(path_) << text;
    auto v = CatalogueStore::Open(path_);  // an error, never an exception
    ASSERT_FALSE(v.ok()) << text;
    EXPECT_NE(v.status().message().find(path_), std::string::npos) << v.status().message();
  }
  auto u = CatalogueStore::Open((dir_ / "missing-dir" / "c.json").string());
  ASSERT_FALSE(u.ok());
  EXPECT_NE(u.status().message().find("does not exist"), std::string::npos);
}

TEST_F(CatalogueStoreTest, TheWriteIsWholeAndLeavesNoTemporary) {
  auto store = *CatalogueStore::Open(path_);
  for (int i = 0; i < 20; ++i) {
    ASSERT_TRUE(store->RecordRegistered({absl::StrCat("m", i), "/models/x"}).ok());
  }
  ASSERT_TRUE(store->RecordUnregistered("m3").ok());
  EXPECT_FALSE(fs::exists(path_ + ".tmp"));
  auto reread = *CatalogueStore::Open(path_);
  const auto models = reread->Apply({{"m3", "/config/m3"}, {"c", "/config/c"}});
  ASSERT_EQ(models.size(), 20u);  // c + m0..m19 without m3
  EXPECT_EQ(models[0].name, "c");
}

}  // namespace
}  // namespace ballast::global_scheduler
