// Ahead steps on the GPU (ModelEngine::BeginStep while a step is in
// flight): two sampled steps queued on one stream from alternating pinned
// mirrors, the second's decode tokens copied on the device from the first's
// samples. With batch-invariant kernels (deterministic mode) every request
// gets bitwise the same tokens, texts and log-probabilities as one step at
// a time, although the steps' batches differ (a request ending on its
// pending token wastes a row of the step queued behind).
#include <map>

#include "engine/model_engine.h"
#include "gtest/gtest.h"
#include "tests/gpu/gpu_harness.h"
#include "tests/unit/engine/ahead_steps.h"
#include "tests/unit/engine/test_util.h"

namespace ballast::engine {
namespace {

using testing::Collect;

std::unique_ptr<ModelEngine> Make(const std::string& path, bool graphs) {
  ModelEngineOptions o;
  o.name = "m";
  o.path = path;
  o.backend = "cuda";
  o.deterministic = true;
  o.cuda_graphs = graphs;
  o.block_tokens = 16;
  o.max_batch_tokens = 64;  // the longer prompts prefill in chunks
  o.kv_cache_bytes = 64ll << 20;
  auto e = ModelEngine::Create(o);
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? std::move(*e) : nullptr;
}

TEST(CudaAhead, SameTokensTextsAndLogprobsAsOneStepAtATime) {
  BALLAST_SKIP_WITHOUT_GPU();
  testing::TempDir dir;
  const std::string path = testing::WriteTinyModel(dir, "m", testing::GpuTestModelSpec());
  std::vector<GenerationRequest> mix = testing::Mix();
  // One request ends on a stop string: its pending token was fed ahead.
  mix[3].params.stop = {"e"};
  for (bool graphs : {true, false}) {
    std::map<std::string, Collect> plain, ahead;
    auto submit = [&](ModelEngine& e, std::map<std::string, Collect>& sinks, int from, int to) {
      for (int i = from; i < to; ++i) ASSERT_TRUE(e.Submit(mix[i], &sinks[mix[i].id]).ok());
    };
    auto p = Make(path, graphs);
    auto a = Make(path, graphs);
    ASSERT_TRUE(p && a);
    submit(*p, plain, 0, 4);
    testing::RunPlain(*p, [&](int i) {
      if (i == 5) submit(*p, plain, 4, 8);
    });
    submit(*a, ahead, 0, 4);
    const int64_t ahead_steps = testing::RunAhead(*a, [&](int i) {
      if (i == 5) submit(*a, ahead, 4, 8);
    });
    EXPECT_GT(ahead_steps, 10) << "graphs " << graphs;
    for (const GenerationRequest& r : mix) {
      testing::ExpectSame(plain[r.id], ahead[r.id], absl::StrCat(r.id, graphs ? " graphs" : ""));
    }
    EXPECT_EQ(ahead["r4"].logprobs.size(), ahead["r4"].ids.size());
    testing::ExpectAllBlocksFree(*a);
  }
}

}  // namespace
}  // namespace ballast::engine
