// CUDA VMM costs on the GPU host (issue 4): driver cost per call against
// the physical chunk size; the time to reclaim KV memory for another
// model's weights (unmap from the KV range, map at the weights' range) with
// pooled handles; and KV block allocation + free latency for the slab arena
// vs per-block page mapping (kvcached-style) vs a static pool.
// Usage: vmm_bench [reclaim GiB...]   (default 1 16)
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "memory/cuda/cuda_page_pool.h"
#include "memory/host_block_pool.h"
#include "memory/kv_arena.h"

using ballast::memory::CudaPagePool;
using Clock = std::chrono::steady_clock;

static double Us(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

// Aborts on a failed Free (a bug in the allocator under test).
static void MustFree(const absl::Status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "Free: %s\n", s.ToString().c_str());
    std::abort();
  }
}

static double Pct(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

// Alloc + free of one 64 KiB block (an 8B model's block: one layer's K and
// V for 16 tokens) with 4096 blocks live, 20000 times; median and p99 in
// microseconds, and driver calls made during the timed loop.
static void BlockLatency() {
  constexpr size_t kBlock = 64u << 10;
  constexpr int kLive = 4096, kOps = 20000;
  auto run = [&](const char* name, auto alloc, auto free, auto calls) {
    std::vector<int> live;
    for (int i = 0; i < kLive; ++i) live.push_back(alloc());
    std::vector<double> a, f;
    const int64_t c0 = calls();
    for (int i = 0; i < kOps; ++i) {
      const size_t victim = (static_cast<size_t>(i) * 2654435761u) % live.size();
      auto t0 = Clock::now();
      free(live[victim]);
      auto t1 = Clock::now();
      live[victim] = alloc();
      auto t2 = Clock::now();
      f.push_back(Us(t0, t1));
      a.push_back(Us(t1, t2));
    }
    const int64_t c1 = calls();
    std::printf("| %s | %.3f | %.3f | %.3f | %.3f | %lld |\n", name, Pct(a, 0.5), Pct(a, 0.99),
                Pct(f, 0.5), Pct(f, 0.99), static_cast<long long>(c1 - c0));
    for (int id : live) free(id);
  };
  std::printf("\nKV block alloc/free latency (64 KiB blocks, %d live, %d ops; us):\n", kLive, kOps);
  std::printf(
      "| allocator | alloc p50 | alloc p99 | free p50 | free p99 | driver calls "
      "|\n|---|---|---|---|---|---|\n");
  {  // Slab arena over pooled VMM handles, 64 MiB slabs.
    auto pool =
        std::shared_ptr<CudaPagePool>(std::move(*CudaPagePool::Create(0, 64u << 20, 8ll << 30)));
    auto calls = [&] {
      const auto d = pool->driver_calls();
      return d.create + d.map + d.set_access + d.unmap + d.release;
    };
    ballast::memory::KvArenaOptions o;
    o.slab_bytes = 64u << 20;
    o.reserve_bytes = 8ull << 30;
    auto arena = std::move(*ballast::memory::KvArena::Create(pool, o));
    auto view = std::move(*arena->CreateAllocator(kBlock));
    run(
        "slab arena (64 MiB slabs)", [&] { return (*view->Allocate(1))[0]; },
        [&](int id) { MustFree(view->Free({id})); }, calls);
  }
  {  // Per-block mapping: every block gets its own 2 MiB page mapped on
     // allocation and unmapped on free (kvcached maps per page and also
     // creates a fresh handle each time; here handles are pooled, its best case).
    auto pool = std::move(*CudaPagePool::Create(0, 2u << 20, 16ll << 30));
    uint8_t* base = *pool->Reserve((kLive + 1) * (2ull << 20));
    std::vector<int> free_slots;
    for (int i = kLive; i >= 0; --i) free_slots.push_back(i);
    auto calls = [&] {
      const auto d = pool->driver_calls();
      return d.create + d.map + d.set_access + d.unmap + d.release;
    };
    run(
        "per-block page mapping",
        [&] {
          const int s = free_slots.back();
          free_slots.pop_back();
          (void)pool->Map(base + static_cast<size_t>(s) * (2u << 20), 2u << 20);
          return s;
        },
        [&](int s) {
          pool->Unmap(base + static_cast<size_t>(s) * (2u << 20), 2u << 20);
          free_slots.push_back(s);
        },
        calls);
  }
  {  // Static pool over one cudaMalloc.
    void* mem = nullptr;
    cudaMalloc(&mem, (kLive + 64) * kBlock);
    auto pool = std::move(*ballast::memory::HostBlockPool::CreateOver(static_cast<uint8_t*>(mem),
                                                                      kBlock, kLive + 64));
    run(
        "static pool", [&] { return (*pool->Allocate(1))[0]; },
        [&](int id) { MustFree(pool->Free({id})); }, [] { return int64_t{0}; });
    cudaFree(mem);
  }
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
  std::printf(
      "\n| chunk | create | map+setAccess | unmap | release | (per 2 MiB: map+unmap) "
      "|\n|---|---|---|---|---|---|\n");
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
    std::printf("| %zu MiB | %.1f us | %.1f us | %.1f us | %.1f us | %.2f us |\n", mib,
                Us(t0, t1) / n, map, unmap, Us(t3, t4) / n, (map + unmap) / (mib / 2.0));
  }
  std::printf(
      "\nReclaim = unmap N GiB from the KV range + map it at the weights' range (handles "
      "pooled):\n");
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
      std::printf("| %.0f GiB | %zu MiB | %.1f ms | %.1f ms | %.1f ms |\n", gib, mib,
                  Us(t0, t1) / 1e3, Us(t1, t2) / 1e3, Us(t0, t2) / 1e3);
      pool->Unmap(weights, n * chunk);
    }
  }
  BlockLatency();
  return 0;
}
