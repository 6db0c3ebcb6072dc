// KvManager without an executor: block reservation with LRU eviction of
// cached sessions, the session prefix cache, the admission watermark,
// holdings for device-wide shedding, and the recency clock.
#include "engine/kv_manager.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <numeric>

#include "gtest/gtest.h"
#include "memory/host_block_pool.h"
#include "memory/kv_arena.h"
#include "memory/page_pool.h"

namespace ballast::engine {
namespace {

// 2 layers, blocks of 4 positions: a sequence of t tokens takes
// 2 * ceil(t / 4) blocks.
class KvManagerTest : public ::testing::Test {
 protected:
  void Init(int64_t blocks) {
    KvLayout layout;
    layout.num_layers = 2;
    layout.num_kv_heads = 1;
    layout.head_dim = 4;
    layout.block_tokens = 4;
    pool_ = *memory::HostBlockPool::Create(layout.block_bytes(), blocks);
    cache_ = std::make_unique<KvCache>(layout, pool_.get());
    kv_ = std::make_unique<KvManager>(cache_.get());
  }
  // Keeps a session whose KV covers `tokens` (1, 2, ..., n).
  void KeepSession(const std::string& id, int n, int priority = 0) {
    SequenceKv kv;
    ASSERT_TRUE(kv_->Reserve(&kv, n));
    kv_->Keep(id, std::move(kv), Tokens(n), priority);
  }
  static std::vector<int> Tokens(int n) {
    std::vector<int> t(n);
    std::iota(t.begin(), t.end(), 1);
    return t;
  }
  int64_t Free() const { return pool_->num_free(); }

  std::unique_ptr<memory::HostBlockPool> pool_;
  std::unique_ptr<KvCache> cache_;
  std::unique_ptr<KvManager> kv_;
};

TEST_F(KvManagerTest, ReserveEvictsCachedSessionsLeastRecentlyUsedFirst) {
  Init(12);
  KeepSession("old", 8);  // 4 blocks
  KeepSession("new", 8);  // 4 blocks
  SequenceKv a;
  ASSERT_TRUE(kv_->Reserve(&a, 8));  // the last 4 free blocks: no eviction
  EXPECT_EQ(kv_->num_sessions(), 2);
  SequenceKv b;
  ASSERT_TRUE(kv_->Reserve(&b, 8));  // needs "old"'s blocks
  EXPECT_EQ(kv_->num_sessions(), 1);
  SequenceKv probe;
  EXPECT_GT(kv_->TakePrefix("new", Tokens(8), &probe), 0);  // "new" survived
  kv_->Free(&probe);
  // Too big even with every session gone: false, the table unchanged.
  const int64_t blocks_before = a.num_blocks();
  EXPECT_FALSE(kv_->Reserve(&a, 100));
  EXPECT_EQ(a.num_blocks(), blocks_before);
  EXPECT_EQ(kv_->BytesOf(a), 4 * kv_->block_bytes());
  EXPECT_EQ(kv_->Free(&a), 4 * kv_->block_bytes());
  EXPECT_EQ(kv_->Free(&b), 4 * kv_->block_bytes());
  EXPECT_EQ(Free(), 12);
}

TEST_F(KvManagerTest, TakePrefixGivesTheLongestCommonPrefixAndLeavesOneToCompute) {
  Init(32);
  KeepSession("s", 8);
  std::vector<int> next = Tokens(5);
  next.push_back(99);
  next.push_back(100);
  SequenceKv kv;
  EXPECT_EQ(kv_->TakePrefix("s", next, &kv), 5);
  EXPECT_EQ(kv.num_blocks(), 4);  // the session's blocks moved over
  EXPECT_EQ(kv_->num_sessions(), 0);
  kv_->Keep("s", std::move(kv), Tokens(8), 0);
  SequenceKv same;
  // Identical tokens: all but the last, which must be computed for logits.
  EXPECT_EQ(kv_->TakePrefix("s", Tokens(8), &same), 7);
  SequenceKv none;
  EXPECT_EQ(kv_->TakePrefix("unknown", Tokens(8), &none), 0);
  EXPECT_EQ(none.num_blocks(), 0);
  kv_->Free(&same);
  EXPECT_EQ(Free(), 32);
}

TEST_F(KvManagerTest, KeepReplacesTheSessionsOlderEntryAndDropFreesIt) {
  Init(32);
  KeepSession("s", 8);
  KeepSession("s", 4);  // the next turn's KV replaces the first
  EXPECT_EQ(kv_->num_sessions(), 1);
  EXPECT_EQ(Free(), 30);
  EXPECT_EQ(kv_->Drop("s"), 2 * kv_->block_bytes());
  EXPECT_EQ(kv_->Drop("s"), 0);
  EXPECT_EQ(kv_->EvictLeastRecent(), 0);
  EXPECT_EQ(Free(), 32);
}

// Cached session KV counts as free for admission (Reserve evicts it on
// demand); running sequences keep one block per layer of headroom each.
TEST_F(KvManagerTest, WatermarkCountsCachedSessionBlocksAsFree) {
  Init(12);
  KeepSession("s", 20);  // 10 of the 12 blocks
  ASSERT_EQ(Free(), 2);
  const SequenceKv empty;
  EXPECT_TRUE(kv_->FitsWatermark(empty, 8, /*running=*/0));  // 4 blocks of 2 + 10
  EXPECT_TRUE(kv_->FitsWatermark(empty, 8, /*running=*/4));  // 8 left for 4 x 2 layers
  EXPECT_FALSE(kv_->FitsWatermark(empty, 8, /*running=*/5));
  EXPECT_FALSE(kv_->FitsWatermark(empty, 28, /*running=*/0));  // 14 blocks > 12
  kv_->Drop("s");
  SequenceKv hold;
  ASSERT_TRUE(kv_->Reserve(&hold, 20));  // the same 10 blocks, now running
  EXPECT_FALSE(kv_->FitsWatermark(empty, 8, /*running=*/0));
  kv_->Free(&hold);
}

// Two models on one elastic arena: a newcomer of one must leave room for
// the other's running sequences to grow too (their growth would preempt
// it, the device's newest), and a private pool has no such neighbours.
TEST(KvManagerShared, WatermarkLeavesRoomForTheOtherModelsGrowth) {
  KvLayout layout;
  layout.num_layers = 2;
  layout.num_kv_heads = 1;
  layout.head_dim = 4;
  layout.block_tokens = 4;
  const size_t page = 64 << 10;
  auto pool = std::shared_ptr<memory::HostPagePool>(*memory::HostPagePool::Create(page, 2 * page));
  memory::KvArenaOptions o;
  o.slab_bytes = page;
  o.reserve_bytes = 16 * page;
  auto arena = *memory::KvArena::Create(pool, o);
  auto va = *arena->CreateAllocator(layout.block_bytes());
  auto vb = *arena->CreateAllocator(layout.block_bytes());
  KvCache ca(layout, va.get()), cb(layout, vb.get());
  KvManager a(&ca), b(&cb);
  const int64_t room = va->num_free();  // two slabs of blocks
  ASSERT_GT(room, 40);
  const SequenceKv empty;
  // a asks for all but 2 x 10 blocks: with no running sequences anywhere
  // that fits, and beside b's 10 running sequences (2 layers each) too.
  const int tokens = static_cast<int>((room - 20) / 2 * 4);
  EXPECT_TRUE(a.FitsWatermark(empty, tokens, /*running=*/0));
  b.SetGrowthReserve(10);
  EXPECT_TRUE(a.FitsWatermark(empty, tokens, 0));
  b.SetGrowthReserve(11);  // one more of b's: 22 blocks kept free
  EXPECT_FALSE(a.FitsWatermark(empty, tokens, 0));
  EXPECT_EQ(a.HeadroomBlocks(1), 2 + 22);
  b.SetGrowthReserve(0);
  EXPECT_TRUE(a.FitsWatermark(empty, tokens, 0));
}

TEST_F(KvManagerTest, HoldingsDescribeEachCachedSession) {
  Init(32);
  KeepSession("a", 8, /*priority=*/3);
  KeepSession("b", 4, /*priority=*/-1);
  std::vector<KvHolding> h = kv_->Holdings();
  ASSERT_EQ(h.size(), 2u);
  std::sort(h.begin(), h.end(), [](const auto& x, const auto& y) { return x.id < y.id; });
  EXPECT_EQ(h[0].kind, KvHolding::Kind::kCachedSession);
  EXPECT_EQ(h[0].priority, 3);
  EXPECT_EQ(h[0].bytes, 4 * kv_->block_bytes());
  EXPECT_EQ(h[1].priority, -1);
  EXPECT_EQ(h[1].bytes, 2 * kv_->block_bytes());
  EXPECT_LT(h[0].recency, h[1].recency);  // "a" was used before "b"
  // Least recently used goes first.
  EXPECT_EQ(kv_->EvictLeastRecent(), 4 * kv_->block_bytes());
  ASSERT_EQ(kv_->Holdings().size(), 1u);
  EXPECT_EQ(kv_->Holdings()[0].id, "b");
}

TEST(KvRecency, StrictlyIncreasingSteadyClockNanoseconds) {
  const auto steady_ns = [] {
    return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                     std::chrono::steady_clock::now().time_since_epoch())
                                     .count());
  };
  const uint64_t before = steady_ns();
  uint64_t last = KvRecencyNow();
  EXPECT_GE(last, before);
  for (int i = 0; i < 10000; ++i) {
    const uint64_t now = KvRecencyNow();
    ASSERT_GT(now, last);
    last = now;
  }
  EXPECT_LE(last, steady_ns() + 10000);  // at most one bump per call ahead
}

}  // namespace
}  // namespace ballast::engine

namespace ballast::engine {
namespace {

// 4 layers of 1 head of 4, blocks of 4 positions.
KvLayout FourLayers() {
  KvLayout layout;
  layout.num_layers = 4;
  layout.num_kv_heads = 1;
  layout.head_dim = 4;
  layout.block_tokens = 4;
  return layout;
}

// 4 layers this time: ShedLayers gives back the last layers first, only as
// many as wanted; the entry stays (not counted as cached) and TakePrefix
// reports the layers left; Reserve then fills the shed layers again.
TEST(KvManagerLayers, ShedLayersFreesLaterLayersFirst) {
  const KvLayout layout = FourLayers();
  auto pool = *memory::HostBlockPool::Create(layout.block_bytes(), 64);
  KvCache cache(layout, pool.get());
  KvManager kv(&cache);
  std::vector<int> tokens(8);
  std::iota(tokens.begin(), tokens.end(), 1);
  SequenceKv seq;
  ASSERT_TRUE(kv.Reserve(&seq, 8));  // 2 blocks x 4 layers
  const SequenceKv original = seq;
  kv.Keep("s", std::move(seq), tokens, 0, absl::InfiniteFuture(), /*lower_copy=*/true);
  const int64_t block = kv.block_bytes();
  EXPECT_EQ(kv.ShedLayers("s", 1), 2 * block);  // one layer: the last
  EXPECT_EQ(kv.CachedTokens("s"), 0);
  EXPECT_EQ(kv.num_sessions(), 1);
  EXPECT_EQ(kv.Holdings()[0].bytes, 6 * block);
  EXPECT_EQ(kv.ShedLayers("s", 3 * block), 4 * block);  // two more layers
  SequenceKv got;
  int resident = 0;
  EXPECT_EQ(kv.TakePrefix("s", tokens, &got, nullptr, &resident), 7);
  EXPECT_EQ(resident, 1);
  EXPECT_EQ(got.blocks[0], original.blocks[0]);  // layer 0 kept its blocks
  EXPECT_TRUE(got.blocks[3].empty());
  EXPECT_EQ(pool->num_free(), 64 - 2);
  ASSERT_TRUE(kv.Reserve(&got, 8));  // the shed layers are filled again
  for (const auto& layer : got.blocks) EXPECT_EQ(layer.size(), 2u);
  EXPECT_EQ(pool->num_free(), 64 - 8);
  kv.Free(&got);
  // Wanting all of it (or more than all but the first layer) drops the entry.
  SequenceKv again;
  ASSERT_TRUE(kv.Reserve(&again, 8));
  kv.Keep("t", std::move(again), tokens, 0, absl::InfiniteFuture(), /*lower_copy=*/true);
  EXPECT_EQ(kv.ShedLayers("t", 7 * block), 8 * block);
  EXPECT_EQ(kv.num_sessions(), 0);
  EXPECT_EQ(kv.ShedLayers("t", 1), 0);
  // Without a copy in the lower tiers the first layers alone are useless:
  // the whole entry goes.
  SequenceKv lone;
  ASSERT_TRUE(kv.Reserve(&lone, 8));
  kv.Keep("u", std::move(lone), tokens, 0);
  EXPECT_EQ(kv.ShedLayers("u", 1), 8 * block);
  EXPECT_EQ(kv.num_sessions(), 0);
}

// A reservation short of blocks takes them from the least recently used
// session's later layers (when the tiers hold it), only as many as missing:
// the session keeps its first layers for its next turn.
TEST(KvManagerLayers, ReserveShedsOnlyTheMissingLaterLayers) {
  const KvLayout layout = FourLayers();
  auto pool = *memory::HostBlockPool::Create(layout.block_bytes(), 10);
  KvCache cache(layout, pool.get());
  KvManager kv(&cache);
  std::vector<int> tokens(8);
  std::iota(tokens.begin(), tokens.end(), 1);
  SequenceKv kept;
  ASSERT_TRUE(kv.Reserve(&kept, 8));  // 8 of 10 blocks
  kv.Keep("s", std::move(kept), tokens, 0, absl::InfiniteFuture(), /*lower_copy=*/true);
  SequenceKv next;
  ASSERT_TRUE(kv.Reserve(&next, 4));  // 4 blocks: 2 free, 2 from the last layer
  ASSERT_EQ(kv.num_sessions(), 1) << "the whole session was dropped for two blocks";
  EXPECT_EQ(kv.Holdings()[0].bytes, 6 * kv.block_bytes());
  EXPECT_EQ(pool->num_free(), 0);
  kv.Free(&next);
}

}  // namespace
}  // namespace ballast::engine
