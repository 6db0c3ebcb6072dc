// Decision cost of the control-plane algorithms (issue 5 targets: placing
// 1,000 models on 128 devices <= 20 ms; arbitrating 10,000 queued requests
// <= 2 ms). A benchmark, not a test: run build/tests/bench/scheduler_bench.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <random>

#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "global_scheduler/etcd_client.h"
#include "global_scheduler/kvpr.h"
#include "global_scheduler/session_directory.h"
#include "global_scheduler/state_store.h"
#include "node_manager/arbitration.h"

namespace {

using namespace ballast;

void BM_PlaceKvpr(benchmark::State& state) {
  const int nm = static_cast<int>(state.range(0)), nd = static_cast<int>(state.range(1));
  std::mt19937 rng(1);
  std::uniform_real_distribution<double> demand(0.1, 100.0);
  std::uniform_int_distribution<int64_t> weight(1ll << 30, 16ll << 30);
  std::vector<global_scheduler::ModelDemand> models;
  for (int i = 0; i < nm; ++i) {
    models.push_back({absl::StrCat("m", i), demand(rng), weight(rng) / 8, i % nd});
  }
  std::vector<global_scheduler::DeviceCapacity> devices(nd, {"gpu", 80ll << 30});
  for (auto _ : state) {
    auto p = global_scheduler::PlaceKvpr(models, devices, 0.1);
    benchmark::DoNotOptimize(p);
  }
}
BENCHMARK(BM_PlaceKvpr)->Args({1000, 128})->Unit(benchmark::kMillisecond);

void BM_Arbitrate(benchmark::State& state) {
  const auto policy = static_cast<node_manager::ArbitrationPolicy>(state.range(1));
  std::mt19937 rng(2);
  std::uniform_real_distribution<double> cost(0.001, 0.2), slack(0.05, 5.0);
  std::vector<node_manager::PendingRequest> rs;
  for (int i = 0; i < state.range(0); ++i) {
    node_manager::PendingRequest r;
    r.id = static_cast<uint64_t>(i);
    r.arrival_s = i * 1e-4;
    r.cost_s = cost(rng);
    r.deadline_s = r.arrival_s + slack(rng);
    r.tokens = 512;
    rs.push_back(r);
  }
  for (auto _ : state) {
    auto a = node_manager::Arbitrate(policy, rs, 0.0);
    benchmark::DoNotOptimize(a);
  }
}
BENCHMARK(BM_Arbitrate)
    ->ArgNames({"requests", "policy"})
    ->Args({10000, static_cast<int>(node_manager::ArbitrationPolicy::kMooreHodgson)})
    ->Args({10000, static_cast<int>(node_manager::ArbitrationPolicy::kEdf)})
    ->Args({10000, static_cast<int>(node_manager::ArbitrationPolicy::kFineServeBatch)})
    ->Unit(benchmark::kMillisecond);

// One session turn's bookkeeping on the scheduler (Begin + Commit of a turn
// of 256 tokens on a session whose history has `history` to `history` +
// 8K tokens: it is started again every 32 turns, outside the timing), with
// the state kept in memory only (sync -1) or written through to SQLite with
// synchronous NORMAL (0) or FULL (1), or to etcd (2: the etcd at
// $BALLAST_BENCH_ETCD, host:port; skipped when unset) (scheduler.state;
// state_store.h).
void BM_SessionTurn(benchmark::State& state) {
  const int history = static_cast<int>(state.range(0));
  const int sync = static_cast<int>(state.range(1));
  const auto dir = std::filesystem::temp_directory_path() / absl::StrCat("bench_state_", getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::unique_ptr<global_scheduler::StateStore> store;
  global_scheduler::SessionDirectory d;
  if (sync == 2) {
    const char* etcd = std::getenv("BALLAST_BENCH_ETCD");
    if (etcd == nullptr) {
      state.SkipWithError("set BALLAST_BENCH_ETCD=host:port");
      return;
    }
    auto client = *global_scheduler::EtcdClient::Create(etcd, absl::Seconds(5));
    global_scheduler::EtcdStateOptions o;
    o.prefix = "/bench";
    auto opened = global_scheduler::OpenEtcdStateStore(client, o);
    if (!opened.ok()) {
      state.SkipWithError(std::string(opened.status().message()).c_str());
      return;
    }
    store = std::move(*opened);
    if (!d.Restore(store.get()).ok()) state.SkipWithError("restore failed");
  } else if (sync >= 0) {
    global_scheduler::SqliteStateOptions o;
    o.sync = sync ? global_scheduler::StateSync::kFull : global_scheduler::StateSync::kNormal;
    store = *global_scheduler::OpenSqliteStateStore((dir / "state.db").string(), o);
    if (!d.Restore(store.get()).ok()) state.SkipWithError("restore failed");
  }
  auto start = [&] {
    bool existed = false;
    global_scheduler::TurnRecord first;
    first.prompt_tokens.assign(history, 7);
    return d.End("s", &existed).ok() && d.Begin("s", "m").ok() &&
           d.Commit("s", "n", std::move(first)).ok();
  };
  if (!start()) state.SkipWithError("setup failed");
  global_scheduler::TurnRecord turn;
  turn.prompt_tokens.assign(128, 1);
  turn.output_tokens.assign(128, 2);
  int64_t n = 0;
  for (auto _ : state) {
    if (++n % 32 == 0) {
      state.PauseTiming();
      if (!start()) state.SkipWithError("restart failed");
      state.ResumeTiming();
    }
    if (!d.Begin("s", "m").ok() || !d.Commit("s", "n", turn).ok()) {
      state.SkipWithError("turn failed");
      break;
    }
  }
  store.reset();
  std::filesystem::remove_all(dir);
}
BENCHMARK(BM_SessionTurn)
    ->ArgNames({"history", "sync"})
    ->Args({1024, -1})
    ->Args({1024, 0})
    ->Args({1024, 1})
    ->Args({32768, -1})
    ->Args({32768, 0})
    ->Args({1024, 2})
    ->Args({32768, 2})
    ->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
