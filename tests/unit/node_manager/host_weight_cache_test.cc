// HostWeightCache: a DRAM budget over evicted models' weights, least
// recently used dropped first, keyed by model, checkpoint path and weight
// quantization.
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

constexpr engine::WeightQuant kNone = engine::WeightQuant::kNone;
constexpr engine::WeightQuant kFp8 = engine::WeightQuant::kFp8;

TEST(HostWeightCache, DropsLeastRecentlyUsedFirstWithinTheBudget) {
  HostWeightCache c(100);
  ASSERT_TRUE(c.Put("a", "/a", kNone, W(40)));
  ASSERT_TRUE(c.Put("b", "/b", kNone, W(40)));
  ASSERT_NE(c.Get("a", "/a", kNone), nullptr);  // a is now the most recent
  ASSERT_TRUE(c.Put("c", "/c", kNone, W(40)));  // drops b, not a
  EXPECT_TRUE(c.Contains("a", "/a", kNone));
  EXPECT_FALSE(c.Contains("b", "/b", kNone));
  EXPECT_TRUE(c.Contains("c", "/c", kNone));
  EXPECT_EQ(c.stats().bytes, 80);
  EXPECT_EQ(c.stats().dropped, 1);
  // Larger than the whole budget: not kept, nothing else dropped.
  EXPECT_FALSE(c.Put("d", "/d", kNone, W(101)));
  EXPECT_EQ(c.stats().entries, 2);
  // Another path for the same model is a miss; a new copy replaces the old.
  EXPECT_EQ(c.Get("a", "/other", kNone), nullptr);
  ASSERT_TRUE(c.Put("a", "/a2", kNone, W(10)));
  EXPECT_FALSE(c.Contains("a", "/a", kNone));
  EXPECT_EQ(c.stats().bytes, 50);
  c.Erase("c");
  EXPECT_EQ(c.stats().bytes, 10);
}

// What a full pinned arena does to make room (NodeManager::KeepHostCopy):
// the least recently used copy goes first, but not one an engine still
// holds (dropping it would free nothing); none left says so.
TEST(HostWeightCache, DropLeastRecentTakesTheOldestCopyNothingElseHolds) {
  HostWeightCache c(100);
  ASSERT_TRUE(c.Put("a", "/a", kNone, W(30)));
  ASSERT_TRUE(c.Put("b", "/b", kNone, W(20)));
  ASSERT_TRUE(c.Put("c", "/c", kNone, W(10)));
  // An engine activated from a's copy holds it; a stays the oldest.
  auto held = c.Get("a", "/a", kNone);
  ASSERT_NE(c.Get("b", "/b", kNone), nullptr);
  ASSERT_NE(c.Get("c", "/c", kNone), nullptr);  // oldest first: a, b, c
  EXPECT_EQ(c.DroppableBytes(), 30);            // b and c
  ASSERT_TRUE(c.DropLeastRecent());             // skips a: drops b
  EXPECT_TRUE(c.Contains("a", "/a", kNone));
  EXPECT_FALSE(c.Contains("b", "/b", kNone));
  ASSERT_TRUE(c.DropLeastRecent());  // c
  EXPECT_FALSE(c.Contains("c", "/c", kNone));
  EXPECT_FALSE(c.DropLeastRecent());  // only a is left, and it is held
  EXPECT_EQ(c.DroppableBytes(), 0);
  EXPECT_EQ(c.stats().bytes, 30);
  held = nullptr;
  EXPECT_EQ(c.DroppableBytes(), 30);
  ASSERT_TRUE(c.DropLeastRecent());
  EXPECT_EQ(c.stats().bytes, 0);
  EXPECT_EQ(c.stats().dropped, 3);
}

// A model registered again under its name and path with another
// quantization has other weights: the old copy is a miss, and the new
// one replaces it (one copy per model).
TEST(HostWeightCache, AnotherQuantizationIsAnotherCopy) {
  HostWeightCache c(100);
  ASSERT_TRUE(c.Put("a", "/a", kNone, W(40)));
  EXPECT_EQ(c.Get("a", "/a", kFp8), nullptr);
  EXPECT_FALSE(c.Contains("a", "/a", kFp8));
  EXPECT_EQ(c.stats().misses, 1);
  ASSERT_TRUE(c.Put("a", "/a", kFp8, W(20)));
  EXPECT_FALSE(c.Contains("a", "/a", kNone));
  EXPECT_NE(c.Get("a", "/a", kFp8), nullptr);
  EXPECT_EQ(c.stats().entries, 1);
  EXPECT_EQ(c.stats().bytes, 20);
}

}  // namespace
}  // namespace ballast::node_manager
