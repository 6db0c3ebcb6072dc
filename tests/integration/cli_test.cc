// The `ballast` binary as a user meets it: start-up errors name the file and
// key, make-model writes a loadable checkpoint, client commands report
// unreachable servers with a non-zero exit, trace import writes a trace that
// reads back and reports bad input with exit code 2, simulate and simulate
// sweep write their results.
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "bench/trace.h"
#include "engine/model_config.h"
#include "engine/weights.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
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
  // The metrics probe (a standby scheduler's liveness) names the URL.
  const std::string url = absl::StrCat("http://", target, "/metrics");
  CommandResult metrics = Exec({"health", "--metrics-url", url}, Path("hm.log"));
  EXPECT_EQ(metrics.exit_code, 3);
  EXPECT_NE(metrics.output.find("error: GET " + url + ": cannot connect to " + target),
            std::string::npos)
      << metrics.output;
  CommandResult bad = Exec({"health", "--metrics-url", "https://" + target}, Path("hb.log"));
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.output.find("https is not supported"), std::string::npos) << bad.output;
}

TEST_F(CliTest, TraceImportWritesATraceThatReadsBack) {
  std::ofstream(Path("burst.csv"))
      << "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\r\n"
         "10,ChatGPT,120,30,150,Conversation log\r\n"
         "11,GPT-4,80,0,80,API log\r\n"
         "12.5,GPT-4,\"64\",16,80,API log\r\n"
         "20,ChatGPT,10,2,12,API log\r\n";
  CommandResult r =
      Exec({"trace", "import", "--format", "burstgpt", "--input", Path("burst.csv"), "--out",
            Path("t.jsonl"), "--models", "a,b", "--duration", "5", "--time-scale", "2"},
           Path("import.log"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(absl::StrCat("imported 2 requests into ", Path("t.jsonl"),
                                       " from 1 burstgpt file (4 rows); skipped 1 failed "
                                       "(Response tokens 0), 1 outside the window; window [0, 5) "
                                       "s of a 10 s trace, time scale 2; models: ChatGPT -> a, "
                                       "GPT-4 -> b")),
            std::string::npos)
      << r.output;
  auto trace = bench::ReadTrace(Path("t.jsonl"));
  ASSERT_TRUE(trace.ok()) << trace.status();
  ASSERT_EQ(trace->size(), 2u);
  const bench::TraceRecord& first = (*trace)[0];
  const bench::TraceRecord& second = (*trace)[1];
  EXPECT_EQ(first.id, "r0");
  EXPECT_EQ(first.model, "a");
  EXPECT_DOUBLE_EQ(first.arrival_s, 0);
  EXPECT_EQ(first.prompt_tokens, 120);
  EXPECT_EQ(first.output_tokens, 30);
  EXPECT_EQ(second.id, "r1");
  EXPECT_EQ(second.model, "b");
  EXPECT_DOUBLE_EQ(second.arrival_s, 5);  // 2.5 s into the trace, x2
  EXPECT_EQ(second.prompt_tokens, 64);
  EXPECT_EQ(second.output_tokens, 16);
}

TEST_F(CliTest, TraceShareGptWritesAnOfflineTrace) {
  CommandResult r = Exec(
      {"trace", "sharegpt", "-n", "7", "--models", "a,b", "--seed", "3", "--out", Path("s.jsonl")},
      Path("sharegpt.log"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto trace = bench::ReadTrace(Path("s.jsonl"));
  ASSERT_TRUE(trace.ok()) << trace.status();
  ASSERT_EQ(trace->size(), 7u);
  EXPECT_EQ((*trace)[6].model, "a");
  EXPECT_EQ((*trace)[5].model, "b");
  for (const auto& t : *trace) EXPECT_EQ(t.arrival_s, 0);
  CommandResult stats = Exec({"trace", "stats", Path("s.jsonl")}, Path("stats.log"));
  ASSERT_EQ(stats.exit_code, 0) << stats.output;
  EXPECT_NE(stats.output.find("7 requests"), std::string::npos) << stats.output;
  EXPECT_NE(stats.output.find("prompt tokens mean"), std::string::npos) << stats.output;
  CommandResult none =
      Exec({"trace", "sharegpt", "--models", "", "--out", Path("n.jsonl")}, Path("none.log"));
  EXPECT_EQ(none.exit_code, 2);
  EXPECT_NE(none.output.find("--models: expected at least one model name"), std::string::npos)
      << none.output;
}

TEST_F(CliTest, TraceImportErrorsExitTwoNamingFileLineAndColumn) {
  std::ofstream(Path("bad.csv")) << "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                                    "2023-11-16 18:15:46.6805900,x,1\n";
  CommandResult bad = Exec({"trace", "import", "--format", "azure", "--input", Path("bad.csv"),
                            "--out", Path("b.jsonl"), "--models", "a"},
                           Path("bad.log"));
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.output.find(absl::StrCat("error: ", Path("bad.csv"),
                                         ":2: column \"ContextTokens\": expected a "
                                         "non-negative integer, got \"x\"")),
            std::string::npos)
      << bad.output;
  EXPECT_FALSE(std::filesystem::exists(Path("b.jsonl")));
  CommandResult two =
      Exec({"trace", "import", "--format", "azure", "--input", Path("bad.csv"), "--input",
            Path("bad.csv"), "--out", Path("two.jsonl"), "--models", "a"},
           Path("two.log"));
  EXPECT_EQ(two.exit_code, 2);
  EXPECT_NE(two.output.find("2 input files (one service each) but --models names 1 model (a)"),
            std::string::npos)
      << two.output;
  CommandResult format = Exec({"trace", "import", "--format", "sharegpt", "--input",
                               Path("bad.csv"), "--out", Path("f.jsonl"), "--models", "a"},
                              Path("format.log"));
  EXPECT_EQ(format.exit_code, 2);
  EXPECT_NE(format.output.find("--format: expected azure, burstgpt or mooncake, got \"sharegpt\""),
            std::string::npos)
      << format.output;
}

TEST_F(CliTest, SimulateAndSweepWriteTheirResults) {
  const std::string config = std::string(BALLAST_SOURCE_DIR) + "/configs/sim/small.yaml";
  std::string models;
  for (int i = 0; i < 6; ++i) absl::StrAppend(&models, "small-", i, ",");
  for (int i = 0; i < 4; ++i) absl::StrAppend(&models, "mid-", i, ",");
  absl::StrAppend(&models, "big-0,big-1,unknown");
  ASSERT_EQ(Exec({"trace", "bursty", "--models", models, "--duration", "60", "-o", Path("t.jsonl")},
                 Path("tr.log"))
                .exit_code,
            0);
  CommandResult r = Exec({"simulate", "--config", config, "--trace", Path("t.jsonl"), "--out",
                          Path("sim"), "--rate-scale", "1,4", "--no-plots"},
                         Path("sim.log"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  nlohmann::json j = nlohmann::json::parse(std::ifstream(Path("sim/result.json")));
  ASSERT_EQ(j["runs"].size(), 2u);
  for (const auto& run : j["runs"]) {
    EXPECT_TRUE(run["accounting_ok"].get<bool>());
    EXPECT_EQ(run["simulation"]["gpus"], 8);
    EXPECT_GT(run["total"]["completed"].get<int>(), 0);
    EXPECT_GT(run["by_status"]["NOT_FOUND"].get<int>(), 0);  // the unknown model's requests
  }
  EXPECT_TRUE(std::filesystem::exists(Path("sim/requests-4.csv")));
  // An ensemble: the trace as it is, then jittered; each figure's runs,
  // mean, min and max, the first run the one reported.
  r = Exec({"simulate", "--config", config, "--trace", Path("t.jsonl"), "--out", Path("ens"),
            "--rate-scale", "4", "--repeats", "3", "--jitter-ms", "2", "--no-plots"},
           Path("ens.log"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("ensemble of 3 runs (arrivals moved by up to 2 ms)"), std::string::npos)
      << r.output;
  j = nlohmann::json::parse(std::ifstream(Path("ens/result.json")));
  const auto& ens = j["runs"][0]["ensemble"];
  EXPECT_EQ(ens["repeats"], 3);
  for (const char* f :
       {"slo_attainment", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "token_throughput"}) {
    ASSERT_EQ(ens[f]["runs"].size(), 3u) << f;
    EXPECT_LE(ens[f]["min"].get<double>(), ens[f]["mean"].get<double>()) << f;
    EXPECT_LE(ens[f]["mean"].get<double>(), ens[f]["max"].get<double>()) << f;
  }
  EXPECT_DOUBLE_EQ(ens["slo_attainment"]["runs"][0].get<double>(),
                   j["runs"][0]["total"]["slo_attainment"].get<double>());
  EXPECT_DOUBLE_EQ(ens["ttft_p50_ms"]["runs"][0].get<double>(),
                   j["runs"][0]["total"]["ttft_ms"]["p50"].get<double>());
  // The jittered runs are other runs: their TTFTs differ from the first's.
  EXPECT_NE(ens["ttft_p99_ms"]["runs"][1].get<double>(),
            ens["ttft_p99_ms"]["runs"][0].get<double>());
  r = Exec({"simulate", "--config", config, "--trace", Path("t.jsonl"), "--jitter-ms", "1"},
           Path("jit.log"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("--jitter-ms applies to an ensemble"), std::string::npos) << r.output;
  r = Exec({"simulate", "--config", config, "--trace", Path("t.jsonl"), "--repeats", "2"},
           Path("rep.log"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("--repeats above 1 needs --jitter-ms"), std::string::npos) << r.output;
  r = Exec(
      {"simulate", "sweep", "--config", config, "--trace", Path("t.jsonl"), "--out", Path("sweep"),
       "--gpus", "1,3,8", "--slo-scale", "1,20", "--target", "0.8", "--no-plots"},
      Path("sweep.log"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  j = nlohmann::json::parse(std::ifstream(Path("sweep/sweep.json")));
  EXPECT_EQ(j["policies"]["ballast"]["runs"].size(), 3u);
  EXPECT_EQ(j["policies"]["static-fcfs"]["runs"][1]["simulation"]["gpus"], 3);
  std::stringstream md;
  md << std::ifstream(Path("sweep/sweep.md")).rdbuf();
  // One table per metric (both, TTFT, TPOT), a column per SLO scale.
  for (const char* what : {"TTFT and TPOT attainment", "TTFT attainment", "TPOT attainment"}) {
    EXPECT_NE(md.str().find(absl::StrCat("Fewest GPUs with ", what, " >= 80% (GPUs / ballast's)")),
              std::string::npos)
        << md.str();
  }
  EXPECT_NE(md.str().find("| policy | 1 | 20 |"), std::string::npos) << md.str();
  // Every request but the unknown model's (about 10%) is served on one GPU.
  EXPECT_NE(md.str().find("| ballast | 1 (1.00) | 1 (1.00) |"), std::string::npos) << md.str();
  ASSERT_EQ(j["policies"]["ballast"]["fewest_gpus"], 1);
  // The same counts in the JSON: TTFT or TPOT alone is met no later than
  // both together, and a looser SLO never needs more GPUs.
  for (const auto& [name, pol] : j["policies"].items()) {
    const auto& by = pol["fewest_gpus_by_slo_scale"];
    ASSERT_EQ(by.size(), 2u) << name;
    for (const auto& row : by) {
      if (row["both"].is_null()) continue;
      ASSERT_FALSE(row["ttft"].is_null()) << name;
      EXPECT_LE(row["ttft"].get<int>(), row["both"].get<int>()) << name;
      EXPECT_LE(row["tpot"].get<int>(), row["both"].get<int>()) << name;
    }
    EXPECT_EQ(pol["fewest_gpus"], by[0]["both"]) << name;
    if (!by[0]["both"].is_null()) {
      EXPECT_LE(by[1]["both"].get<int>(), by[0]["both"].get<int>());
    }
  }
  // Each run is judged at both scales; a looser SLO never lowers attainment.
  for (const auto& run : j["policies"]["ballast"]["runs"]) {
    ASSERT_EQ(run["by_slo_scale"].size(), 2u);
    EXPECT_EQ(run["by_slo_scale"][1]["slo_scale"], 20);
    EXPECT_GE(run["by_slo_scale"][1]["ttft"].get<double>(),
              run["by_slo_scale"][0]["ttft"].get<double>());
    EXPECT_GE(run["by_slo_scale"][1]["tpot"].get<double>(),
              run["by_slo_scale"][0]["tpot"].get<double>());
  }
  // Mistakes exit 2 naming what to fix.
  std::ofstream(Path("bad.yaml")) << "calibration: calibration-h200.json\nmodels: []\n";
  r = Exec({"simulate", "--config", Path("bad.yaml"), "--trace", Path("t.jsonl")}, Path("b.log"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("bad.yaml: models"), std::string::npos) << r.output;
  r = Exec({"simulate", "--config", config, "--trace", Path("t.jsonl"), "--policy", "nope"},
           Path("p.log"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("policy \"nope\""), std::string::npos) << r.output;
  r = Exec({"simulate", "--slo-scale", "2", "sweep", "--config", config, "--trace", Path("t.jsonl"),
            "--gpus", "1"},
           Path("s.log"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("after `sweep`"), std::string::npos) << r.output;
  r = Exec({"simulate", "sweep", "--config", config, "--trace", Path("t.jsonl")}, Path("g.log"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("--gpus"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace ballast
