// CUDA VMM page pool on a real GPU (label gpu; skips without one): the KV
// arena over it hands out device memory kernels can use, handles are pooled
// (no cuMemCreate after warm-up), the budget is enforced, Exchange moves
// pages at a full budget (remapping); the build-time
// factory (memory/gpu_page_pool.h) hands out this backend.
#include "memory/cuda/cuda_page_pool.h"

#include <cuda_runtime_api.h>

#include <vector>

#include "gtest/gtest.h"
#include "memory/gpu_page_pool.h"
#include "memory/kv_arena.h"

namespace ballast::memory {
namespace {

std::shared_ptr<CudaPagePool> MakePool(int64_t budget) {
  auto p = CudaPagePool::Create(0, 2u << 20, budget);
  if (!p.ok()) return nullptr;
  return std::shared_ptr<CudaPagePool>(std::move(*p));
}

TEST(CudaPagePool, ArenaBlocksAreUsableDeviceMemory) {
  auto pool = MakePool(256ll << 20);
  if (!pool) GTEST_SKIP() << "no usable CUDA device";
  KvArenaOptions o;
  o.reserve_bytes = 1ull << 30;
  auto arena = *KvArena::Create(pool, o);
  auto view = *arena->CreateAllocator(64 << 10);
  auto blocks = *view->Allocate(100);  // 6.25 MiB: 4 slabs
  for (size_t i = 0; i < blocks.size(); ++i) {
    ASSERT_EQ(cudaMemset(view->Address(blocks[i]), static_cast<int>(i & 0xff), 64 << 10),
              cudaSuccess);
  }
  std::vector<uint8_t> host(64 << 10);
  for (size_t i = 0; i < blocks.size(); i += 7) {
    ASSERT_EQ(
        cudaMemcpy(host.data(), view->Address(blocks[i]), host.size(), cudaMemcpyDeviceToHost),
        cudaSuccess);
    EXPECT_EQ(host[0], i & 0xff);
    EXPECT_EQ(host.back(), i & 0xff);
  }
  EXPECT_EQ(pool->driver_calls().create, 4);
  ASSERT_TRUE(view->Free(blocks).ok());
  arena->ReclaimFreeSlabs();
  EXPECT_EQ(pool->stats().mapped_bytes, 0);
  // Mapping again reuses the pooled handles: no cuMemCreate.
  auto again = *view->Allocate(100);
  EXPECT_EQ(pool->driver_calls().create, 4);
  EXPECT_GT(pool->driver_calls().map, 4);
  ASSERT_TRUE(view->Free(again).ok());
}

TEST(CudaPagePool, BudgetIsEnforcedAllOrNothing) {
  auto pool = MakePool(8ll << 20);
  if (!pool) GTEST_SKIP() << "no usable CUDA device";
  auto base = *pool->Reserve(32ull << 20);
  EXPECT_TRUE(pool->Map(base, 8u << 20).ok());
  EXPECT_EQ(pool->Map(base + (8u << 20), 2u << 20).code(), absl::StatusCode::kResourceExhausted);
  pool->Unmap(base, 8u << 20);
  EXPECT_EQ(pool->stats().mapped_bytes, 0);
}

// What DeviceWorker gets for an elastic GPU device: a CUDA VMM pool with
// the page size and budget asked for, mapping device memory.
TEST(CudaPagePool, FactoryMakesTheVmmBackend) {
  auto pool = CreateGpuPagePool(0, 2u << 20, 4ll << 20);
  if (pool.status().code() == absl::StatusCode::kUnavailable) {
    GTEST_SKIP() << "no usable CUDA device";
  }
  ASSERT_TRUE(pool.ok()) << pool.status();
  EXPECT_NE(dynamic_cast<CudaPagePool*>(pool->get()), nullptr);
  PagePool& p = **pool;
  EXPECT_EQ(p.page_bytes(), 2u << 20);
  EXPECT_EQ(p.stats().budget_bytes, 4ll << 20);
  auto base = *p.Reserve(8u << 20);
  ASSERT_TRUE(p.Map(base, 4u << 20).ok());
  EXPECT_EQ(cudaMemset(base, 7, 4u << 20), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(p.Map(base + (4u << 20), 2u << 20).code(), absl::StatusCode::kResourceExhausted);
  p.Unmap(base, 4u << 20);
  EXPECT_EQ(p.stats().mapped_bytes, 0);
}

// Byte `at` of device memory.
uint8_t DeviceByte(const uint8_t* at) {
  uint8_t v = 0;
  EXPECT_EQ(cudaMemcpy(&v, at, 1, cudaMemcpyDeviceToHost), cudaSuccess);
  return v;
}

// Remapping's page move (PagePool::Exchange) on real VMM mappings: at a
// full budget it unmaps some pages and maps others in one step, reusing
// the unmapped handles (no cuMemCreate); the new pages are usable device
// memory and the pages left mapped keep their contents; an exchange past
// the budget is refused with nothing changed.
TEST(CudaPagePool, ExchangeMovesPagesAtAFullBudget) {
  constexpr size_t kMiB = 1u << 20;
  auto pool = MakePool(8 * kMiB);
  if (!pool) GTEST_SKIP() << "no usable CUDA device";
  uint8_t* base = *pool->Reserve(16 * kMiB);
  ASSERT_TRUE(pool->Map(base, 8 * kMiB).ok());
  ASSERT_EQ(cudaMemset(base, 1, 4 * kMiB), cudaSuccess);
  ASSERT_EQ(cudaMemset(base + 4 * kMiB, 2, 4 * kMiB), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const int64_t created = pool->driver_calls().create;
  EXPECT_EQ(pool->Map(base + 8 * kMiB, 2 * kMiB).code(), absl::StatusCode::kResourceExhausted);

  // Lend [0, 4) MiB, take [8, 12) MiB: the budget stays full, not passed.
  const PageRange lend{base, 4 * kMiB}, take{base + 8 * kMiB, 4 * kMiB};
  ASSERT_TRUE(pool->Exchange({lend}, {take}).ok());
  EXPECT_EQ(pool->stats().mapped_bytes, static_cast<int64_t>(8 * kMiB));
  EXPECT_EQ(pool->driver_calls().create, created);  // the lent pages' handles
  ASSERT_EQ(cudaMemset(take.addr, 7, take.bytes), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(DeviceByte(take.addr), 7);
  EXPECT_EQ(DeviceByte(take.addr + take.bytes - 1), 7);
  EXPECT_EQ(DeviceByte(base + 4 * kMiB), 2);  // untouched by the move
  EXPECT_EQ(DeviceByte(base + 8 * kMiB - 1), 2);

  // Unmapping 2 MiB to map 6 MiB would pass the budget: refused, and the
  // pages it would have unmapped are still mapped with their contents.
  const PageRange give{base + 4 * kMiB, 2 * kMiB}, grab{base + 12 * kMiB, 4 * kMiB};
  const PageRange grab_more{base, 2 * kMiB};
  EXPECT_EQ(pool->Exchange({give}, {grab, grab_more}).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(pool->stats().mapped_bytes, static_cast<int64_t>(8 * kMiB));
  EXPECT_EQ(DeviceByte(give.addr), 2);
  EXPECT_EQ(DeviceByte(take.addr), 7);

  // And back: the lent range is device memory again (its old contents are
  // gone; the caller rewrites them, as remapping does from the host copy).
  ASSERT_TRUE(pool->Exchange({take}, {lend}).ok());
  EXPECT_EQ(pool->stats().mapped_bytes, static_cast<int64_t>(8 * kMiB));
  ASSERT_EQ(cudaMemset(lend.addr, 9, lend.bytes), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(DeviceByte(lend.addr + lend.bytes - 1), 9);
  EXPECT_EQ(pool->driver_calls().create, created);
  pool->Unmap(base, 8 * kMiB);
  EXPECT_EQ(pool->stats().mapped_bytes, 0);
}

// A lend runs while the other models' steps are on the device, so the
// page move must not wait for their work (a 2K-token prefill step on an
// H200 is about 50 ms): after Exchange returns, work queued on another
// stream before it is still running. (cudaFree, by contrast, waits for
// it: 95 ms behind a 100 ms kernel in a probe on the H200, 2026-12-04.)
TEST(CudaPagePool, ExchangeDoesNotWaitForOtherStreams) {
  constexpr size_t kMiB = 1u << 20;
  auto pool = MakePool(8 * kMiB);
  if (!pool) GTEST_SKIP() << "no usable CUDA device";
  uint8_t* base = *pool->Reserve(16 * kMiB);
  ASSERT_TRUE(pool->Map(base, 8 * kMiB).ok());
  // Another stream's long work: memsets of a separate 1 GiB buffer, about
  // 0.3 ms each on an H200, 0.5 s in all (enough on slower cards too).
  void* busy_buf = nullptr;
  ASSERT_EQ(cudaMalloc(&busy_buf, 1ull << 30), cudaSuccess);
  cudaStream_t busy = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&busy, cudaStreamNonBlocking), cudaSuccess);
  for (int i = 0; i < 1500; ++i) {
    ASSERT_EQ(cudaMemsetAsync(busy_buf, i & 0xff, 1ull << 30, busy), cudaSuccess);
  }
  const PageRange lend{base, 4 * kMiB}, take{base + 8 * kMiB, 4 * kMiB};
  ASSERT_TRUE(pool->Exchange({lend}, {take}).ok());
  ASSERT_TRUE(pool->Exchange({take}, {lend}).ok());
  EXPECT_EQ(cudaStreamQuery(busy), cudaErrorNotReady) << "the exchange waited for another stream";
  ASSERT_EQ(cudaStreamSynchronize(busy), cudaSuccess);
  ASSERT_EQ(cudaStreamDestroy(busy), cudaSuccess);
  ASSERT_EQ(cudaFree(busy_buf), cudaSuccess);
  pool->Unmap(base, 8 * kMiB);
}

}  // namespace
}  // namespace ballast::memory
