// The `ballast` binary as a user meets it: start-up errors name the file and
// key, make-model writes a loadable checkpoint, client commands report
// unreachable servers with a non-zero exit.
#include <sys/wait.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "engine/model_config.h"
#include "engine/weights.h"
#include "gtest/gtest.h"
#include "tests/integration/process.h"

namespace ballast {
namespace {

const std::string kBin = std::string(BALLAST_BINARY_DIR) + "/server/ballast";

struct CommandResult {
  int exit_code;
  std::string output;
};

CommandResult Exec(const std::vector<std::string>& args, const std::string& log) {
  std::vector<std::string> argv = {kBin};
  argv.insert(argv.end(), args.begin(), args.end());
  testing::ChildProcess p(argv, log);
  // Wait for it to exit by itself (these commands do not serve).
  for (int i = 0; i < 3000 && p.running(); ++i) usleep(10000);
  const int status = p.Stop(SIGKILL);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, p.Log()};
}

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) / absl::StrCat("ballast_cli_", getpid());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }
  std::filesystem::path dir_;
};

TEST_F(CliTest, MalformedConfigFailsAtStartNamingFileAndKey) {
  std::ofstream(Path("bad.yaml"))
      << "scheduler:\n  listen: 127.0.0.1:0\n  heartbeat_timout_ms: 5\n";
  CommandResult r = Exec({"scheduler", "--config", Path("bad.yaml")}, Path("out.log"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find(Path("bad.yaml") + ": scheduler.heartbeat_timout_ms: unknown key"),
            std::string::npos)
      << r.output;
  CommandResult missing = Exec({"node", "--config", Path("nope.yaml")}, Path("out2.log"));
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_NE(missing.output.find("nope.yaml"), std::string::npos);
}

TEST_F(CliTest, MakeModelWritesALoadableCheckpoint) {
  CommandResult r =
      Exec({"make-model", "--out",          Path("m"), "--layers",   "3",    "--hidden",
            "32",         "--heads",        "4",       "--kv-heads", "2",    "--intermediate",
            "48",         "--vocab",        "300",     "--dtype",    "fp16", "--seed",
            "9",          "--architecture", "qwen2"},
           Path("mk.log"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto cfg = engine::ModelConfig::Load(Path("m") + "/config.json");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ(cfg->architecture, "Qwen2ForCausalLM");
  EXPECT_EQ(cfg->num_hidden_layers, 3);
  EXPECT_EQ(cfg->torch_dtype, engine::DType::kF16);
  auto w = engine::ModelWeights::Load(Path("m"), *cfg);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->stored_bytes, cfg->NumParameters() * 2);
  CommandResult bad =
      Exec({"make-model", "--out", Path("x"), "--hidden", "30", "--heads", "4"}, Path("b.log"));
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.output.find("head size"), std::string::npos) << bad.output;
}

TEST_F(CliTest, ClientCommandsReportAnUnreachableServer) {
  const std::string target = absl::StrCat("127.0.0.1:", testing::FreePort());
  CommandResult r = Exec({"generate", "--target", target, "-m", "x", "-p", "hi"}, Path("g.log"));
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_NE(r.output.find("UNAVAILABLE"), std::string::npos) << r.output;
  EXPECT_NE(Exec({"models", "--target", target}, Path("m.log")).exit_code, 0);
  EXPECT_NE(Exec({"health", "--target", target}, Path("h.log")).exit_code, 0);
}

}  // namespace
}  // namespace ballast
