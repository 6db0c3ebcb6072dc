// KvArena's compaction (BeginDrain, AllocateForMove, EndDrain): the slabs
// with the fewest bytes in use drain first, only as many as the other slabs
// of their size can take in, moves never map memory nor land in a draining
// slab, and moving every block out empties every drained slab.
#include <algorithm>
#include <map>
#include <random>

#include "gtest/gtest.h"
#include "memory/kv_arena.h"

namespace ballast::memory {
namespace {

constexpr size_t kPage = 64 << 10;

struct Fixture {
  explicit Fixture(int64_t budget_pages) {
    pool = std::shared_ptr<HostPagePool>(
        *HostPagePool::Create(kPage, budget_pages * static_cast<int64_t>(kPage)));
    KvArenaOptions o;
    o.slab_bytes = kPage;
    o.reserve_bytes = 64 * kPage;
    o.free_slab_buffer = 1;
    arena = *KvArena::Create(pool, o);
  }
  std::shared_ptr<HostPagePool> pool;
  std::unique_ptr<KvArena> arena;
};

int64_t SlabOf(BlockId id) { return static_cast<int64_t>(id) >> 16; }

TEST(KvArenaDrain, SparsestSlabsFirstAndOnlyAsManyAsTheOthersCanTake) {
  Fixture f(16);
  auto v = *f.arena->CreateAllocator(8192);     // 8 blocks a slab
  std::vector<BlockId> all = *v->Allocate(32);  // slabs 0-3 full
  // Keep 7, 2, 5 and 1 blocks of slabs 0..3: 15 blocks need 2 slabs.
  const int keep[4] = {7, 2, 5, 1};
  std::vector<BlockId> kept, drop;
  for (BlockId b : all) {
    const int64_t s = SlabOf(b);
    const int64_t n =
        std::count_if(kept.begin(), kept.end(), [&](BlockId k) { return SlabOf(k) == s; });
    (n < keep[s] ? kept : drop).push_back(b);
  }
  ASSERT_TRUE(v->Free(drop).ok());
  EXPECT_TRUE(f.arena->BeginDrain(0).empty());
  const std::vector<int64_t> slabs = f.arena->BeginDrain(3);
  EXPECT_EQ(slabs, (std::vector<int64_t>{1, 3}));  // 2 and 1 blocks; a third would not fit
  EXPECT_EQ(f.arena->draining(), slabs);
  EXPECT_TRUE(f.arena->BeginDrain(1).empty());  // one drain at a time
  // Allocations avoid draining slabs: 3 blocks fit in slabs 0 and 2 (1 + 3 free).
  std::vector<BlockId> more = *v->Allocate(3);
  for (BlockId b : more) EXPECT_TRUE(SlabOf(b) == 0 || SlabOf(b) == 2) << b;
  // Moves take the one block left there, never mapping a slab.
  EXPECT_EQ(v->AllocateForMove(2).status().code(), absl::StatusCode::kResourceExhausted);
  const int64_t mapped = f.pool->stats().mapped_bytes;
  const int64_t free_before = v->num_free();
  std::vector<BlockId> moved = *v->AllocateForMove(1);
  EXPECT_EQ(f.pool->stats().mapped_bytes, mapped);
  EXPECT_EQ(v->num_free(), free_before - 1);  // the tenant holds it
  ASSERT_TRUE(v->Free(more).ok());
  ASSERT_TRUE(v->Free(moved).ok());
  f.arena->EndDrain();
  EXPECT_TRUE(f.arena->draining().empty());
  EXPECT_EQ(v->num_free(), free_before + static_cast<int64_t>(more.size()));
  // Slabs an earlier drain left part-used can be left out.
  EXPECT_EQ(f.arena->BeginDrain(1, {3}), (std::vector<int64_t>{1}));
  f.arena->EndDrain();
  // Lifted: the drained slabs take blocks again (slab 1 is the fullest
  // after 0 and 2 fill up).
  std::vector<BlockId> fill = *v->Allocate(7);
  EXPECT_TRUE(std::any_of(fill.begin(), fill.end(), [](BlockId b) { return SlabOf(b) == 1; }));
  ASSERT_TRUE(v->Free(fill).ok());
  ASSERT_TRUE(v->Free(kept).ok());
  EXPECT_EQ(f.arena->stats().blocks_used, 0);
}

// Random instances, two block sizes: drain, move every block out (copying
// its bytes), and every drained slab empties; no more drain than
// formatted - ceil(used / per slab) per size; the data survives.
TEST(KvArenaDrain, MovingEveryBlockOutEmptiesEveryDrainedSlab) {
  std::mt19937 rng(11);
  for (int round = 0; round < 40; ++round) {
    Fixture f(48);
    const size_t sizes[2] = {4096, 16384};  // 16 and 4 blocks a slab
    std::unique_ptr<BlockAllocator> views[2] = {*f.arena->CreateAllocator(sizes[0]),
                                                *f.arena->CreateAllocator(sizes[1])};
    std::map<BlockId, uint8_t> held[2];
    for (int i = 0; i < 300; ++i) {
      const int c = static_cast<int>(rng() % 2);
      if (held[c].empty() || rng() % 100 < 60) {
        auto got = views[c]->Allocate(1 + static_cast<int>(rng() % 3));
        if (!got.ok()) continue;
        for (BlockId b : *got) {
          const auto tag = static_cast<uint8_t>(rng());
          std::fill_n(views[c]->Address(b), sizes[c], tag);
          held[c][b] = tag;
        }
      } else {
        auto it = held[c].begin();
        std::advance(it, rng() % held[c].size());
        ASSERT_TRUE(views[c]->Free({it->first}).ok());
        held[c].erase(it);
      }
    }
    const KvArenaStats before = f.arena->stats();
    int64_t room = 0;
    for (int c = 0; c < 2; ++c) {
      const int64_t per = static_cast<int64_t>(kPage / sizes[c]);
      std::map<int64_t, int64_t> used;
      for (const auto& [b, tag] : held[c]) ++used[SlabOf(b)];
      room += static_cast<int64_t>(used.size()) -
              (static_cast<int64_t>(held[c].size()) + per - 1) / per;
    }
    const int64_t want = 1 + static_cast<int64_t>(rng() % 6);
    const std::vector<int64_t> slabs = f.arena->BeginDrain(want);
    ASSERT_EQ(static_cast<int64_t>(slabs.size()), std::min(want, room)) << round;
    const int64_t mapped = f.pool->stats().mapped_bytes;
    for (int c = 0; c < 2; ++c) {
      std::vector<BlockId> out;
      for (const auto& [b, tag] : held[c]) {
        if (std::binary_search(slabs.begin(), slabs.end(), SlabOf(b))) out.push_back(b);
      }
      auto to = views[c]->AllocateForMove(static_cast<int>(out.size()));
      ASSERT_TRUE(to.ok()) << round << " " << to.status();
      for (size_t k = 0; k < out.size(); ++k) {
        ASSERT_FALSE(std::binary_search(slabs.begin(), slabs.end(), SlabOf((*to)[k])));
        std::copy_n(views[c]->Address(out[k]), sizes[c], views[c]->Address((*to)[k]));
        held[c][(*to)[k]] = held[c][out[k]];
        held[c].erase(out[k]);
      }
      ASSERT_TRUE(views[c]->Free(out).ok());
    }
    EXPECT_LE(f.pool->stats().mapped_bytes, mapped);  // nothing mapped for the moves
    EXPECT_TRUE(f.arena->draining().empty()) << round;
    f.arena->EndDrain();
    const KvArenaStats after = f.arena->stats();
    EXPECT_EQ(after.slabs_formatted, before.slabs_formatted - static_cast<int64_t>(slabs.size()));
    EXPECT_EQ(after.blocks_used, before.blocks_used);
    for (int c = 0; c < 2; ++c) {
      for (const auto& [b, tag] : held[c]) {
        const uint8_t* p = views[c]->Address(b);
        const uint8_t want = tag;  // clang 14 cannot capture a structured binding
        ASSERT_TRUE(std::all_of(p, p + sizes[c], [&](uint8_t x) { return x == want; })) << b;
      }
      std::vector<BlockId> rest;
      for (const auto& [b, tag] : held[c]) rest.push_back(b);
      ASSERT_TRUE(views[c]->Free(rest).ok());
    }
  }
}

}  // namespace
}  // namespace ballast::memory
