// KvArena against a reference model: mixed block sizes share one pool
// without overlap or leaks; driver calls happen per slab, never per block;
// failed allocations leave no trace; freed memory returns to the budget.
#include "memory/kv_arena.h"

#include <cstring>
#include <map>
#include <random>

#include "gtest/gtest.h"

namespace ballast::memory {
namespace {

constexpr size_t kPage = 64 << 10;  // small pages keep the test fast

struct Fixture {
  explicit Fixture(int64_t budget_pages, int buffer = 1) {
    pool = std::shared_ptr<HostPagePool>(
        *HostPagePool::Create(kPage, budget_pages * static_cast<int64_t>(kPage)));
    KvArenaOptions o;
    o.slab_bytes = kPage;
    o.reserve_bytes = 256 * kPage;
    o.free_slab_buffer = buffer;
    arena = *KvArena::Create(pool, o);
  }
  std::shared_ptr<HostPagePool> pool;
  std::unique_ptr<KvArena> arena;
};

TEST(KvArena, ChurnWithMixedBlockSizesMatchesReference) {
  Fixture f(/*budget_pages=*/24);
  const std::vector<size_t> sizes = {1024, 3072, 8192};  // three models' block sizes
  std::vector<std::unique_ptr<BlockAllocator>> views;
  for (size_t s : sizes) views.push_back(*f.arena->CreateAllocator(s));
  struct Held {
    int view;
    BlockId id;
    uint8_t tag;
  };
  std::vector<Held> held;
  std::map<uintptr_t, uintptr_t> intervals;  // live [start, end)
  std::mt19937 rng(5);
  int64_t failures = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    if (held.empty() || rng() % 100 < 55) {
      const int v = static_cast<int>(rng() % views.size());
      const int n = 1 + static_cast<int>(rng() % 4);
      auto got = views[v]->Allocate(n);
      if (!got.ok()) {
        ++failures;
        continue;
      }
      for (BlockId b : *got) {
        uint8_t* p = views[v]->Address(b);
        const auto start = reinterpret_cast<uintptr_t>(p), end = start + sizes[v];
        auto next = intervals.lower_bound(start);
        ASSERT_TRUE(next == intervals.end() || next->first >= end) << "overlap";
        if (next != intervals.begin()) {
          ASSERT_LE(std::prev(next)->second, start) << "overlap";
        }
        intervals[start] = end;
        const uint8_t tag = static_cast<uint8_t>(rng());
        std::memset(p, tag, sizes[v]);
        held.push_back({v, b, tag});
      }
    } else {
      const size_t i = rng() % held.size();
      const Held h = held[i];
      uint8_t* p = views[h.view]->Address(h.id);
      for (size_t k = 0; k < sizes[h.view]; k += 97) ASSERT_EQ(p[k], h.tag);
      EXPECT_TRUE(views[h.view]->Free({h.id}).ok());
      intervals.erase(reinterpret_cast<uintptr_t>(p));
      held.erase(held.begin() + static_cast<long>(i));
    }
    // Never more memory mapped than the budget.
    ASSERT_LE(f.pool->stats().mapped_bytes, f.pool->stats().budget_bytes);
  }
  EXPECT_GT(failures, 0);  // the budget was reached: memory really is shared
  for (const auto& h : held) EXPECT_TRUE(views[h.view]->Free({h.id}).ok());
  EXPECT_EQ(f.arena->stats().blocks_used, 0);
  EXPECT_LE(f.arena->stats().slabs_mapped, 1);  // only the free-slab buffer stays
  f.arena->ReclaimFreeSlabs();
  EXPECT_EQ(f.pool->stats().mapped_bytes, 0);
}

TEST(KvArena, EveryFreeByteIsReusableByAnyModel) {
  Fixture f(8);
  auto a = *f.arena->CreateAllocator(1024), b = *f.arena->CreateAllocator(4096);
  auto all_a = a->Allocate(static_cast<int>(a->num_total()));
  ASSERT_TRUE(all_a.ok());
  EXPECT_EQ(all_a->size(), 8u * 64);
  EXPECT_FALSE(b->Allocate(1).ok());  // full
  EXPECT_TRUE(a->Free(*all_a).ok());
  auto all_b = b->Allocate(8 * 16);  // the whole budget, in the other size
  ASSERT_TRUE(all_b.ok()) << all_b.status();
  EXPECT_TRUE(b->Free(*all_b).ok());
}

TEST(KvArena, DriverCallsPerSlabNotPerBlock) {
  Fixture f(200);
  auto v = *f.arena->CreateAllocator(1024);  // 64 blocks per slab
  std::vector<BlockId> ids;
  for (int i = 0; i < 10000; ++i) ids.push_back((*v->Allocate(1))[0]);
  const auto s = f.pool->stats();
  EXPECT_EQ(s.map_calls, (10000 + 63) / 64);  // one per slab carved
  EXPECT_EQ(s.map_calls, f.arena->stats().carves);
  EXPECT_TRUE(v->Free(ids).ok());
  // Re-allocating reuses the buffered slab: no new driver call for the first 64.
  const int64_t before = f.pool->stats().map_calls;
  auto again = v->Allocate(64);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(f.pool->stats().map_calls, before);
  EXPECT_TRUE(v->Free(*again).ok());
}

TEST(KvArena, FailedAllocationLeavesNoTrace) {
  Fixture f(4);
  auto v = *f.arena->CreateAllocator(2048);  // 32 per slab, 128 in budget
  auto some = *v->Allocate(40);
  const auto before = f.arena->stats();
  const auto pool_before = f.pool->stats();
  auto too_many = v->Allocate(100);
  EXPECT_EQ(too_many.status().code(), absl::StatusCode::kResourceExhausted);
  const auto after = f.arena->stats();
  EXPECT_EQ(after.blocks_used, before.blocks_used);
  EXPECT_EQ(after.slabs_mapped, before.slabs_mapped);
  EXPECT_EQ(f.pool->stats().mapped_bytes, pool_before.mapped_bytes);
  auto rest = v->Allocate(88);  // exactly the rest of the budget still fits
  EXPECT_TRUE(rest.ok()) << rest.status();
}

TEST(KvArena, FreedSlabsReturnToTheBudgetForWeights) {
  Fixture f(6, /*buffer=*/2);
  auto v = *f.arena->CreateAllocator(4096);
  auto ids = *v->Allocate(6 * 16);
  EXPECT_EQ(f.pool->stats().mapped_bytes, 6 * static_cast<int64_t>(kPage));
  EXPECT_TRUE(v->Free(ids).ok());
  // Two slabs stay in the buffer; the rest were unmapped as they emptied.
  EXPECT_EQ(f.arena->stats().slabs_empty, 2);
  EXPECT_EQ(f.pool->stats().mapped_bytes, 2 * static_cast<int64_t>(kPage));
  EXPECT_EQ(f.arena->ReclaimFreeSlabs(), 2 * static_cast<int64_t>(kPage));
  EXPECT_EQ(f.pool->stats().mapped_bytes, 0);
  // Shrinking the budget (another model's weights arrived) caps KV.
  f.pool->SetBudget(2 * static_cast<int64_t>(kPage));
  EXPECT_EQ(v->num_max(), 2 * 16);
  EXPECT_FALSE(v->Allocate(2 * 16 + 1).ok());
}

TEST(KvArena, ReplenishMapsTheBufferAheadWithinBudgetAndFloors) {
  Fixture f(4, /*buffer=*/2);
  EXPECT_EQ(f.arena->Replenish(), 2);
  EXPECT_EQ(f.arena->Replenish(), 0);  // already full
  EXPECT_EQ(f.arena->stats().slabs_empty, 2);
  auto v = *f.arena->CreateAllocator(4096);  // 16 blocks per slab
  const int64_t calls = f.pool->stats().map_calls;
  auto ids = *v->Allocate(2 * 16);  // both ready slabs: no driver call
  EXPECT_EQ(f.pool->stats().map_calls, calls);
  // Two of four pages left; a floor of another model reserves both.
  TenantLimits floor2;
  floor2.floor_bytes = 2 * static_cast<int64_t>(kPage);
  auto other = *f.arena->CreateAllocator(4096, floor2);
  EXPECT_EQ(f.arena->Replenish(), 0);
  ASSERT_TRUE(f.arena->SetLimits(other.get(), TenantLimits{}).ok());
  EXPECT_EQ(f.arena->Replenish(), 2);
  EXPECT_EQ(f.pool->stats().mapped_bytes, 4 * static_cast<int64_t>(kPage));
  // Reclaim for weights gives the buffer back.
  EXPECT_EQ(f.arena->ReclaimFreeSlabs(), 2 * static_cast<int64_t>(kPage));
  EXPECT_TRUE(v->Free(ids).ok());
}

// SlabsInUse lists each formatted slab's blocks in use; CountSlabBlocks over
// every holder's blocks, by the allocator's addressing, gives the same
// figures (what PlanSlabShedding compares to decide a slab can empty).
TEST(KvArena, SlabsInUseAgreeWithTheBlocksCountedBySlab) {
  Fixture f(/*budget_pages=*/8);
  auto small = *f.arena->CreateAllocator(4096);  // 16 blocks a slab
  auto large = *f.arena->CreateAllocator(8192);  // 8 blocks a slab
  // Interleaved: two holders of small blocks share slabs.
  std::vector<BlockId> h1, h2, h3;
  for (int i = 0; i < 20; ++i) {
    auto one = *small->Allocate(1);
    (i % 3 == 0 ? h2 : h1).push_back(one[0]);
  }
  h3 = *large->Allocate(10);
  std::vector<SlabBlocks> counted;
  for (const auto* h : {&h1, &h2}) CountSlabBlocks(*h, small->addressing().slab_shift, &counted);
  CountSlabBlocks(h3, large->addressing().slab_shift, &counted);
  const std::vector<SlabBlocks> in_use = f.arena->SlabsInUse();
  ASSERT_EQ(in_use.size(), 4u);  // two slabs of each size
  ASSERT_EQ(counted.size(), in_use.size());
  int64_t total = 0;
  for (size_t i = 0; i < in_use.size(); ++i) {
    EXPECT_EQ(counted[i].slab, in_use[i].slab);
    EXPECT_EQ(counted[i].blocks, in_use[i].blocks);
    total += in_use[i].blocks;
  }
  EXPECT_EQ(total, 30);
  // Counting in two calls adds up, one entry a slab, sorted.
  std::vector<SlabBlocks> twice;
  CountSlabBlocks(absl::MakeConstSpan(h1).subspan(0, 5), small->addressing().slab_shift, &twice);
  CountSlabBlocks(absl::MakeConstSpan(h1).subspan(5), small->addressing().slab_shift, &twice);
  std::vector<SlabBlocks> once;
  CountSlabBlocks(h1, small->addressing().slab_shift, &once);
  ASSERT_EQ(twice.size(), once.size());
  for (size_t i = 0; i < once.size(); ++i) {
    EXPECT_EQ(twice[i].slab, once[i].slab);
    EXPECT_EQ(twice[i].blocks, once[i].blocks);
  }
  for (const auto* h : {&h1, &h2}) ASSERT_TRUE(small->Free(*h).ok());
  ASSERT_TRUE(large->Free(h3).ok());
  EXPECT_TRUE(f.arena->SlabsInUse().empty());
}

TEST(KvArena, SlabSizeKeepsTailWasteUnderThreePercent) {
  const size_t page = 2 << 20;
  // Power-of-two block sizes: the LCM is the page itself.
  EXPECT_EQ(ChooseSlabBytes({64 << 10, 128 << 10}, page, 64u << 20), page);
  // Awkward sizes (e.g. FP8 + FP16 KV of different head counts).
  const std::vector<size_t> sizes = {3 * 40960, 5 * 24576, 7 * 12288};
  const size_t slab = ChooseSlabBytes(sizes, page, 64u << 20);
  EXPECT_EQ(slab % page, 0u);
  for (size_t b : sizes) EXPECT_LT(static_cast<double>(slab % b), 0.03 * slab) << b;
}

}  // namespace
}  // namespace ballast::memory

namespace ballast::memory {
namespace {

// Tenants (one per resident model): a limit caps what a model holds, a floor
// keeps room for a model that others cannot carve into; both move at runtime.
TEST(KvArenaTenants, LimitCapsOneModelAndMovesAtRuntime) {
  Fixture f(8);
  TenantLimits l;
  l.limit_bytes = 2 * static_cast<int64_t>(kPage);  // 2 slabs' worth
  auto a = *f.arena->CreateAllocator(4096, l);      // 16 blocks per slab
  auto b = *f.arena->CreateAllocator(4096);
  EXPECT_EQ(a->num_max(), 32);
  auto first = *a->Allocate(32);
  auto over = a->Allocate(1);
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(over.status().message().find("limit"), std::string::npos);
  EXPECT_EQ(a->num_free(), 0);
  auto other = b->Allocate(6 * 16);  // the other model takes the rest
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_TRUE(b->Free(*other).ok());
  l.limit_bytes = 4 * static_cast<int64_t>(kPage);
  ASSERT_TRUE(f.arena->SetLimits(a.get(), l).ok());
  auto more = a->Allocate(32);
  ASSERT_TRUE(more.ok()) << more.status();
  // Lowering the limit below what is held takes nothing away; it stops growth.
  l.limit_bytes = kPage;
  ASSERT_TRUE(f.arena->SetLimits(a.get(), l).ok());
  EXPECT_EQ(a->num_free(), 0);
  EXPECT_FALSE(a->Allocate(1).ok());
  EXPECT_TRUE(a->Free(first).ok());
  EXPECT_TRUE(a->Free(*more).ok());
}

TEST(KvArenaTenants, FloorKeepsRoomOthersCannotTake) {
  Fixture f(8, /*buffer=*/0);
  TenantLimits floor3;
  floor3.floor_bytes = 3 * static_cast<int64_t>(kPage);
  auto a = *f.arena->CreateAllocator(4096, floor3);  // holds nothing yet
  auto b = *f.arena->CreateAllocator(4096);
  EXPECT_EQ(b->num_free(), 5 * 16);  // 8 slabs less a's floor of 3
  auto b_all = b->Allocate(5 * 16);
  ASSERT_TRUE(b_all.ok()) << b_all.status();
  auto b_more = b->Allocate(1);
  EXPECT_EQ(b_more.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(b_more.status().message().find("floors"), std::string::npos);
  // The model with the floor still gets its share.
  auto a_all = a->Allocate(3 * 16);
  ASSERT_TRUE(a_all.ok()) << a_all.status();
  EXPECT_TRUE(a->Free(*a_all).ok());
  // Dropping the floor at runtime hands the room back to everyone.
  ASSERT_TRUE(f.arena->SetLimits(a.get(), TenantLimits{}).ok());
  auto b_rest = b->Allocate(3 * 16);
  ASSERT_TRUE(b_rest.ok()) << b_rest.status();
  EXPECT_TRUE(b->Free(*b_rest).ok());
  EXPECT_TRUE(b->Free(*b_all).ok());
  // An allocator gone from the arena reserves nothing.
  auto c = *f.arena->CreateAllocator(4096, floor3);
  c.reset();
  EXPECT_EQ(b->num_free(), 8 * 16);
  EXPECT_FALSE(f.arena->SetLimits(b.get(), TenantLimits{5, 4}).ok());  // floor above limit
}

}  // namespace
}  // namespace ballast::memory

namespace ballast::memory {
namespace {

// The admission watermark on a shared arena: each tenant sees the other
// live tenants' growth, in its own block size, rounded up; a tenant gone
// reserves nothing.
TEST(KvArenaTenants, EachTenantSeesTheOthersGrowth) {
  Fixture f(/*budget_pages=*/8);
  auto a = *f.arena->CreateAllocator(1024), b = *f.arena->CreateAllocator(4096);
  auto c = *f.arena->CreateAllocator(1024);
  EXPECT_EQ(a->others_growth_blocks(), 0);
  b->set_growth_reserve(3 * 4096);
  c->set_growth_reserve(1000);
  EXPECT_EQ(a->others_growth_blocks(), 13);  // (12,288 + 1,000) / 1,024, up
  EXPECT_EQ(b->others_growth_blocks(), 1);   // c's 1,000 bytes: one block of 4 KiB
  EXPECT_EQ(c->others_growth_blocks(), 12);  // b's alone
  a->set_growth_reserve(-5);                 // nothing
  EXPECT_EQ(b->others_growth_blocks(), 1);
  b.reset();
  EXPECT_EQ(a->others_growth_blocks(), 1);
  EXPECT_EQ(c->others_growth_blocks(), 0);
}

// Free is checked in every build type: a double, foreign or bogus free is
// refused with a status and changes nothing, so a slab's use count stays
// right and a slab holding live blocks is never released.
TEST(KvArenaFree, DoubleFreeIsRefusedAndLeavesStatsUnchanged) {
  Fixture f(4);
  auto v = *f.arena->CreateAllocator(4096);  // 16 blocks per slab
  auto ids = *v->Allocate(3);
  ASSERT_TRUE(v->Free({ids[0]}).ok());
  const KvArenaStats before = f.arena->stats();
  const int64_t free_before = v->num_free();
  const absl::Status again = v->Free({ids[0]});
  EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(again.message().find("double free"), std::string::npos) << again;
  // Listed twice in one span: the same, and the valid block stays allocated.
  EXPECT_EQ(v->Free({ids[1], ids[1]}).code(), absl::StatusCode::kFailedPrecondition);
  const KvArenaStats after = f.arena->stats();
  EXPECT_EQ(after.blocks_used, before.blocks_used);
  EXPECT_EQ(after.blocks_used, 2);
  EXPECT_EQ(after.slabs_formatted, before.slabs_formatted);
  EXPECT_EQ(after.releases, before.releases);
  EXPECT_EQ(v->num_free(), free_before);
  EXPECT_TRUE(v->Free({ids[1], ids[2]}).ok());
  EXPECT_EQ(f.arena->stats().blocks_used, 0);
}

TEST(KvArenaFree, BogusFreeNeverReleasesASlabWithLiveBlocks) {
  Fixture f(2, /*buffer=*/0);  // an emptied slab is unmapped at once
  auto a = *f.arena->CreateAllocator(4096);
  auto b = *f.arena->CreateAllocator(4096);
  auto two = *a->Allocate(2);  // one slab: one freed block, one live
  std::memset(a->Address(two[1]), 0x5a, 4096);
  ASSERT_TRUE(a->Free({two[0]}).ok());
  // Neither a double free nor a span mixing it with the live block gets
  // the slab's use count to zero.
  EXPECT_FALSE(a->Free({two[0]}).ok());
  EXPECT_FALSE(a->Free({two[1], two[0]}).ok());
  EXPECT_EQ(f.arena->stats().slabs_formatted, 1);
  EXPECT_EQ(f.arena->stats().releases, 0);
  EXPECT_EQ(f.arena->stats().blocks_used, 1);
  // The rest of the budget goes to the other model; the live block stays
  // where it was, untouched.
  auto rest = b->Allocate(b->num_free());
  ASSERT_TRUE(rest.ok()) << rest.status();
  for (BlockId id : *rest) std::memset(b->Address(id), 0xa5, 4096);
  const uint8_t* live = a->Address(two[1]);
  for (int k = 0; k < 4096; k += 61) ASSERT_EQ(live[k], 0x5a);
  EXPECT_TRUE(b->Free(*rest).ok());
  EXPECT_TRUE(a->Free({two[1]}).ok());
  EXPECT_EQ(f.arena->stats().blocks_used, 0);
}

TEST(KvArenaFree, ForeignFreeAcrossTenantsIsRefused) {
  Fixture f(4);
  auto a = *f.arena->CreateAllocator(4096);
  auto b = *f.arena->CreateAllocator(4096);  // same block size: same slabs
  auto c = *f.arena->CreateAllocator(1024);  // another size class
  auto mine = *a->Allocate(2);
  auto theirs = *b->Allocate(1);
  const int64_t a_free = a->num_free(), b_free = b->num_free();
  const absl::Status st = b->Free({mine[0]});
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("another model"), std::string::npos) << st;
  // All or nothing: b's own block in the same span is not freed either.
  EXPECT_EQ(b->Free({theirs[0], mine[1]}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c->Free({mine[0]}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(a->num_free(), a_free);
  EXPECT_EQ(b->num_free(), b_free);
  EXPECT_EQ(f.arena->stats().blocks_used, 3);
  // Garbage ids: out of range, never carved.
  EXPECT_EQ(a->Free({-1}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(a->Free({BlockId{INT32_MAX}}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(a->Free({static_cast<BlockId>(200 * KvArena::kMaxBlocksPerSlab)}).code(),
            absl::StatusCode::kInvalidArgument);
  // The owners free their own blocks.
  EXPECT_TRUE(a->Free(mine).ok());
  EXPECT_TRUE(b->Free(theirs).ok());
  EXPECT_EQ(f.arena->stats().blocks_used, 0);
}

}  // namespace
}  // namespace ballast::memory
