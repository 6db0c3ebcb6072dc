#include "memory/host_block_pool.h"

#include <cstring>
#include <random>
#include <set>

#include "gtest/gtest.h"

namespace ballast::memory {
namespace {

TEST(HostBlockPool, RejectsBadSizes) {
  EXPECT_FALSE(HostBlockPool::Create(0, 4).ok());
  EXPECT_FALSE(HostBlockPool::Create(64, 0).ok());
}

TEST(HostBlockPool, AllOrNothing) {
  auto pool = *HostBlockPool::Create(64, 8);
  auto a = pool->Allocate(5);
  ASSERT_TRUE(a.ok());
  auto b = pool->Allocate(4);  // only 3 left
  EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(pool->num_free(), 3);  // the failure left no trace
  pool->Free(*a);
  EXPECT_EQ(pool->num_free(), 8);
}

// Random churn against a reference: blocks never overlap, bytes written to
// a block stay intact while it is held, and nothing leaks.
TEST(HostBlockPool, ChurnAgainstReference) {
  constexpr int kBlocks = 64;
  auto pool = *HostBlockPool::Create(32, kBlocks);
  std::mt19937 rng(7);
  std::vector<std::pair<BlockId, uint8_t>> held;
  std::set<BlockId> held_ids;
  for (int iter = 0; iter < 5000; ++iter) {
    if (rng() % 2 == 0) {
      const int n = 1 + rng() % 4;
      auto got = pool->Allocate(n);
      if (static_cast<int>(held.size()) + n > kBlocks) {
        EXPECT_FALSE(got.ok());
        continue;
      }
      ASSERT_TRUE(got.ok());
      for (BlockId b : *got) {
        ASSERT_TRUE(held_ids.insert(b).second) << "block " << b << " handed out twice";
        const uint8_t tag = static_cast<uint8_t>(rng());
        std::memset(pool->Address(b), tag, 32);
        held.emplace_back(b, tag);
      }
    } else if (!held.empty()) {
      const size_t i = rng() % held.size();
      const auto [b, tag] = held[i];
      for (int k = 0; k < 32; ++k) ASSERT_EQ(pool->Address(b)[k], tag);
      pool->Free({b});
      held_ids.erase(b);
      held.erase(held.begin() + static_cast<long>(i));
    }
    ASSERT_EQ(pool->num_free(), kBlocks - static_cast<int64_t>(held.size()));
  }
}

}  // namespace
}  // namespace ballast::memory
