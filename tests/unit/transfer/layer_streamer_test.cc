// LayerStreamer: every streamed layer is read from a slot that holds it,
// over many passes, for one and two slots and several layer sets; slots
// hold their home layers again after each pass, and a slot is never
// copied onto itself.
#include "transfer/layer_streamer.h"

#include <atomic>
#include <random>

#include "gtest/gtest.h"
#include "memory/remap_plan.h"

namespace ballast::transfer {
namespace {

void RunPasses(int n, int alpha, int slots, int passes) {
  const std::vector<int> streamed = memory::StreamedLayers(n, alpha + slots);
  std::vector<int> content(static_cast<size_t>(slots));
  for (int s = 0; s < slots; ++s)
    content[static_cast<size_t>(s)] = streamed[static_cast<size_t>(s)];
  std::mt19937 rng(n * 100 + alpha * 10 + slots);
  std::atomic<int> spin{0};
  LayerStreamer st(streamed, slots, n, [&](int slot, int layer) {
    // Copies of uneven length, so some finish after their reader asks.
    for (int i = 0; i < 2000 * (layer % 5); ++i) spin.fetch_add(1, std::memory_order_relaxed);
    content[static_cast<size_t>(slot)] = layer;
  });
  int streamed_reads = 0;
  for (int p = 0; p < passes; ++p) {
    for (int l = 0; l < n; ++l) {
      const int s = st.Acquire(l);
      const bool is_streamed = std::find(streamed.begin(), streamed.end(), l) != streamed.end();
      ASSERT_EQ(s >= 0, is_streamed) << "layer " << l;
      if (s >= 0) {
        EXPECT_EQ(
            s, static_cast<int>(std::find(streamed.begin(), streamed.end(), l) - streamed.begin()) %
                   slots);
        ASSERT_EQ(content[static_cast<size_t>(s)], l) << "pass " << p << " layer " << l;
        ++streamed_reads;
      }
      st.Release(l);
    }
    st.WaitIdle();
    for (int s = 0; s < slots; ++s) {
      EXPECT_EQ(content[static_cast<size_t>(s)], streamed[static_cast<size_t>(s)]);
    }
  }
  EXPECT_EQ(streamed_reads, passes * (alpha + slots));
  // A slot whose home is its only layer (α < slots) is not copied onto
  // itself: with α = 1 and two slots, 2 copies a pass, not 3.
  EXPECT_EQ(st.stats().copies, passes * (alpha + slots - std::max(0, slots - alpha)));
}

TEST(LayerStreamer, EveryStreamedLayerIsReadFromASlotHoldingIt) {
  for (int slots : {1, 2}) {
    for (int alpha : {1, 2, 3, 5}) {
      RunPasses(12, alpha, slots, 4);
    }
  }
  RunPasses(3, 1, 2, 3);  // every layer streamed
}

}  // namespace
}  // namespace ballast::transfer
