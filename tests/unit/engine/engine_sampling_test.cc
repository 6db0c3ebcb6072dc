// ModelEngine with penalties and log-probabilities (engine/sampler.h): a
// request's penalty state follows its output exactly (also across
// preemption), and OnToken carries log-probabilities only when asked for.
#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "engine/model_engine.h"
#include "gtest/gtest.h"
#include "tests/unit/engine/executor_harness.h"
#include "tests/unit/engine/test_util.h"

namespace ballast::engine {
namespace {

using testing::TempDir;

class Record : public GenerationSink {
 public:
  void OnToken(int id, const std::string&, const TokenLogprobs* lp) override {
    ids.push_back(id);
    got_logprobs.push_back(lp != nullptr);
    if (lp != nullptr) logprobs.push_back(*lp);
  }
  void OnDone(absl::StatusOr<GenerationResult> r) override { result = std::move(r); }
  std::vector<int> ids;
  std::vector<bool> got_logprobs;
  std::vector<TokenLogprobs> logprobs;
  absl::StatusOr<GenerationResult> result = absl::UnknownError("not done");
};

std::vector<int> Prompt(int n, int salt) {
  std::vector<int> t = {ByteTokenizer::kBos};
  for (int i = 1; i < n; ++i) t.push_back((i * 31 + salt * 17) % 256);
  return t;
}

GenerationRequest Req(const std::string& id, std::vector<int> prompt, int max_tokens,
                      const SamplingOptions& s) {
  GenerationRequest r;
  r.id = id;
  r.prompt = std::move(prompt);
  r.params.max_tokens = max_tokens;
  r.params.ignore_eos = true;
  r.params.sampling = s;
  return r;
}

// Greedy decoding that recomputes the whole prefix every token, applying
// the penalties from its own PenaltyState; also the raw logits' logprobs.
struct Reference {
  std::vector<int> ids;
  std::vector<TokenLogprobs> logprobs;
};
Reference ReferenceDecode(const std::string& model, std::vector<int> tokens, int n,
                          const SamplingOptions& o) {
  testing::ExecutorHarness h(model, 16);
  const int V = h.config.vocab_size;
  PenaltyState pen(tokens, o.repetition_penalty != 1.0f);
  Reference out;
  for (int i = 0; i < n; ++i) {
    const std::vector<float> logits = h.PromptLogits(tokens);
    std::vector<float> row(logits.end() - V, logits.end());
    TokenLogprobs lp;
    std::vector<float> penalised = row;
    ApplyPenalties(penalised.data(), V, o, pen.entries());
    const int id =
        static_cast<int>(std::max_element(penalised.begin(), penalised.end()) - penalised.begin());
    ComputeLogprobs(row.data(), V, id, std::max(o.top_logprobs, 0), &lp);
    out.ids.push_back(id);
    out.logprobs.push_back(lp);
    pen.AddOutput(id);
    tokens.push_back(id);
  }
  return out;
}

bool HasRepeat(const std::vector<int>& ids) {
  return std::set<int>(ids.begin(), ids.end()).size() != ids.size();
}

class EngineSamplingTest : public ::testing::Test {
 protected:
  void SetUp() override { model_ = testing::WriteTinyModel(dir_, "m"); }
  std::unique_ptr<ModelEngine> Make(int64_t kv_bytes = 8 << 20) {
    ModelEngineOptions o;
    o.name = "tiny";
    o.path = model_;
    o.kv_cache_bytes = kv_bytes;
    o.max_batch_tokens = 64;
    o.block_tokens = 4;
    auto e = ModelEngine::Create(o);
    EXPECT_TRUE(e.ok()) << e.status();
    return std::move(*e);
  }
  static void Run(ModelEngine& e) {
    for (int i = 0; i < 100000 && e.HasWork(); ++i) e.Step();
    ASSERT_FALSE(e.HasWork());
  }
  TempDir dir_;
  std::string model_;
};

TEST_F(EngineSamplingTest, StrongFrequencyPenaltyNeverRepeatsAToken) {
  constexpr int kTokens = 40;
  auto e = Make();
  Record plain, penalised;
  ASSERT_TRUE(e->Submit(Req("plain", Prompt(8, 2), kTokens, {}), &plain).ok());
  SamplingOptions o;
  o.frequency_penalty = 2.0f;
  o.presence_penalty = 2.0f;
  ASSERT_TRUE(e->Submit(Req("pen", Prompt(8, 2), kTokens, o), &penalised).ok());
  Run(*e);
  ASSERT_TRUE(plain.result.ok() && penalised.result.ok()) << penalised.result.status();
  EXPECT_TRUE(HasRepeat(plain.ids)) << "the unpenalised output should loop for this test to bite";
  EXPECT_FALSE(HasRepeat(penalised.ids));
  EXPECT_EQ(penalised.ids, ReferenceDecode(model_, Prompt(8, 2), kTokens, o).ids);
}

TEST_F(EngineSamplingTest, PenaltiesSurvivePreemptionWithoutDoubleCounting) {
  // 24 blocks of 4 tokens for 4 requests of 8 + 14: some are preempted and
  // recompute; their penalty state must still describe their output alone.
  const size_t block_bytes = 2 * 4 * 2 * 16 * 4;
  auto e = Make(static_cast<int64_t>(block_bytes) * 24);
  SamplingOptions o;
  o.frequency_penalty = 0.7f;
  o.presence_penalty = 0.3f;
  o.repetition_penalty = 1.3f;
  std::vector<Record> sinks(4);
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(e->Submit(Req("p" + std::to_string(i), Prompt(8, i), 14, o), &sinks[i]).ok());
  }
  Run(*e);
  EXPECT_GT(e->stats().preemptions, 0);
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(sinks[i].result.ok()) << sinks[i].result.status();
    EXPECT_EQ(sinks[i].ids, ReferenceDecode(model_, Prompt(8, i), 14, o).ids) << "request " << i;
  }
}

TEST_F(EngineSamplingTest, OnTokenGetsLogprobsOnlyWhenAsked) {
  auto e = Make();
  SamplingOptions with;
  with.top_logprobs = 3;
  Record a, b, c;
  ASSERT_TRUE(e->Submit(Req("with", Prompt(6, 4), 6, with), &a).ok());
  ASSERT_TRUE(e->Submit(Req("without", Prompt(6, 4), 6, {}), &b).ok());
  SamplingOptions chosen_only;
  chosen_only.top_logprobs = 0;
  ASSERT_TRUE(e->Submit(Req("chosen", Prompt(6, 4), 6, chosen_only), &c).ok());
  Run(*e);
  ASSERT_TRUE(a.result.ok() && b.result.ok() && c.result.ok());
  EXPECT_EQ(a.got_logprobs, std::vector<bool>(6, true));
  EXPECT_EQ(b.got_logprobs, std::vector<bool>(6, false));
  EXPECT_EQ(c.got_logprobs, std::vector<bool>(6, true));
  const Reference ref = ReferenceDecode(model_, Prompt(6, 4), 6, with);
  ASSERT_EQ(a.ids, ref.ids);
  for (int i = 0; i < 6; ++i) {
    EXPECT_NEAR(a.logprobs[i].logprob, ref.logprobs[i].logprob, 1e-4) << i;
    EXPECT_NEAR(c.logprobs[i].logprob, ref.logprobs[i].logprob, 1e-4) << i;
    EXPECT_TRUE(c.logprobs[i].top.empty());
    ASSERT_EQ(a.logprobs[i].top.size(), 3u);
    // Greedy picks the likeliest token: the first alternative is itself.
    EXPECT_EQ(a.logprobs[i].top[0].id, a.ids[i]);
    for (int k = 0; k < 3; ++k) {
      EXPECT_EQ(a.logprobs[i].top[k].id, ref.logprobs[i].top[k].id) << i << "/" << k;
      EXPECT_NEAR(a.logprobs[i].top[k].logprob, ref.logprobs[i].top[k].logprob, 1e-4);
    }
  }
}

TEST_F(EngineSamplingTest, OutOfRangeOptionsAreRefused) {
  auto e = Make();
  Record r;
  auto bad = [&](auto set) {
    SamplingOptions o;
    set(o);
    return e->Submit(Req("bad", Prompt(4, 0), 2, o), &r).code();
  };
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  EXPECT_EQ(bad([](SamplingOptions& o) { o.min_p = 1.5f; }), kInvalid);
  EXPECT_EQ(bad([](SamplingOptions& o) { o.presence_penalty = 2.5f; }), kInvalid);
  EXPECT_EQ(bad([](SamplingOptions& o) { o.frequency_penalty = -3.0f; }), kInvalid);
  EXPECT_EQ(bad([](SamplingOptions& o) { o.repetition_penalty = 0.0f; }), kInvalid);
  EXPECT_EQ(bad([](SamplingOptions& o) { o.top_logprobs = kMaxTopLogprobs + 1; }), kInvalid);
  EXPECT_EQ(bad([](SamplingOptions& o) { o.top_logprobs = kMaxTopLogprobs; }),
            absl::StatusCode::kOk);
  Run(*e);
}

}  // namespace
}  // namespace ballast::engine
