// Activation on the GPU as a node does it: weights mapped from the device's
// balloon (CUDA VMM pages shared with the KV arena), eviction keeping a
// pinned host copy, and reactivation from that copy serving exactly the
// same greedy tokens.
#include <cuda_runtime.h>

#include <iostream>

#include "absl/synchronization/notification.h"
#include "engine/synthetic_model.h"
#include "node_manager/node_manager.h"
#include "tests/gpu/gpu_harness.h"
#include "tests/unit/engine/test_util.h"

namespace ballast::node_manager {
namespace {

struct Sink : engine::GenerationSink {
  void OnToken(int, const std::string&, const engine::TokenLogprobs*) override {}
  void OnDone(absl::StatusOr<engine::GenerationResult> r) override {
    result = std::move(r);
    done.Notify();
  }
  absl::StatusOr<engine::GenerationResult> result = absl::UnknownError("not done");
  absl::Notification done;
};

std::vector<int> Greedy(NodeManager* node, const std::string& id, const std::string& model = "m") {
  v1::NodeGenerateRequest req;
  req.set_request_id(id);
  req.set_model(model);
  req.set_prompt("Reactivation must not change a single token.");
  req.mutable_sampling()->set_max_tokens(48);
  req.mutable_sampling()->set_ignore_eos(true);
  Sink sink;
  auto a = node->Submit(req, &sink);
  EXPECT_TRUE(a.ok()) << a.status();
  if (!a.ok()) return {};
  EXPECT_TRUE(sink.done.WaitForNotificationWithTimeout(absl::Seconds(60)));
  EXPECT_TRUE(sink.result.ok()) << sink.result.status();
  return sink.result.ok() ? sink.result->output_tokens : std::vector<int>{};
}

// An elastic node on GPU 0 with a 1 GiB budget in 2 MiB pages.
NodeOptions CudaNode() {
  NodeOptions n;
  n.engine.backend = "cuda";
  n.slab_bytes = 2u << 20;
  n.devices = {DeviceOptions{"cuda:0", 1ll << 30}};
  return n;
}

TEST(CudaActivation, WeightsLiveInBalloonPagesAndReactivateFromThePinnedCopy) {
  BALLAST_SKIP_WITHOUT_GPU();
  engine::testing::TempDir dir;
  const std::string path =
      engine::testing::WriteTinyModel(dir, "m", engine::testing::GpuTestModelSpec());
  NodeOptions n = CudaNode();
  auto node = NodeManager::Create(n);
  ASSERT_TRUE(node.ok()) << node.status();
  auto first = (*node)->LoadModel("m", path, "auto", "");
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_FALSE(first->from_host_copy());
  const auto balloon = (*node)->devices()[0]->balloon();
  const memory::BalloonStats bs = balloon->stats();
  EXPECT_GE(bs.weight_bytes, first->weight_bytes());  // the weights are balloon pages
  EXPECT_GT(bs.workspace_bytes, 0);
  const std::vector<int> want = Greedy(node->get(), "a");
  ASSERT_EQ(want.size(), 48u);

  ASSERT_TRUE((*node)->EvictModel("m", /*drain=*/true).ok());
  EXPECT_EQ((*node)->host_weights().stats().entries, 1);
  auto again = (*node)->LoadModel("m", path, "auto", "");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->from_host_copy());
  EXPECT_EQ(balloon->stats().weight_ranges_reserved, 1);  // the address range was reused
  EXPECT_EQ(Greedy(node->get(), "b"), want);
  (*node)->Shutdown();
}

// Host copies are made in the arena the node pinned when it started: an
// eviction pins nothing, and when the arena is full the least recently
// used copy makes room.
TEST(CudaActivation, HostCopiesComeFromTheArenaPinnedAtStartAndAFullOneDropsTheOldest) {
  BALLAST_SKIP_WITHOUT_GPU();
  engine::testing::TempDir dir;
  const std::string path =
      engine::testing::WriteTinyModel(dir, "m", engine::testing::GpuTestModelSpec());
  NodeOptions n = CudaNode();
  n.host_weight_cache_bytes = 64ll << 20;  // one 64 MiB chunk: one copy of this model
  auto node = NodeManager::Create(n);
  ASSERT_TRUE(node.ok()) << node.status();
  ASSERT_TRUE((*node)->LoadModel("m", path, "auto", "").ok());
  ASSERT_TRUE((*node)->LoadModel("m2", path, "auto", "").ok());
  const std::vector<int> want = Greedy(node->get(), "a");
  ASSERT_TRUE((*node)->EvictModel("m", /*drain=*/true).ok());
  EXPECT_EQ((*node)->host_weights().stats().entries, 1);
  EXPECT_EQ((*node)->host_weights().stats().bytes, 64ll << 20);  // whole chunks are held
  ASSERT_TRUE((*node)->EvictModel("m2", /*drain=*/true).ok());
  HostWeightCacheStats s = (*node)->host_weights().stats();
  EXPECT_EQ(s.entries, 1);
  EXPECT_EQ(s.dropped, 1);  // m's copy made room for m2's
  auto m2 = (*node)->LoadModel("m2", path, "auto", "");
  ASSERT_TRUE(m2.ok()) << m2.status();
  EXPECT_TRUE(m2->from_host_copy());
  auto m = (*node)->LoadModel("m", path, "auto", "");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_FALSE(m->from_host_copy());
  EXPECT_EQ(Greedy(node->get(), "b", "m2"), want);  // from the arena's copy
  EXPECT_EQ(Greedy(node->get(), "c"), want);
  (*node)->Shutdown();
}

// A budget above the device's memory is cut to what is free on it, in
// both memory modes, so the node reports (and the scheduler places by) the
// memory the GPU has; a budget that fits is kept.
TEST(CudaActivation, ABudgetPastTheDeviceIsCutToItsFreeMemory) {
  BALLAST_SKIP_WITHOUT_GPU();
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  ASSERT_EQ(cudaFree(nullptr), cudaSuccess);
  size_t free0 = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free0, &total), cudaSuccess);
  for (const std::string mode : {"static", "elastic"}) {
    for (const int64_t asked : {static_cast<int64_t>(total) * 2, int64_t{1} << 30}) {
      NodeOptions n;
      n.engine.backend = "cuda";
      n.memory_mode = mode;
      n.slab_bytes = 64u << 20;
      n.host_weight_cache_bytes = 0;  // nothing pinned: not what is tested
      n.devices = {DeviceOptions{"cuda:0", asked}};
      auto node = NodeManager::Create(n);
      ASSERT_TRUE(node.ok()) << node.status();
      const int64_t budget = (*node)->devices()[0]->memory_bytes();
      if (asked > static_cast<int64_t>(total)) {
        EXPECT_LE(budget, static_cast<int64_t>(free0)) << mode;
        EXPECT_GT(budget, static_cast<int64_t>(free0) - (256ll << 20)) << mode;
        EXPECT_EQ(budget % (64ll << 20), 0) << mode;
      } else {
        EXPECT_EQ(budget, asked) << mode;
      }
      EXPECT_EQ((*node)->devices()[0]->Usage().memory_total_bytes, budget) << mode;
      (*node)->Shutdown();
    }
  }
}

// Both memory modes charge what the device really gives (cudaMemGetInfo),
// workspace included, and the same workspace for the same model.
TEST(CudaActivation, BothMemoryModesChargeTheRealBytes) {
  BALLAST_SKIP_WITHOUT_GPU();
  engine::testing::TempDir dir;
  const std::string path =
      engine::testing::WriteTinyModel(dir, "m", engine::testing::GpuTestModelSpec());
  int64_t workspace[2] = {0, 0};
  for (int i = 0; i < 2; ++i) {
    const std::string mode = i == 0 ? "static" : "elastic";
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    ASSERT_EQ(cudaFree(nullptr), cudaSuccess);  // the context exists before the first reading
    size_t free0 = 0, free1 = 0, total = 0;
    ASSERT_EQ(cudaMemGetInfo(&free0, &total), cudaSuccess);
    NodeOptions n;
    n.engine.backend = "cuda";
    n.engine.max_batch_tokens = 1024;
    n.engine.max_seqs = 64;
    n.memory_mode = mode;
    n.slab_bytes = 2u << 20;
    n.devices = {DeviceOptions{"cuda:0", 1ll << 30}};
    auto node = NodeManager::Create(n);
    ASSERT_TRUE(node.ok()) << node.status();
    auto loaded = (*node)->LoadModel("m", path, "auto", "");
    ASSERT_TRUE(loaded.ok()) << mode << ": " << loaded.status();
    ASSERT_EQ(Greedy(node->get(), mode).size(), 48u);
    ASSERT_EQ(cudaMemGetInfo(&free1, &total), cudaSuccess);
    const DeviceUsage u = (*node)->devices()[0]->Usage();
    const int64_t real = static_cast<int64_t>(free0) - static_cast<int64_t>(free1);
    std::cout << mode << ": charged " << u.memory_used_bytes / 1048576.0 << " MiB (workspace "
              << u.workspace_bytes / 1048576.0 << "), device gave " << real / 1048576.0 << " MiB\n";
    // cuBLAS handles, graphs and the allocator's rounding are not charged.
    EXPECT_NEAR(static_cast<double>(u.memory_used_bytes), static_cast<double>(real), 96.0 * 1048576)
        << mode;
    EXPECT_GT(u.workspace_bytes, 0) << mode;
    workspace[i] = u.workspace_bytes;
    (*node)->Shutdown();
  }
  EXPECT_EQ(workspace[0], workspace[1]);
}

}  // namespace
}  // namespace ballast::node_manager
