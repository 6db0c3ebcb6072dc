// Helpers shared by the ahead-step tests (CPU: ahead_step_test.cc; GPU:
// tests/gpu/cuda_ahead_test.cc): a sink that records everything, a mix of
// requests, the two ways of driving an engine, and the comparison.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/model_engine.h"
#include "gtest/gtest.h"

namespace ballast::engine::testing {

struct Collect : GenerationSink {
  void OnToken(int id, const std::string& text, const TokenLogprobs* lp) override {
    ids.push_back(id);
    streamed += text;
    if (lp != nullptr) logprobs.push_back(lp->logprob);
  }
  void OnDone(absl::StatusOr<GenerationResult> r) override {
    result = std::move(r);
    done = true;
  }
  std::vector<int> ids;
  std::string streamed;
  std::vector<float> logprobs;
  bool done = false;
  absl::StatusOr<GenerationResult> result = absl::UnknownError("not done");
};

inline std::vector<int> Prompt(int n, int salt) {
  std::vector<int> t = {ByteTokenizer::kBos};
  for (int i = 1; i < n; ++i) t.push_back(32 + (i * 31 + salt * 17) % 90);
  return t;
}

// Greedy, seeded sampling and log-probabilities; prompts longer than a
// step's budget (chunked prefill); lengths that end at different steps.
inline std::vector<GenerationRequest> Mix() {
  std::vector<GenerationRequest> out;
  for (int i = 0; i < 8; ++i) {
    GenerationRequest r;
    r.id = absl::StrCat("r", i);
    r.prompt = Prompt(i % 3 == 0 ? 90 : 7 + 5 * i, i);
    r.params.max_tokens = 6 + 3 * i;
    r.params.ignore_eos = true;
    if (i % 2 == 1) {
      r.params.sampling.temperature = 0.9f;
      r.params.sampling.top_p = 0.95f;
      r.params.seed = 100 + i;
    }
    if (i == 4) r.params.sampling.top_logprobs = 2;
    out.push_back(std::move(r));
  }
  return out;
}

// One step at a time; `at(i)` runs before step i.
inline void RunPlain(ModelEngine& e, const std::function<void(int)>& at = {}) {
  for (int i = 0; i < 100000 && e.HasWork(); ++i) {
    if (at) at(i);
    e.Step();
  }
  ASSERT_FALSE(e.HasWork());
}
// Two steps in flight whenever the engine allows; `at(i)` runs before
// the i-th finish. Returns the ahead steps begun.
inline int64_t RunAhead(ModelEngine& e, const std::function<void(int)>& at = {}) {
  for (int i = 0; i < 100000 && (e.HasWork() || e.step_in_flight()); ++i) {
    if (!e.step_in_flight()) e.BeginStep();
    while (e.CanBeginAhead() && e.BeginStep()) {
    }
    EXPECT_LE(e.steps_in_flight(), 2);
    if (at) at(i);
    e.FinishStep();
  }
  EXPECT_FALSE(e.HasWork());
  EXPECT_FALSE(e.step_in_flight());
  return e.ahead_steps();
}
inline void ExpectAllBlocksFree(const ModelEngine& e) {
  const EngineStats s = e.stats();
  EXPECT_EQ(s.kv_blocks_free, s.kv_blocks_total);
}

inline void ExpectSame(const Collect& want, const Collect& got, const std::string& id) {
  ASSERT_TRUE(want.result.ok()) << id << ": " << want.result.status();
  ASSERT_TRUE(got.result.ok()) << id << ": " << got.result.status();
  EXPECT_EQ(want.ids, got.ids) << id;
  EXPECT_EQ(want.streamed, got.streamed) << id;
  EXPECT_EQ(want.logprobs, got.logprobs) << id;
  EXPECT_EQ(want.result->output_tokens, got.result->output_tokens) << id;
  EXPECT_EQ(want.result->text, got.result->text) << id;
  EXPECT_EQ(want.result->reason, got.result->reason) << id;
}

}  // namespace ballast::engine::testing
