// Model lifecycle across processes: scheduler + two nodes on loopback,
// each node with room for one model's weights. A third model needs room,
// so the idlest model past a short threshold is evicted (draining) and the
// newcomer activates; a request for the evicted model then reactivates it
// (waiting for an idle model to make room) and its output is exactly the
// in-process engine's. (Reactivation from the node's host copy is checked
// in tests/unit/node_manager.)
#include "tests/integration/cluster_fixture.h"

namespace ballast {
namespace {

class LifecycleTest : public ClusterTest {
 protected:
  ClusterSetup Cluster() override {
    // ~16 MiB of f32 weights each: a node of 1.5x that holds one model.
    engine::SyntheticModelSpec s;
    s.layers = 4;
    s.hidden = 256;
    s.heads = 4;
    s.kv_heads = 2;
    s.intermediate = 1024;
    s.max_position = 256;
    s.dtype = "f32";
    ClusterSetup c;
    for (const auto& [name, arch, seed] :
         {std::tuple{"alpha", "llama", 41}, {"beta", "qwen2", 42}, {"gamma", "mistral", 43}}) {
      engine::SyntheticModelSpec m = s;
      m.architecture = arch;
      m.seed = seed;
      c.models.push_back({name, m});
    }
    // f32 weights: embeddings and LM head, then per layer q/o, k/v, MLP.
    const int64_t h = s.hidden, kv = s.kv_heads * (s.hidden / s.heads);
    const int64_t weights =
        4 * (2 * s.vocab * h + s.layers * (2 * h * h + 2 * kv * h + 3 * h * s.intermediate));
    const int64_t mib = (weights + weights / 2) / (1 << 20) + 4;
    c.scheduler_yaml = "scheduler:\n  idle_evict_ms: 1500\n  route_wait_ms: 30000\n";
    c.node_yaml = absl::StrCat("node:\n  devices:\n    - {name: cpu:0, memory_mib: ", mib,
                               "}\n  memory: {mode: elastic, host_weight_cache_mib: 256}\n");
    return c;
  }

  v1::ModelInfo Info(const std::string& model) {
    grpc::ClientContext ctx;
    v1::ListModelsResponse list;
    inference_->ListModels(&ctx, v1::ListModelsRequest(), &list);
    for (const auto& m : list.models())
      if (m.name() == model) return m;
    return {};
  }
};

TEST_F(LifecycleTest, IdleModelIsEvictedForRoomAndReactivatedByARequest) {
  const std::string prompt = "The lighthouse keeper";
  const StreamResult first = Generate("beta", prompt, 16);
  ASSERT_TRUE(first.status.ok()) << first.status.error_message() << Logs();
  const std::vector<int> want = Reference("beta", Bytes(prompt, true), 16);
  EXPECT_EQ(first.ids, want);
  EXPECT_FALSE(Info("beta").replicas(0).from_host_copy());

  // gamma needs room: nothing is idle for 1.5 s yet, so it waits; then the
  // idlest model goes. beta served last, so alpha is evicted.
  Register("gamma");
  ASSERT_TRUE(WaitFor([&] { return ReadyReplicas("gamma") == 1; }, absl::Seconds(30))) << Logs();
  EXPECT_EQ(Info("alpha").state(), v1::MODEL_STATE_EVICTED);
  EXPECT_EQ(Info("alpha").replicas_size(), 0);
  EXPECT_EQ(Info("gamma").state(), v1::MODEL_STATE_READY);

  // Let beta go idle too, then ask for alpha: an idle model (beta or
  // gamma) makes room and alpha comes back; the request waited for it.
  absl::SleepFor(absl::Milliseconds(1600));
  const StreamResult again = Generate("alpha", prompt, 16);
  ASSERT_TRUE(again.status.ok()) << again.status.error_message() << Logs();
  EXPECT_EQ(again.ids, Reference("alpha", Bytes(prompt, true), 16));
  const v1::ModelInfo alpha = Info("alpha");
  EXPECT_EQ(alpha.state(), v1::MODEL_STATE_READY);
  ASSERT_EQ(alpha.replicas_size(), 1);
  EXPECT_GT(alpha.replicas(0).activation_ms(), 0);
  // Its TTFT includes the wait for the activation.
  EXPECT_GT(again.final.timings().ttft_ms(), alpha.replicas(0).activation_ms() * 0.5);
  int evicted = 0;
  for (const char* m : {"beta", "gamma"}) evicted += Info(m).state() == v1::MODEL_STATE_EVICTED;
  EXPECT_EQ(evicted, 1);

  // And beta, served again after its own eviction (if it was the one), is
  // still exact.
  const StreamResult beta = Generate("beta", prompt, 16);
  ASSERT_TRUE(beta.status.ok()) << beta.status.error_message() << Logs();
  EXPECT_EQ(beta.ids, want);
}

}  // namespace
}  // namespace ballast
