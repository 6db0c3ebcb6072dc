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
  EXPECT_TRUE(pool->Free(*a).ok());
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
      EXPECT_TRUE(pool->Free({b}).ok());
      held_ids.erase(b);
      held.erase(held.begin() + static_cast<long>(i));
    }
    ASSERT_EQ(pool->num_free(), kBlocks - static_cast<int64_t>(held.size()));
  }
}

// Free is checked in every build type and all or nothing: a double free
// (also within one span) or an out-of-range block is refused and frees
// nothing, so no block is ever handed out twice.
TEST(HostBlockPool, DoubleOrForeignFreeIsRefusedAndChangesNothing) {
  auto pool = *HostBlockPool::Create(64, 8);
  auto a = *pool->Allocate(3);
  ASSERT_TRUE(pool->Free({a[0]}).ok());
  const absl::Status again = pool->Free({a[0]});
  EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(again.message().find("double free"), std::string::npos) << again;
  EXPECT_EQ(pool->Free({a[1], a[1]}).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(pool->Free({a[1], 8}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pool->Free({-1}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pool->num_free(), 6);
  // Every block is handed out once: the refused frees did not add any.
  auto rest = pool->Allocate(6);
  ASSERT_TRUE(rest.ok());
  std::set<BlockId> seen(rest->begin(), rest->end());
  seen.insert(a[1]);
  seen.insert(a[2]);
  EXPECT_EQ(seen.size(), 8u);
  EXPECT_FALSE(pool->Allocate(1).ok());
  EXPECT_TRUE(pool->Free(*rest).ok());
  EXPECT_TRUE(pool->Free({a[1], a[2]}).ok());
  EXPECT_EQ(pool->num_free(), 8);
}

}  // namespace
}  // namespace ballast::memory
