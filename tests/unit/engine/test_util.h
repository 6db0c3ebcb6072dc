// Helpers shared by the engine tests: temporary directories and small
// synthetic models.
#pragma once

#include <filesystem>
#include <string>

#include "engine/synthetic_model.h"
#include "gtest/gtest.h"

namespace ballast::engine::testing {

// A fresh directory under the test's temp dir, removed at destruction.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = std::filesystem::path(::testing::TempDir()) /
            (std::string("ballast_") + info->test_suite_name() + "_" + info->name());
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string path() const { return path_.string(); }
  std::string sub(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

inline std::string WriteTinyModel(const TempDir& dir, const std::string& name,
                                  SyntheticModelSpec spec = {}) {
  const std::string out = dir.sub(name);
  auto st = WriteSyntheticModel(spec, out);
  EXPECT_TRUE(st.ok()) << st;
  return out;
}

}  // namespace ballast::engine::testing
