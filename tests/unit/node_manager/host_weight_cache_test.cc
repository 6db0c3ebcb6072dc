// HostWeightCache: a DRAM budget over evicted models' weights, least
// recently used dropped first, keyed by model and checkpoint path.
#include "node_manager/host_weight_cache.h"

#include "gtest/gtest.h"

namespace ballast::node_manager {
namespace {

class Fake final : public engine::HostWeights {
 public:
  explicit Fake(int64_t b) : b_(b) {}
  int64_t bytes() const override { return b_; }

 private:
  int64_t b_;
};

std::shared_ptr<const engine::HostWeights> W(int64_t b) { return std::make_shared<Fake>(b); }

TEST(HostWeightCache, DropsLeastRecentlyUsedFirstWithinTheBudget) {
  HostWeightCache c(100);
  ASSERT_TRUE(c.Put("a", "/a", W(40)));
  ASSERT_TRUE(c.Put("b", "/b", W(40)));
  ASSERT_NE(c.Get("a", "/a"), nullptr);  // a is now the most recent
  ASSERT_TRUE(c.Put("c", "/c", W(40)));  // drops b, not a
  EXPECT_TRUE(c.Contains("a", "/a"));
  EXPECT_FALSE(c.Contains("b", "/b"));
  EXPECT_TRUE(c.Contains("c", "/c"));
  EXPECT_EQ(c.stats().bytes, 80);
  EXPECT_EQ(c.stats().dropped, 1);
  // Larger than the whole budget: not kept, nothing else dropped.
  EXPECT_FALSE(c.Put("d", "/d", W(101)));
  EXPECT_EQ(c.stats().entries, 2);
  // Another path for the same model is a miss; a new copy replaces the old.
  EXPECT_EQ(c.Get("a", "/other"), nullptr);
  ASSERT_TRUE(c.Put("a", "/a2", W(10)));
  EXPECT_FALSE(c.Contains("a", "/a"));
  EXPECT_EQ(c.stats().bytes, 50);
  c.Erase("c");
  EXPECT_EQ(c.stats().bytes, 10);
}

// What a full pinned arena does to make room (NodeManager::KeepHostCopy):
// the least recently used copy goes first, but not one an engine still
// holds (dropping it would free nothing); none left says so.
TEST(HostWeightCache, DropLeastRecentTakesTheOldestCopyNothingElseHolds) {
  HostWeightCache c(100);
  ASSERT_TRUE(c.Put("a", "/a", W(30)));
  ASSERT_TRUE(c.Put("b", "/b", W(30)));
  ASSERT_TRUE(c.Put("c", "/c", W(30)));
  ASSERT_NE(c.Get("a", "/a"), nullptr);  // oldest first: b, c, a
  auto held = c.Get("b", "/b");          // an engine activated from b's copy: c, a, b
  held = nullptr;
  held = c.Get("c", "/c");  // ... and from c's, which it still holds: a, b, c
  ASSERT_TRUE(c.DropLeastRecent());
  EXPECT_FALSE(c.Contains("a", "/a"));
  ASSERT_TRUE(c.DropLeastRecent());
  EXPECT_FALSE(c.Contains("b", "/b"));
  EXPECT_FALSE(c.DropLeastRecent());  // c's copy is held: dropping it frees nothing
  EXPECT_TRUE(c.Contains("c", "/c"));
  held = nullptr;
  ASSERT_TRUE(c.DropLeastRecent());
  EXPECT_EQ(c.stats().bytes, 0);
  EXPECT_EQ(c.stats().dropped, 3);
}

}  // namespace
}  // namespace ballast::node_manager
