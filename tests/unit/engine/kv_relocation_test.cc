// RelocateBlocks over a KV arena in host pages: the blocks of draining
// slabs move with their bytes, the tables point at the copies, the slabs
// empty; every error leaves the tables and the arena as they were.
#include "engine/kv_relocation.h"

#include <algorithm>
#include <cstring>
#include <memory>

#include "gtest/gtest.h"
#include "memory/host_block_pool.h"
#include "memory/kv_arena.h"
#include "memory/page_pool.h"

namespace ballast::engine {
namespace {

constexpr size_t kPage = 64 << 10;

struct Fixture {
  Fixture() {
    pool = std::shared_ptr<memory::HostPagePool>(
        *memory::HostPagePool::Create(kPage, 16 * static_cast<int64_t>(kPage)));
    memory::KvArenaOptions o;
    o.slab_bytes = kPage;
    o.reserve_bytes = 16 * kPage;
    o.free_slab_buffer = 0;
    arena = *memory::KvArena::Create(pool, o);
    layout.num_layers = 2;
    layout.num_kv_heads = 2;
    layout.head_dim = 16;
    layout.block_tokens = 4;  // 1 KiB blocks, 64 a slab
    allocator = *arena->CreateAllocator(layout.block_bytes());
    cache = std::make_unique<KvCache>(layout, allocator.get());
  }
  // Fills every block of `t` with a byte derived from its table position.
  void Tag(const SequenceKv& t, int salt) {
    for (size_t l = 0; l < t.blocks.size(); ++l) {
      for (size_t i = 0; i < t.blocks[l].size(); ++i) {
        std::memset(allocator->Address(t.blocks[l][i]), Byte(salt, l, i), layout.block_bytes());
      }
    }
  }
  // Whether every block of `t` still holds its tag.
  bool Tagged(const SequenceKv& t, int salt) {
    for (size_t l = 0; l < t.blocks.size(); ++l) {
      for (size_t i = 0; i < t.blocks[l].size(); ++i) {
        const uint8_t* p = allocator->Address(t.blocks[l][i]);
        const uint8_t want = Byte(salt, l, i);
        if (!std::all_of(p, p + layout.block_bytes(), [&](uint8_t b) { return b == want; })) {
          return false;
        }
      }
    }
    return true;
  }
  static uint8_t Byte(int salt, size_t l, size_t i) {
    return static_cast<uint8_t>(salt * 37 + l * 11 + i * 3 + 1);
  }
  std::shared_ptr<memory::HostPagePool> pool;
  std::unique_ptr<memory::KvArena> arena;
  KvLayout layout;
  std::unique_ptr<memory::BlockAllocator> allocator;
  std::unique_ptr<KvCache> cache;
};

KvMoveFn Memcpy() {
  return [](absl::Span<const KvBlockMove> moves) {
    for (const KvBlockMove& m : moves) std::memcpy(m.to, m.from, m.bytes);
    return absl::OkStatus();
  };
}

// Four sequences grown in turn share slabs; two are released, leaving holes.
std::vector<SequenceKv> Fragment(Fixture& f) {
  std::vector<SequenceKv> seqs(4);
  for (int tokens = 4; tokens <= 120; tokens += 4) {
    for (SequenceKv& s : seqs) EXPECT_TRUE(f.cache->Reserve(&s, tokens).ok());
  }
  f.cache->Release(&seqs[1]);
  f.cache->Release(&seqs[3]);
  seqs.erase(seqs.begin() + 3);
  seqs.erase(seqs.begin() + 1);
  for (size_t k = 0; k < seqs.size(); ++k) f.Tag(seqs[k], static_cast<int>(k));
  return seqs;
}

TEST(RelocateBlocks, MovesTheBytesAndEmptiesTheDrainedSlabs) {
  Fixture f;
  std::vector<SequenceKv> seqs = Fragment(f);
  const memory::KvArenaStats before = f.arena->stats();
  // 120 blocks in use over 4 slabs of 64: two can empty.
  ASSERT_EQ(before.slabs_formatted, 4);
  ASSERT_EQ(before.blocks_used, 120);
  const std::vector<int64_t> slabs = f.arena->BeginDrain(4);
  ASSERT_EQ(slabs.size(), 2u);
  std::vector<SequenceKv*> tables = {&seqs[0], &seqs[1]};
  auto moved = RelocateBlocks(tables, slabs, f.allocator.get(), Memcpy());
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_GT(*moved, 0);
  EXPECT_TRUE(f.arena->draining().empty());
  f.arena->EndDrain();
  EXPECT_EQ(f.arena->stats().slabs_formatted, 2);
  EXPECT_EQ(f.arena->stats().blocks_used, 120);
  EXPECT_EQ(f.pool->stats().mapped_bytes, 2 * static_cast<int64_t>(kPage));
  const int shift = f.allocator->addressing().slab_shift;
  for (size_t k = 0; k < seqs.size(); ++k) {
    EXPECT_TRUE(f.Tagged(seqs[k], static_cast<int>(k))) << k;
    for (const auto& layer : seqs[k].blocks) {
      for (memory::BlockId id : layer) {
        EXPECT_FALSE(std::binary_search(slabs.begin(), slabs.end(), int64_t{id} >> shift));
      }
    }
  }
  // Nothing left there: a second pass moves nothing.
  auto again = RelocateBlocks(tables, slabs, f.allocator.get(), Memcpy());
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, 0);
  for (SequenceKv& s : seqs) f.cache->Release(&s);
  EXPECT_EQ(f.arena->stats().blocks_used, 0);
}

TEST(RelocateBlocks, AFailedCopyOrABadTableChangesNothing) {
  Fixture f;
  std::vector<SequenceKv> seqs = Fragment(f);
  const std::vector<SequenceKv> saved = seqs;
  const std::vector<int64_t> slabs = f.arena->BeginDrain(4);
  ASSERT_FALSE(slabs.empty());
  std::vector<SequenceKv*> tables = {&seqs[0], &seqs[1]};
  auto fail = [](absl::Span<const KvBlockMove>) { return absl::InternalError("copy failed"); };
  auto st = RelocateBlocks(tables, slabs, f.allocator.get(), fail);
  EXPECT_EQ(st.status().code(), absl::StatusCode::kInternal);
  EXPECT_EQ(f.arena->stats().blocks_used, 120);
  // The same table twice lists its blocks twice: refused before anything.
  std::vector<SequenceKv*> twice = {&seqs[0], &seqs[0]};
  EXPECT_EQ(RelocateBlocks(twice, slabs, f.allocator.get(), Memcpy()).status().code(),
            absl::StatusCode::kFailedPrecondition);
  // A block another tenant holds (a table that lists someone else's
  // block): its free is refused, the table is put back.
  f.arena->EndDrain();
  auto other = *f.arena->CreateAllocator(f.layout.block_bytes());
  const memory::BlockId foreign = (*other->Allocate(1))[0];
  SequenceKv copy;
  copy.blocks = {{foreign}};
  const std::vector<int64_t> foreign_slab = {int64_t{foreign} >> 16};
  const int64_t used = f.arena->stats().blocks_used;
  auto bad = RelocateBlocks({&copy}, foreign_slab, f.allocator.get(), Memcpy());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kFailedPrecondition) << bad.status();
  EXPECT_EQ(copy.blocks[0][0], foreign);
  EXPECT_EQ(f.arena->stats().blocks_used, used);
  ASSERT_TRUE(other->Free({foreign}).ok());
  for (size_t k = 0; k < seqs.size(); ++k) {
    EXPECT_EQ(seqs[k].blocks, saved[k].blocks) << k;
    EXPECT_TRUE(f.Tagged(seqs[k], static_cast<int>(k))) << k;
  }
  // A pool without slabs moves nothing.
  auto host = *memory::HostBlockPool::Create(f.layout.block_bytes(), 8);
  EXPECT_EQ(*RelocateBlocks(tables, slabs, host.get(), Memcpy()), 0);
  for (SequenceKv& s : seqs) f.cache->Release(&s);
}

}  // namespace
}  // namespace ballast::engine
