// Decision cost of the control-plane algorithms (issue 5 targets: placing
// 1,000 models on 128 devices <= 20 ms; arbitrating 10,000 queued requests
// <= 2 ms). A benchmark, not a test: run build/tests/bench/scheduler_bench.
#include <random>

#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "global_scheduler/kvpr.h"
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

}  // namespace

BENCHMARK_MAIN();
