// Activation on the GPU as a node does it: weights mapped from the device's
// balloon (CUDA VMM pages shared with the KV arena), eviction keeping a
// pinned host copy, and reactivation from that copy serving exactly the
// same greedy tokens.
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

std::vector<int> Greedy(NodeManager* node, const std::string& id) {
  v1::NodeGenerateRequest req;
  req.set_request_id(id);
  req.set_model("m");
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

TEST(CudaActivation, WeightsLiveInBalloonPagesAndReactivateFromThePinnedCopy) {
  BALLAST_SKIP_WITHOUT_GPU();
  engine::testing::TempDir dir;
  const std::string path =
      engine::testing::WriteTinyModel(dir, "m", engine::testing::GpuTestModelSpec());
  NodeOptions n;
  n.engine.backend = "cuda";
  n.slab_bytes = 2u << 20;
  n.devices = {DeviceOptions{"cuda:0", 1ll << 30}};
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

}  // namespace
}  // namespace ballast::node_manager
