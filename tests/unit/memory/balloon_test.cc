// Balloon: weights and KV draw from one page budget, so memory KV gave back
// holds another model's weights and the reverse; weight mapping is all or
// nothing; address ranges are reused; workspace charges lower the budget.
#include "memory/balloon.h"

#include <cstring>

#include "gtest/gtest.h"

namespace ballast::memory {
namespace {

constexpr size_t kPage = 64 << 10;

std::shared_ptr<Balloon> Make(int64_t pages) {
  auto pool =
      std::shared_ptr<PagePool>(*HostPagePool::Create(kPage, pages * static_cast<int64_t>(kPage)));
  BalloonOptions o;
  o.memory_bytes = pages * static_cast<int64_t>(kPage);
  o.slab_bytes = kPage;
  o.free_slab_buffer = 0;
  return *Balloon::Create(pool, o);
}

TEST(Balloon, WeightsAndKvShareOneBudget) {
  auto b = Make(10);
  auto kv = *b->arena()->CreateAllocator(kPage / 4);
  // KV takes 8 of the 10 pages.
  auto blocks = kv->Allocate(32);
  ASSERT_TRUE(blocks.ok()) << blocks.status();
  EXPECT_EQ(b->FreeBytes(), 2 * static_cast<int64_t>(kPage));
  // Weights of 3 pages do not fit: refused with nothing mapped.
  const PagePoolStats before = b->pool()->stats();
  EXPECT_EQ(b->MapWeights(3 * kPage - 100).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(b->pool()->stats().mapped_bytes, before.mapped_bytes);
  EXPECT_EQ(b->stats().weight_bytes, 0);
  // KV gives back 4 pages' blocks; their slabs unmap and the weights fit.
  EXPECT_TRUE(kv->Free(absl::MakeConstSpan(*blocks).subspan(0, 16)).ok());
  b->arena()->ReclaimFreeSlabs();
  auto w = b->MapWeights(3 * kPage - 100);  // rounds up to 3 pages
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ((*w)->bytes(), 3 * kPage);
  std::memset((*w)->data(), 0x5a, (*w)->bytes());  // really mapped
  BalloonStats s = b->stats();
  EXPECT_EQ(s.weight_bytes, 3 * static_cast<int64_t>(kPage));
  EXPECT_EQ(s.kv_mapped_bytes, 4 * static_cast<int64_t>(kPage));
  EXPECT_EQ(s.free_bytes, 3 * static_cast<int64_t>(kPage));
  // KV may now only grow into what weights left: 3 pages = 12 blocks.
  EXPECT_FALSE(kv->Allocate(13).ok());
  auto more = kv->Allocate(12);
  ASSERT_TRUE(more.ok());
  EXPECT_TRUE(kv->Free(*more).ok());
  EXPECT_TRUE(kv->Free(absl::MakeConstSpan(*blocks).subspan(16)).ok());
  // Dropping the weights returns the pages; the range is kept and reused.
  uint8_t* addr = (*w)->data();
  w->reset();
  EXPECT_EQ(b->stats().weight_bytes, 0);
  EXPECT_EQ(b->stats().weight_ranges_reserved, 1);
  auto again = b->MapWeights(2 * kPage);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)->data(), addr);
  EXPECT_EQ(b->stats().weight_ranges_reserved, 1);
}

TEST(Balloon, WorkspaceChargesLowerTheBudget) {
  auto b = Make(8);
  b->SetWorkspace("a", 3 * kPage);
  EXPECT_EQ(b->FreeBytes(), 5 * static_cast<int64_t>(kPage));
  EXPECT_FALSE(b->MapWeights(6 * kPage).ok());
  b->SetWorkspace("b", kPage);
  EXPECT_EQ(b->stats().workspace_bytes, 4 * static_cast<int64_t>(kPage));
  b->SetWorkspace("a", 0);
  EXPECT_EQ(b->FreeBytes(), 7 * static_cast<int64_t>(kPage));
  EXPECT_TRUE(b->MapWeights(7 * kPage).ok());
}

// Remapping lends a weight layer's whole pages to KV and takes them back;
// pages shared with a neighbouring layer stay mapped (and keep its bytes).
TEST(Balloon, WeightPagesLendWholePagesToKvAndRestoreThem) {
  auto b = Make(10);
  auto w = b->MapWeights(6 * kPage);
  ASSERT_TRUE(w.ok()) << w.status();
  std::memset((*w)->data(), 0x11, (*w)->bytes());
  // A "layer" from half a page in to 3.5 pages: only pages 1 and 2 are its own.
  auto lent = (*w)->Lend(kPage / 2, 3 * kPage);
  ASSERT_TRUE(lent.ok()) << lent.status();
  EXPECT_EQ(*lent, 2 * static_cast<int64_t>(kPage));
  EXPECT_EQ(*(*w)->Lend(kPage / 2, 3 * kPage), 0);  // already lent
  EXPECT_EQ((*w)->lent_bytes(), 2 * static_cast<int64_t>(kPage));
  EXPECT_EQ(b->stats().weight_bytes, 4 * static_cast<int64_t>(kPage));
  EXPECT_EQ(b->FreeBytes(), 6 * static_cast<int64_t>(kPage));
  EXPECT_EQ((*w)->data()[kPage - 1], 0x11);  // the shared pages kept their bytes
  EXPECT_EQ((*w)->data()[3 * kPage + 1], 0x11);
  EXPECT_EQ((*w)->Lend(5 * kPage, 2 * kPage).status().code(), absl::StatusCode::kOutOfRange);
  // KV takes all the free memory: restoring is refused, nothing changes.
  auto kv = *b->arena()->CreateAllocator(kPage);
  auto blocks = kv->Allocate(6);
  ASSERT_TRUE(blocks.ok()) << blocks.status();
  EXPECT_EQ((*w)->Restore(kPage / 2, 3 * kPage).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ((*w)->lent_bytes(), 2 * static_cast<int64_t>(kPage));
  // KV gives two pages back: the layer's pages map again, writable.
  EXPECT_TRUE(kv->Free(absl::MakeConstSpan(*blocks).subspan(0, 2)).ok());
  b->arena()->ReclaimFreeSlabs();
  auto restored = (*w)->Restore(kPage / 2, 3 * kPage);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(*restored, 2 * static_cast<int64_t>(kPage));
  std::memset((*w)->data() + kPage, 0x22, 2 * kPage);
  EXPECT_EQ(b->stats().weight_bytes, 6 * static_cast<int64_t>(kPage));
  // Dropped while a layer is lent: only what is mapped is returned.
  ASSERT_TRUE((*w)->Lend(2 * kPage, kPage).ok());
  w->reset();
  EXPECT_EQ(b->stats().weight_bytes, 0);
  EXPECT_EQ(b->pool()->stats().mapped_bytes, 4 * static_cast<int64_t>(kPage));  // KV's 4 slabs
  EXPECT_TRUE(kv->Free(absl::MakeConstSpan(*blocks).subspan(2)).ok());
}

// Parameter remapping's page moves in one step: with no page free, one
// layer is lent and another taken back (what the lend frees is what the
// restore maps, and no KV allocation can take it in between); a step that
// would need more than the lends free changes nothing.
TEST(Balloon, WeightPagesExchangeLendsAndRestoresInOneStep) {
  auto b = Make(8);
  auto w = b->MapWeights(6 * kPage);
  ASSERT_TRUE(w.ok()) << w.status();
  std::memset((*w)->data(), 0x11, (*w)->bytes());
  using X = WeightPages::Extent;
  ASSERT_EQ(*(*w)->Lend(kPage, kPage), static_cast<int64_t>(kPage));  // "layer 1" lent
  auto kv = *b->arena()->CreateAllocator(kPage);
  auto blocks = kv->Allocate(3);  // every free page
  ASSERT_TRUE(blocks.ok()) << blocks.status();
  EXPECT_EQ(b->FreeBytes(), 0);
  // Lend layer 3, restore layer 1: even.
  const std::vector<X> lend3 = {{3 * kPage, kPage}}, restore1 = {{kPage, kPage}};
  auto net = (*w)->Exchange(lend3, restore1);
  ASSERT_TRUE(net.ok()) << net.status();
  EXPECT_EQ(*net, 0);
  std::memset((*w)->data() + kPage, 0x22, kPage);  // layer 1 is writable again
  EXPECT_EQ((*w)->lent_bytes(), static_cast<int64_t>(kPage));
  EXPECT_EQ(b->stats().weight_bytes, 5 * static_cast<int64_t>(kPage));
  // Lend nothing new (layer 3 is already lent), restore layer 3: no room,
  // and nothing changes.
  const std::vector<X> restore3 = {{3 * kPage, kPage}};
  EXPECT_EQ((*w)->Exchange(lend3, restore3).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ((*w)->lent_bytes(), static_cast<int64_t>(kPage));
  EXPECT_EQ(b->stats().weight_bytes, 5 * static_cast<int64_t>(kPage));
  EXPECT_EQ((*w)->data()[2 * kPage], 0x11);  // layer 2 untouched
  // Two lent, one restored: a page goes to the pool.
  const std::vector<X> lend02 = {{0, kPage}, {2 * kPage, kPage}};
  net = (*w)->Exchange(lend02, restore3);
  ASSERT_TRUE(net.ok()) << net.status();
  EXPECT_EQ(*net, static_cast<int64_t>(kPage));
  EXPECT_EQ(b->FreeBytes(), static_cast<int64_t>(kPage));
  EXPECT_EQ((*w)->lent_bytes(), 2 * static_cast<int64_t>(kPage));
  const std::vector<X> past = {{5 * kPage, 2 * kPage}};
  EXPECT_EQ((*w)->Exchange(past, {}).status().code(), absl::StatusCode::kOutOfRange);
  // An extent both lent and restored is refused; a repeated one counts once.
  const std::vector<X> lend4 = {{4 * kPage, kPage}}, restore4 = {{4 * kPage, kPage}};
  EXPECT_EQ((*w)->Exchange(lend4, restore4).status().code(), absl::StatusCode::kInvalidArgument);
  const std::vector<X> lend44 = {{4 * kPage, kPage}, {4 * kPage, kPage}};
  net = (*w)->Exchange(lend44, {});
  ASSERT_TRUE(net.ok()) << net.status();
  EXPECT_EQ(*net, static_cast<int64_t>(kPage));
  EXPECT_EQ(b->pool()->stats().mapped_bytes, 6 * static_cast<int64_t>(kPage));  // 3 weights + 3 KV
  // A workspace charge puts the pool over its budget: lending still goes
  // through (it only gives memory back); taking a layer back does not.
  b->SetWorkspace("other", 4 * static_cast<int64_t>(kPage));
  const std::vector<X> lend5 = {{5 * kPage, kPage}}, restore0 = {{0, kPage}};
  net = (*w)->Exchange(lend5, {});
  ASSERT_TRUE(net.ok()) << net.status();
  EXPECT_EQ((*w)->Exchange({}, restore0).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(kv->Free(*blocks).ok());
}

}  // namespace
}  // namespace ballast::memory
