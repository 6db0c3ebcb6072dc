// CUDA VMM costs on the GPU host (issue 4): driver cost per call against
// the physical chunk size, and the time to reclaim KV memory for another
// model's weights (unmap from the KV range, map at the weights' range) with
// pooled handles. Usage: vmm_bench [reclaim GiB...]   (default 1 16)
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "memory/cuda/cuda_page_pool.h"

using ballast::memory::CudaPagePool;
using Clock = std::chrono::steady_clock;

static double Us(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

int main(int argc, char** argv) {
  std::vector<double> reclaim_gib = {1, 16};
  if (argc > 1) {
    reclaim_gib.clear();
    for (int i = 1; i < argc; ++i) reclaim_gib.push_back(std::atof(argv[i]));
  }
  size_t free_b = 0, total_b = 0;
  auto probe = CudaPagePool::Create(0, 2u << 20, 1);
  if (!probe.ok()) {
    std::fprintf(stderr, "no usable GPU: %s\n", std::string(probe.status().message()).c_str());
    return 1;
  }
  cudaMemGetInfo(&free_b, &total_b);
  std::printf("VMM granularity %zu KiB; free %.1f GiB of %.1f GiB\n", (*probe)->granularity() >> 10,
              free_b / 1073741824.0, total_b / 1073741824.0);
  std::printf("\n| chunk | create | map+setAccess | unmap | release | (per 2 MiB: map+unmap) |\n|---|---|---|---|---|---|\n");
  for (size_t mib : {2, 4, 8, 16, 32, 64}) {
    const size_t chunk = mib << 20;
    const int n = static_cast<int>(std::max<size_t>(8, (1ull << 30) / chunk));
    auto pool = std::move(*CudaPagePool::Create(0, chunk, 1ll << 40));
    uint8_t* base = *pool->Reserve(chunk * n);
    auto t0 = Clock::now();
    if (!pool->Prewarm(chunk * n).ok()) return 1;
    auto t1 = Clock::now();
    for (int i = 0; i < n; ++i) (void)pool->Map(base + i * chunk, chunk);
    auto t2 = Clock::now();
    for (int i = 0; i < n; ++i) pool->Unmap(base + i * chunk, chunk);
    auto t3 = Clock::now();
    pool->ReleasePooled();
    auto t4 = Clock::now();
    const double map = Us(t1, t2) / n, unmap = Us(t2, t3) / n;
    std::printf("| %zu MiB | %.1f us | %.1f us | %.1f us | %.1f us | %.2f us |\n", mib, Us(t0, t1) / n, map,
                unmap, Us(t3, t4) / n, (map + unmap) / (mib / 2.0));
  }
  std::printf("\nReclaim = unmap N GiB from the KV range + map it at the weights' range (handles pooled):\n");
  std::printf("| reclaim | chunk | unmap | map | total |\n|---|---|---|---|---|\n");
  for (double gib : reclaim_gib) {
    for (size_t mib : {2, 64}) {
      const size_t chunk = mib << 20, bytes = static_cast<size_t>(gib * 1073741824.0);
      const size_t n = bytes / chunk;
      auto pool = std::move(*CudaPagePool::Create(0, chunk, 1ll << 40));
      uint8_t* kv = *pool->Reserve(n * chunk);
      uint8_t* weights = *pool->Reserve(n * chunk);
      if (!pool->Prewarm(n * chunk).ok()) {
        std::printf("| %.0f GiB | %zu MiB | (not enough memory) |\n", gib, mib);
        continue;
      }
      for (size_t i = 0; i < n; ++i) (void)pool->Map(kv + i * chunk, chunk);  // KV slabs
      cudaDeviceSynchronize();
      auto t0 = Clock::now();
      pool->Unmap(kv, n * chunk);  // one call for the whole KV range
      auto t1 = Clock::now();
      auto st = pool->Map(weights, n * chunk);
      auto t2 = Clock::now();
      if (!st.ok()) {
        std::printf("map failed: %s\n", std::string(st.message()).c_str());
        return 1;
      }
      std::printf("| %.0f GiB | %zu MiB | %.1f ms | %.1f ms | %.1f ms |\n", gib, mib, Us(t0, t1) / 1e3,
                  Us(t1, t2) / 1e3, Us(t0, t2) / 1e3);
      pool->Unmap(weights, n * chunk);
    }
  }
  return 0;
}
