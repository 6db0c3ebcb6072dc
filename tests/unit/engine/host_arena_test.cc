// HostArena lends fixed-size chunks of memory allocated once, and
// HostChunks splits an image's byte ranges at chunk boundaries; checked
// against a flat copy of the same bytes.
#include "engine/host_arena.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <numeric>
#include <set>

namespace ballast::engine {
namespace {

// Heap slabs, counting what is outstanding.
struct CountingSource {
  int live = 0;
  int calls = 0;
  int fail_at = -1;  // the allocate call (0-based) that fails
  HostSlabSource Source() {
    return {[this](size_t n) -> absl::StatusOr<void*> {
              if (calls++ == fail_at) return absl::ResourceExhaustedError("no memory");
              ++live;
              return std::malloc(n);
            },
            [this](void* p) {
              --live;
              std::free(p);
            }};
  }
};

TEST(HostArena, AllocatesEverythingUpFrontInSlabsAndReleasesItWithTheArena) {
  CountingSource src;
  {
    // 10 chunks of 4 KiB in slabs of 3 chunks: 4 slabs, the last of 1.
    auto a = HostArena::Create({10 * 4096 + 100, 4096, 3 * 4096}, src.Source());
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ(src.live, 4);
    EXPECT_EQ((*a)->capacity_bytes(), 10 * 4096);
    EXPECT_EQ((*a)->free_bytes(), 10 * 4096);
  }
  EXPECT_EQ(src.live, 0);
}

TEST(HostArena, AFailedSlabFailsCreationAndReleasesTheOthers) {
  CountingSource src;
  src.fail_at = 2;
  auto a = HostArena::Create({10 * 4096, 4096, 3 * 4096}, src.Source());
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(a.status().message().find("host arena"), std::string::npos) << a.status();
  EXPECT_EQ(src.live, 0);
}

TEST(HostArena, RefusesBadShapes) {
  CountingSource src;
  EXPECT_FALSE(HostArena::Create({100, 4096, 4096}, src.Source()).ok());   // no whole chunk
  EXPECT_FALSE(HostArena::Create({8192, 4096, 6000}, src.Source()).ok());  // slab not a multiple
  EXPECT_EQ(src.calls, 0);
}

TEST(HostArena, LendsDistinctChunksUntilExhaustedAndTakesThemBack) {
  CountingSource src;
  auto a = HostArena::Create({8 * 4096, 4096, 4 * 4096}, src.Source());
  ASSERT_TRUE(a.ok());
  auto x = (*a)->Take(3 * 4096 + 1);  // 4 chunks
  ASSERT_TRUE(x.ok()) << x.status();
  EXPECT_EQ(x->chunks.size(), 4u);
  EXPECT_EQ(x->bytes, 3u * 4096 + 1);
  auto y = (*a)->Take(0);  // an empty image still takes one chunk
  ASSERT_TRUE(y.ok());
  EXPECT_EQ(y->chunks.size(), 1u);
  auto z = (*a)->Take(4 * 4096);
  ASSERT_FALSE(z.ok());
  EXPECT_EQ(z.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ((*a)->free_bytes(), 3 * 4096);
  std::set<uint8_t*> seen(x->chunks.begin(), x->chunks.end());
  seen.insert(y->chunks[0]);
  EXPECT_EQ(seen.size(), 5u);
  for (uint8_t* c : seen) std::memset(c, 0xab, 4096);  // each is a whole, writable chunk
  (*a)->Give(*x);
  EXPECT_EQ((*a)->free_bytes(), 7 * 4096);
  auto w = (*a)->Take(7 * 4096);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ((*a)->free_bytes(), 0);
  (*a)->Give(*w);
  (*a)->Give(*y);
  EXPECT_EQ((*a)->free_bytes(), 8 * 4096);
}

// Writing an image through ForEachPiece and reading any range back gives
// the same bytes as a flat buffer, for ranges that start and end inside,
// on and across chunk boundaries.
TEST(HostChunks, PiecesCoverEveryRangeExactlyOnce) {
  CountingSource src;
  constexpr size_t kChunk = 64;
  auto a = HostArena::Create({16 * kChunk, kChunk, 4 * kChunk}, src.Source());
  ASSERT_TRUE(a.ok());
  constexpr size_t kBytes = 5 * kChunk + 17;
  auto img = (*a)->Take(kBytes);
  ASSERT_TRUE(img.ok());
  std::vector<uint8_t> flat(kBytes);
  std::iota(flat.begin(), flat.end(), 0);
  img->ForEachPiece(0, kBytes, [&](uint8_t* host, size_t off, size_t n) {
    EXPECT_LE(n, kChunk);
    std::memcpy(host, flat.data() + off, n);
  });
  for (size_t off = 0; off < kBytes; off += 7) {
    for (size_t n : {size_t{0}, size_t{1}, kChunk - 1, kChunk, kChunk + 1, 3 * kChunk}) {
      if (off + n > kBytes) continue;
      std::vector<uint8_t> got;
      size_t next = off;
      img->ForEachPiece(off, n, [&](uint8_t* host, size_t o, size_t len) {
        EXPECT_EQ(o, next);                             // in order, no gaps
        EXPECT_EQ(o / kChunk, (o + len - 1) / kChunk);  // within one chunk
        got.insert(got.end(), host, host + len);
        next = o + len;
      });
      ASSERT_EQ(got.size(), n);
      EXPECT_TRUE(std::equal(got.begin(), got.end(), flat.begin() + static_cast<long>(off)))
          << "offset " << off << " length " << n;
    }
  }
  (*a)->Give(*img);
}

}  // namespace
}  // namespace ballast::engine
