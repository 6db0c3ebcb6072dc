// The workload harness end to end on the CPU backend: `ballast trace`
// writes traces, `ballast bench` replays them against `ballast serve` and
// reports; every request is accounted for and the report files have the
// documented shape. Assertions are on accounting and shape, never speed.
#include <grpcpp/grpcpp.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "ballast/v1/inference.grpc.pb.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/integration/process.h"

namespace ballast {
namespace {

namespace fs = std::filesystem;
const std::string kBin = std::string(BALLAST_BINARY_DIR) + "/server/ballast";

class BenchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           absl::StrCat("ballast_bench_", getpid(), "_",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    WriteConfig("tiny.yaml", 8);
    WriteConfig("tinier-kv.yaml", 1);
  }
  void TearDown() override {
    if (serve_) serve_->Stop(SIGTERM);
    if (!HasFailure()) fs::remove_all(dir_);
  }

  void WriteConfig(const std::string& name, int kv_mib) {
    std::ofstream(dir_ / name)
        << "log_level: warn\n"
           "scheduler: {listen: 127.0.0.1:50051, metrics_listen: '', slo: {ttft_ms: 2000, tpot_ms: "
           "200}}\n"
           "node:\n  node_id: bench\n  listen: 127.0.0.1:0\n  metrics_listen: ''\n"
           "  engine: {block_tokens: 16, kv_cache_mib: "
        << kv_mib
        << ", max_batch_tokens: 128}\n"
           "serve:\n  cache_dir: "
        << (dir_ / "cache").string()
        << "\n  models:\n"
           "    - {name: a, architecture: llama, layers: 2, hidden: 64, heads: 4, kv_heads: 2,"
           " intermediate: 128, max_position: 4096, seed: 1}\n"
           "    - {name: b, architecture: qwen2, layers: 2, hidden: 64, heads: 4, kv_heads: 1,"
           " intermediate: 128, max_position: 4096, seed: 2}\n";
  }

  // Runs the binary to completion; returns its exit code.
  int Run(const std::vector<std::string>& args, const std::string& log) {
    std::vector<std::string> argv = {kBin};
    argv.insert(argv.end(), args.begin(), args.end());
    testing::ChildProcess p(argv, (dir_ / log).string());
    for (int i = 0; i < 12000 && p.running(); ++i) usleep(10000);
    const int status = p.Stop(SIGKILL);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) std::cerr << p.Log();
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

  // A 3 s bursty trace over models a and b at dir_/bursty.jsonl; returns the
  // exit code.
  int WriteBurstyTrace() {
    return Run({"trace", "bursty", "--out", (dir_ / "bursty.jsonl").string(), "--models", "a,b",
                "--duration", "3", "--persistent-rate", "3", "--burst-rate", "4",
                "--group-interval", "1", "--on-mean", "1", "--length-scale", "0.1"},
               "trace.log");
  }

  std::string Log(const std::string& log) const {
    std::ifstream in(dir_ / log);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }

  std::string StartServe() {
    const int port = testing::FreePort();
    const std::string target = absl::StrCat("127.0.0.1:", port);
    serve_ = std::make_unique<testing::ChildProcess>(
        std::vector<std::string>{kBin, "serve", "--config", (dir_ / "tiny.yaml").string(),
                                 "--listen", target, "--metrics-listen", ""},
        (dir_ / "serve.log").string());
    auto stub =
        v1::Inference::NewStub(grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));
    const absl::Time end = absl::Now() + absl::Seconds(30);
    while (absl::Now() < end) {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
      v1::ListModelsResponse list;
      int ready = 0;
      if (stub->ListModels(&ctx, v1::ListModelsRequest(), &list).ok()) {
        for (const auto& m : list.models()) ready += m.replicas_size() > 0;
        if (ready == 2) return target;
      }
      absl::SleepFor(absl::Milliseconds(100));
    }
    ADD_FAILURE() << "serve not ready\n" << serve_->Log();
    return target;
  }

  static nlohmann::json ReadJson(const fs::path& p) {
    std::ifstream in(p);
    return nlohmann::json::parse(in);
  }
  // Pids of live `ballast serve` processes whose command line names `needle`.
  static std::vector<pid_t> ServesNaming(const std::string& needle) {
    std::vector<pid_t> out;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator("/proc", ec)) {
      const std::string name = e.path().filename().string();
      if (name.find_first_not_of("0123456789") != std::string::npos) continue;
      std::ifstream in(e.path() / "cmdline");
      std::string cmd((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      std::replace(cmd.begin(), cmd.end(), '\0', ' ');
      if (cmd.find(" serve ") != std::string::npos && cmd.find(needle) != std::string::npos) {
        out.push_back(std::stoi(name));
      }
    }
    return out;
  }
  static int Lines(const fs::path& p) {
    std::ifstream in(p);
    int n = 0;
    std::string line;
    while (std::getline(in, line)) ++n;
    return n;
  }

  fs::path dir_;
  std::unique_ptr<testing::ChildProcess> serve_;
};

TEST_F(BenchTest, ChatTraceReplayAccountsForEveryRequest) {
  ASSERT_EQ(Run({"trace", "chat", "--out", (dir_ / "chat.jsonl").string(), "--models", "a,b",
                 "--duration", "6", "--session-rate", "1.5", "--length-scale", "0.2",
                 "--typing-mean", "0.4", "--reading-speed", "400", "--seed", "7"},
                "trace.log"),
            0);
  // A request for an unknown model (rejected) and a turn that depends on it
  // (aborted, never sent).
  std::ofstream(dir_ / "chat.jsonl", std::ios::app)
      << R"({"type":"request","id":"ghost-1","model":"ghost","arrival_s":0.5,"prompt":"hi","output_tokens":4,"session":"g","turn":1})"
         "\n"
      << R"({"type":"request","id":"ghost-2","model":"ghost","arrival_s":1.0,"after":"ghost-1","delay_s":0.1,"prompt":"again","output_tokens":4,"session":"g","turn":2})"
         "\n";
  const std::string target = StartServe();
  const fs::path out = dir_ / "out";
  ASSERT_EQ(Run({"bench", "--trace", (dir_ / "chat.jsonl").string(), "--target", target,
                 "--rate-scale", "1,2", "--duration", "4", "--out", out.string()},
                "bench.log"),
            0);
  const auto result = ReadJson(out / "result.json");
  ASSERT_EQ(result["runs"].size(), 2u);
  for (const auto& run : result["runs"]) {
    EXPECT_TRUE(run["accounting_ok"].get<bool>());
    const auto& t = run["total"];
    const int total = t["total"];
    EXPECT_EQ(t["completed"].get<int>() + t["rejected"].get<int>() + t["failed"].get<int>(), total);
    EXPECT_EQ(total + run["excluded_by_duration"].get<int>(), run["trace_requests"].get<int>());
    int by_status = 0;
    for (const auto& [code, n] : run["by_status"].items()) by_status += n.get<int>();
    EXPECT_EQ(by_status, total);
    EXPECT_EQ(run["by_status"]["NOT_FOUND"], 1);
    EXPECT_EQ(run["by_status"]["ABORTED"], 1);
    EXPECT_EQ(t["rejected"], 1);
    EXPECT_GT(t["completed"].get<int>(), 0);
    EXPECT_GT(run["advisories"]["sent"].get<int>(), 0);
    // Every advisory is counted by its status; those between turns of a
    // known session succeed.
    int advised = 0;
    for (const auto& [code, n] : run["advisories"]["by_status"].items()) advised += n.get<int>();
    EXPECT_EQ(advised, run["advisories"]["sent"].get<int>());
    EXPECT_GT(run["advisories"]["by_status"].value("OK", 0), 0) << run["advisories"].dump();
    EXPECT_EQ(Lines(out / absl::StrCat("requests-", run["rate_scale"].get<double>(), ".csv")),
              total + 1);
    for (const char* k :
         {"client_lag_mean_ms", "client_lag_p50_ms", "client_lag_p99_ms", "client_lag_max_ms",
          "valid", "input_token_throughput", "output_token_throughput"}) {
      EXPECT_TRUE(run.contains(k)) << k;
    }
  }
  if (std::system("command -v gnuplot > /dev/null 2>&1") != 0) {
    // deploy/install-deps.sh installs gnuplot-nox (CI has it); elsewhere
    // bench warns and writes no plots.
    std::cerr << "gnuplot not installed: plot files not checked\n";
    return;
  }
  for (const char* png : {"attainment.png", "latency_cdf.png", "timeline.png"}) {
    ASSERT_TRUE(fs::exists(out / png)) << png;
    EXPECT_GT(fs::file_size(out / png), 1000u) << png;
  }
}

TEST_F(BenchTest, CompareRunsEveryConfigOnTheSameTrace) {
  ASSERT_EQ(WriteBurstyTrace(), 0);
  const fs::path out = dir_ / "cmp";
  ASSERT_EQ(Run({"bench", "compare", "--trace", (dir_ / "bursty.jsonl").string(), "--configs",
                 (dir_ / "tiny.yaml").string() + "," + (dir_ / "tinier-kv.yaml").string(),
                 "--rate-scale", "1", "--out", out.string(), "--no-plots"},
                "compare.log"),
            0);
  const auto table = ReadJson(out / "compare.json");
  ASSERT_EQ(table.size(), 2u);
  EXPECT_EQ(table[0]["ratio_to_first"],
            table[0]["max_rate_scale_99_ttft"].get<double>() > 0 ? 1.0 : 0.0);
  for (const auto& row : table) EXPECT_EQ(row["attainment"].size(), 1u);
  std::ifstream md(out / "compare.md");
  int rows = 0;
  for (std::string line; std::getline(md, line);) rows += line.rfind("|", 0) == 0;
  EXPECT_EQ(rows, 4);  // header, rule, two configs
  for (const char* cfg : {"tiny", "tinier-kv"}) {
    const auto r = ReadJson(out / cfg / "result.json");
    EXPECT_TRUE(r["runs"][0]["accounting_ok"].get<bool>()) << cfg;
    EXPECT_TRUE(fs::exists(out / cfg / "result-1.json")) << cfg;
  }
}

// --search: each config runs only the scales its bisection asks for, within
// the budget, and compare.md brackets its limit.
TEST_F(BenchTest, CompareSearchBracketsEachConfigsLimit) {
  ASSERT_EQ(WriteBurstyTrace(), 0);
  EXPECT_EQ(
      Run({"bench", "compare", "--trace", (dir_ / "bursty.jsonl").string(), "--configs",
           (dir_ / "tiny.yaml").string(), "--search", "4,1", "--out", (dir_ / "bad").string()},
          "bad.log"),
      2);
  EXPECT_NE(Log("bad.log").find("--search"), std::string::npos) << Log("bad.log");
  const fs::path out = dir_ / "search";
  ASSERT_EQ(Run({"bench", "compare", "--trace", (dir_ / "bursty.jsonl").string(), "--configs",
                 (dir_ / "tiny.yaml").string(), "--search", "1,4", "--search-runs", "2", "--out",
                 out.string(), "--no-plots"},
                "search.log"),
            0);
  const auto row = ReadJson(out / "compare.json")[0];
  const auto& runs = row["attainment"];
  ASSERT_GE(runs.size(), 1u);
  ASSERT_LE(runs.size(), 2u);
  // The first run is at the geometric middle of [1, 4].
  EXPECT_EQ(ReadJson(out / "tiny" / "result.json")["runs"][0]["rate_scale"], 2);
  double best = 0;
  for (const auto& r : runs) {
    const double k = r["rate_scale"].get<double>();
    EXPECT_TRUE(fs::exists(out / "tiny" / absl::StrCat("result-", k, ".json"))) << k;
    if (r["valid"].get<bool>() && r["ttft"].get<double>() >= 0.99) best = std::max(best, k);
  }
  EXPECT_EQ(row["max_rate_scale_99_ttft"].get<double>(), best);
  double missed = 0;  // the lowest scale above `best` that missed
  for (const auto& r : runs) {
    const double k = r["rate_scale"].get<double>();
    const bool met = r["valid"].get<bool>() && r["ttft"].get<double>() >= 0.99;
    if (k > best && !met && (missed == 0 || k < missed)) missed = k;
  }
  if (missed > 0) {
    EXPECT_EQ(row["min_missed_rate_scale_99_ttft"].get<double>(), missed);
  } else {
    EXPECT_FALSE(row.contains("min_missed_rate_scale_99_ttft"));
  }
  std::ifstream md_in(out / "compare.md");
  const std::string md((std::istreambuf_iterator<char>(md_in)), std::istreambuf_iterator<char>());
  EXPECT_NE(md.find("runs (rate scale: TTFT attainment)"), std::string::npos) << md;
  // The row lists the 2x run (cells are sorted by scale: a 1.4x run comes first).
  const size_t row_at = md.find("| tiny | ");
  ASSERT_NE(row_at, std::string::npos) << md;
  const std::string row_md = md.substr(row_at, md.find('\n', row_at) - row_at);
  EXPECT_NE(row_md.find("2x: "), std::string::npos) << md;
}

// SIGTERM mid-comparison: the finished rate scale's files are complete, and
// the `ballast serve` child of the unfinished one does not outlive it.
TEST_F(BenchTest, StoppedCompareLeavesPerScaleFilesAndNoServe) {
  ASSERT_EQ(WriteBurstyTrace(), 0);
  const fs::path out = dir_ / "cmp";
  testing::ChildProcess p(
      {kBin, "bench", "compare", "--trace", (dir_ / "bursty.jsonl").string(), "--configs",
       (dir_ / "tiny.yaml").string(), "--rate-scale", "1,0.2", "--out", out.string(), "--no-plots",
       // Any lag at all (there is always some) invalidates a run.
       "--max-client-lag-ms", "0.000001"},
      (dir_ / "compare.log").string());
  // Stop it once scale 1 is done and scale 0.2's server (a 15 s replay) has started.
  const fs::path first = out / "tiny" / "result-1.json";
  const fs::path second_log = out / "tiny" / "serve-0.2.log";
  // The log file appears before the child has exec'd: wait for the process.
  for (int i = 0; i < 12000 && p.running(); ++i) {
    if (fs::exists(first) && fs::exists(second_log) && !ServesNaming(dir_.string()).empty()) {
      break;
    }
    usleep(10000);
  }
  ASSERT_TRUE(p.running()) << "compare ended before it could be stopped\n" << p.Log();
  ASSERT_TRUE(fs::exists(first)) << p.Log();
  ASSERT_FALSE(ServesNaming(dir_.string()).empty()) << "no serve child to outlive compare";
  const int status = p.Stop(SIGTERM);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM) << status;
  const auto run = ReadJson(first)["run"];
  EXPECT_EQ(run["rate_scale"], 1);
  EXPECT_TRUE(run["accounting_ok"].get<bool>());
  EXPECT_EQ(Lines(out / "tiny" / "requests-1.csv"), run["total"]["total"].get<int>() + 1);
  EXPECT_EQ(ReadJson(out / "tiny" / "result.json")["runs"].size(), 1u);
  EXPECT_EQ(ReadJson(out / "compare.json")[0]["attainment"].size(), 1u);
  EXPECT_FALSE(run["valid"].get<bool>());
  EXPECT_NE(run["invalid_reason"].get<std::string>().find("client lag"), std::string::npos);
  std::ifstream md_in(out / "compare.md");
  const std::string md((std::istreambuf_iterator<char>(md_in)), std::istreambuf_iterator<char>());
  EXPECT_NE(md.find("(invalid)"), std::string::npos) << md;
  EXPECT_NE(md.find("not run"), std::string::npos) << md;
  // Its serve child dies with it (it may take a moment to shut down).
  std::vector<pid_t> left = ServesNaming(dir_.string());
  for (int i = 0; i < 1000 && !left.empty(); ++i) {
    usleep(10000);
    left = ServesNaming(dir_.string());
  }
  EXPECT_TRUE(left.empty()) << "ballast serve outlived bench compare";
  for (pid_t pid : left) kill(pid, SIGKILL);
}

// bench-engine's lists (--batches, --mixed chunk lengths) are checked
// before anything is loaded: a bad entry is a usage error naming the flag.
TEST_F(BenchTest, BenchEngineRejectsABadListNamingTheFlag) {
  for (const auto& [flag, list] : {std::pair<std::string, std::string>{"--mixed", "256,0"},
                                   {"--mixed", "512,x"},
                                   {"--batches", "1,-4"}}) {
    const std::string log = "bench-engine.log";
    EXPECT_EQ(Run({"bench-engine", "--model", dir_.string(), flag, list}, log), 2) << list;
    std::ifstream in(dir_ / log);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_NE(text.find("error: " + flag + ": \""), std::string::npos) << text;
  }
}

}  // namespace
}  // namespace ballast
