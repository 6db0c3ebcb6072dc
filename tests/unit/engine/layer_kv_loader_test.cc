// LayerKvLoader: the layer-wise load's control. Layer l becomes ready
// while later layers are still copying, layers finish in order, and a new
// load or the destructor waits for the one in flight.
#include "engine/layer_kv_loader.h"

#include <atomic>
#include <cstring>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace ballast::engine {
namespace {

// A load of `layers` layers, one 1-byte copy each, from src[l] to dst[l].
LayerKvCopies Load(std::vector<uint8_t>* src, std::vector<uint8_t>* dst) {
  LayerKvCopies load;
  for (size_t l = 0; l < src->size(); ++l) {
    load.layers.push_back({{&(*dst)[l], &(*src)[l], 1}});
  }
  return load;
}

TEST(LayerKvLoader, EarlyLayersAreReadyWhileLaterOnesLoad) {
  absl::Notification release_layer_1;
  std::vector<int> order;  // written by the loader's thread only
  LayerKvLoader loader([&](absl::Span<const KvBlockCopy> copies) {
    const uint8_t v = *copies[0].host;
    if (v == 1) release_layer_1.WaitForNotification();
    order.push_back(v);
    *copies[0].block = v;
  });
  std::vector<uint8_t> src = {0, 1, 2}, dst = {9, 9, 9};
  loader.Start(Load(&src, &dst));
  loader.WaitLayer(0);  // returns although layer 1's copy is held back
  EXPECT_TRUE(loader.pending());
  EXPECT_EQ(dst[0], 0);
  release_layer_1.Notify();
  loader.WaitLayer(2);
  loader.WaitAll();
  EXPECT_FALSE(loader.pending());
  EXPECT_EQ(dst, src);
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2}));
}

TEST(LayerKvLoader, WaitsWithoutALoadReturnAtOnce) {
  LayerKvLoader loader([](absl::Span<const KvBlockCopy>) { FAIL() << "nothing to copy"; });
  loader.WaitLayer(5);
  loader.WaitAll();
  loader.Start({});  // no layers: nothing pending
  EXPECT_FALSE(loader.pending());
}

TEST(LayerKvLoader, NextLoadAndDestructorWaitForTheOneInFlight) {
  std::atomic<int> copied{0};
  std::vector<uint8_t> src1(8, 1), dst1(8, 0), src2(8, 2), dst2(8, 0);
  {
    LayerKvLoader loader([&](absl::Span<const KvBlockCopy> copies) {
      for (const KvBlockCopy& c : copies) std::memcpy(c.block, c.host, c.bytes);
      copied.fetch_add(1);
    });
    loader.Start(Load(&src1, &dst1));
    loader.Start(Load(&src2, &dst2));  // waits for the first
    EXPECT_EQ(dst1, src1);
  }  // the destructor waits for the second
  EXPECT_EQ(dst2, src2);
  EXPECT_EQ(copied.load(), 16);
}

}  // namespace
}  // namespace ballast::engine
