// PinnedBufferPool: new buffers are pinned by the pool's thread, not the
// caller's; a dropped chunk's buffer is reused (pinned once) by the next
// chunk of its size; other sizes get new buffers; idle buffers beyond the
// cap, and chunks outliving the pool, are unpinned and freed.
#include "transfer/pinned_pool.h"

#include <atomic>
#include <cstdint>
#include <cstring>
#include <thread>

#include "gtest/gtest.h"

namespace ballast::transfer {
namespace {

KvChunkMeta Meta(uint32_t layers) {
  KvChunkMeta m;
  m.num_layers = layers;
  m.blocks_per_layer = 2;
  m.block_bytes = 4096;
  m.num_tokens = 32;
  return m;
}

struct PinCounter {
  std::atomic<int> pins{0}, unpins{0};
  std::atomic<std::thread::id> pinned_on{};
  PinnedBufferPool::PinFn Fn() {
    return [this](void*, size_t) {
      ++pins;
      pinned_on = std::this_thread::get_id();
      return std::shared_ptr<void>(this, [](void* p) { ++static_cast<PinCounter*>(p)->unpins; });
    };
  }
};

TEST(PinnedBufferPool, ReusesADroppedChunksBufferPinnedOnce) {
  PinCounter pc;
  auto pool = PinnedBufferPool::Create(pc.Fn(), 1 << 20);
  auto a = pool->NewChunk(Meta(2));
  std::memset(a->payload.get(), 7, a->meta.payload_bytes());  // usable before it is pinned
  pool->WaitPinned();
  EXPECT_EQ(pc.pins, 1);
  EXPECT_NE(pc.pinned_on.load(), std::this_thread::get_id());  // not on the caller's thread
  const uint8_t* first = a->payload.get();
  a.reset();
  EXPECT_EQ(pool->stats().idle_bytes, 2 * 2 * 4096);
  auto b = pool->NewChunk(Meta(2));
  EXPECT_EQ(b->payload.get(), first);
  EXPECT_EQ(b->meta.num_layers, 2u);
  auto c = pool->NewChunk(Meta(3));  // another size: a new buffer
  EXPECT_NE(c->payload.get(), first);
  pool->WaitPinned();
  const PinnedPoolStats s = pool->stats();
  EXPECT_EQ(s.reused, 1);
  EXPECT_EQ(s.allocated, 2);
  EXPECT_EQ(s.pinned, 2);
  EXPECT_EQ(s.idle_bytes, 0);
  EXPECT_EQ(pc.pins, 2);  // the reused buffer was not pinned again
  EXPECT_EQ(pc.unpins, 0);
}

TEST(PinnedBufferPool, IdleCapAndChunksOutlivingThePoolFreeTheirBuffers) {
  PinCounter pc;
  auto pool = PinnedBufferPool::Create(pc.Fn(), 2 * 2 * 4096);  // room for one idle buffer
  auto a = pool->NewChunk(Meta(2));
  auto b = pool->NewChunk(Meta(2));
  auto survivor = pool->NewChunk(Meta(1));
  pool->WaitPinned();
  a.reset();
  b.reset();  // over the cap: unpinned and freed
  EXPECT_EQ(pc.unpins, 1);
  EXPECT_EQ(pool->stats().idle_bytes, 2 * 2 * 4096);
  pool.reset();  // the idle buffer goes with the pool
  EXPECT_EQ(pc.unpins, 2);
  survivor.reset();  // returns to no pool: freed
  EXPECT_EQ(pc.unpins, 3);
  EXPECT_EQ(pc.pins, 3);
}

TEST(PinnedBufferPool, WorksWithoutPinning) {
  auto pool = PinnedBufferPool::Create(nullptr, 1 << 20);
  auto a = pool->NewChunk(Meta(1));
  const uint8_t* p = a->payload.get();
  a.reset();
  EXPECT_EQ(pool->NewChunk(Meta(1))->payload.get(), p);
}

}  // namespace
}  // namespace ballast::transfer
