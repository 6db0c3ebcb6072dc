// KV compaction on the CUDA backend: blocks moved out of draining slabs by
// the executor's BlockMoveKernel (ModelEngine::MoveKvOutOf) between the
// steps of running generations leave every greedy token as it was without
// the move, and the drained slabs go back to the page pool.
#include <algorithm>

#include "engine/model_engine.h"
#include "memory/balloon.h"
#include "memory/gpu_page_pool.h"
#include "tests/gpu/gpu_harness.h"
#include "tests/unit/engine/test_util.h"

namespace ballast::engine {
namespace {

struct Sink : GenerationSink {
  void OnToken(int, const std::string&, const TokenLogprobs*) override {}
  void OnDone(absl::StatusOr<GenerationResult> r) override { result = std::move(r); }
  absl::StatusOr<GenerationResult> result = absl::UnknownError("not done");
};

struct Run {
  std::vector<std::vector<int>> tokens;
  int64_t moved = 0;        // bytes MoveKvOutOf moved
  int64_t slabs_freed = 0;  // formatted slabs the drain gave back
};

// Sixteen requests, half of them short, decoding together; with `drain`,
// once the short ones are done the arena drains what it can and the
// engine moves its blocks out, then the long ones run to the end.
absl::StatusOr<Run> Generate(const ModelEngineOptions& base, bool drain) {
  auto pool = memory::CreateGpuPagePool(0, 2u << 20, 1ll << 30);
  if (!pool.ok()) return pool.status();
  memory::BalloonOptions bo;
  bo.memory_bytes = 1ll << 30;
  bo.slab_bytes = 2u << 20;
  auto balloon = memory::Balloon::Create(std::move(*pool), bo);
  if (!balloon.ok()) return balloon.status();
  ModelEngineOptions o = base;
  o.kv_arena = (*balloon)->arena();
  auto e = ModelEngine::Create(o);
  if (!e.ok()) return e.status();
  std::vector<Sink> sinks(16);
  for (int i = 0; i < 16; ++i) {
    GenerationRequest req;
    req.id = std::to_string(i);
    req.prompt = {ByteTokenizer::kBos};
    for (int t = 1; t < 300 + 23 * i; ++t) req.prompt.push_back((t * 37 + i * 11) % 256);
    req.params.max_tokens = i % 2 == 0 ? 60 : 3;
    req.params.ignore_eos = true;
    if (auto st = (*e)->Submit(req, &sinks[i]); !st.ok()) return st;
  }
  Run run;
  bool drained = !drain;
  while ((*e)->HasWork()) {
    (*e)->Step();
    bool short_done = true;
    for (size_t i = 1; i < sinks.size(); i += 2) short_done = short_done && sinks[i].result.ok();
    if (drained || !short_done) continue;
    drained = true;
    memory::KvArena& arena = *(*balloon)->arena();
    arena.ReclaimFreeSlabs();
    const int64_t before = arena.stats().slabs_formatted;
    const std::vector<int64_t> slabs = arena.BeginDrain(1000);
    auto moved = (*e)->MoveKvOutOf(slabs);
    arena.EndDrain();
    if (!moved.ok()) return moved.status();
    run.moved = *moved;
    run.slabs_freed = before - arena.stats().slabs_formatted;
  }
  for (auto& s : sinks) {
    if (!s.result.ok()) return s.result.status();
    run.tokens.push_back(s.result->output_tokens);
  }
  return run;
}

TEST(CudaCompaction, MovedBlocksKeepEveryTokenExact) {
  BALLAST_SKIP_WITHOUT_GPU();
  testing::TempDir dir;
  ModelEngineOptions o;
  o.name = "m";
  o.backend = "cuda";
  o.path = testing::WriteTinyModel(dir, "m", testing::GpuTestModelSpec());
  o.max_batch_tokens = 256;
  auto want = Generate(o, /*drain=*/false);
  ASSERT_TRUE(want.ok()) << want.status();
  auto got = Generate(o, /*drain=*/true);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_GT(got->moved, 0);
  EXPECT_GT(got->slabs_freed, 0);
  EXPECT_EQ(got->tokens, want->tokens);
}

}  // namespace
}  // namespace ballast::engine
