// The engine's side of checkpoint tokenizers (engine/tokenizer.h): which
// tokenizer a checkpoint gets, vocabulary checks, EOS ids (generation stops
// at any of them), BOS rules, special tokens in text, generation defaults,
// and streamed output text with and without skip_special_tokens.
#include <filesystem>
#include <fstream>

#include "engine/model_engine.h"
#include "engine/tokenizer.h"
#include "tests/unit/engine/test_util.h"
#include "tests/unit/tokenizer/golden_util.h"

namespace ballast::engine {
namespace {

namespace fs = std::filesystem;
using engine::testing::TempDir;
using nlohmann::json;

// A checkpoint directory holding `name`'s tokenizer files.
std::string CopyTokenizer(const TempDir& tmp, const std::string& name, const std::string& sub) {
  const std::string dir = tmp.sub(sub);
  fs::create_directories(dir);
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) {
    fs::copy_file(tokenizer::testing::TokenizerDir(name) + "/" + f, dir + "/" + f);
  }
  return dir;
}

void WriteJson(const std::string& path, const json& j) { std::ofstream(path) << j.dump(); }

// Rewrites keys of dir/tokenizer_config.json.
void PatchConfig(const std::string& dir, const json& patch) {
  json c = tokenizer::testing::ReadJson(dir + "/tokenizer_config.json");
  c.update(patch);
  WriteJson(dir + "/tokenizer_config.json", c);
}

std::unique_ptr<Tokenizer> Load(const std::string& dir, int vocab = 300000) {
  auto t = LoadCheckpointTokenizer(dir, vocab);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? std::move(*t) : nullptr;
}

TEST(CheckpointTokenizer, ChoosesByFilesAndChecksTheVocabulary) {
  TempDir tmp;
  const std::string llama = CopyTokenizer(tmp, "llama3", "llama");
  auto t = LoadCheckpointTokenizer(llama, 128256);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->vocab_size(), 128256);
  auto small = LoadCheckpointTokenizer(llama, 1000);
  EXPECT_EQ(small.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(small.status().message().find("tokenizer.json"), std::string::npos);
  EXPECT_NE(small.status().message().find("config.json says vocab_size 1000"), std::string::npos);

  const std::string sp = tmp.sub("sp");
  fs::create_directories(sp);
  std::ofstream(sp + "/tokenizer.model") << "not read";
  auto refused = LoadCheckpointTokenizer(sp, 32000);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(refused.status().message().find(sp + "/tokenizer.model"), std::string::npos);

  const std::string none = tmp.sub("none");
  fs::create_directories(none);
  auto bytes = LoadCheckpointTokenizer(none, 300);
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ((*bytes)->bos_id(), ByteTokenizer::kBos);
  EXPECT_EQ(LoadCheckpointTokenizer(none, 100).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CheckpointTokenizer, EosIdsComeFromEveryConfigFile) {
  TempDir tmp;
  const std::string dir = CopyTokenizer(tmp, "qwen3", "qwen");
  EXPECT_EQ(Load(dir)->eos_ids(), std::vector<int>({151645}));  // <|im_end|>
  WriteJson(dir + "/generation_config.json", {{"eos_token_id", {151645, 151643}},
                                              {"temperature", 0.6},
                                              {"top_p", 0.95},
                                              {"top_k", 20},
                                              {"do_sample", true}});
  WriteJson(dir + "/config.json", {{"eos_token_id", 151643}, {"vocab_size", 151936}});
  auto t = Load(dir);
  EXPECT_EQ(t->eos_ids(), std::vector<int>({151645, 151643}));
  EXPECT_EQ(t->eos_id(), 151645);
  EXPECT_TRUE(t->IsEos(151643));
  EXPECT_FALSE(t->IsEos(151644));
  const GenerationDefaults g = t->generation_defaults();
  EXPECT_DOUBLE_EQ(g.temperature.value_or(0), 0.6);
  EXPECT_DOUBLE_EQ(g.top_p.value_or(0), 0.95);
  EXPECT_EQ(g.top_k.value_or(0), 20);
  EXPECT_TRUE(g.do_sample.value_or(false));
  EXPECT_NE(t->chat_template().find("<|im_start|>"), std::string::npos);
}

TEST(CheckpointTokenizer, BosFollowsTheTokenizersRule) {
  TempDir tmp;
  auto gemma = Load(CopyTokenizer(tmp, "gemma3", "gemma"));
  EXPECT_TRUE(gemma->add_bos());
  EXPECT_EQ(gemma->Encode("Hi", {.add_special_tokens = true}).front(), 2);
  EXPECT_EQ(gemma->Encode("Hi").front(), 10979);  // no BOS without special tokens
  auto llama = Load(CopyTokenizer(tmp, "llama3", "llama"));
  EXPECT_FALSE(llama->add_bos());  // its post-processor adds nothing (HF agrees)
  EXPECT_EQ(llama->Encode("Hi", {.add_special_tokens = true}), llama->Encode("Hi"));
  auto qwen = Load(CopyTokenizer(tmp, "qwen3", "qwen"));
  EXPECT_FALSE(qwen->add_bos());
  EXPECT_EQ(qwen->bos_id(), -1);

  // tokenizer_config.json's add_bos_token decides, as transformers does.
  const std::string on = CopyTokenizer(tmp, "llama3", "llama_bos");
  PatchConfig(on, {{"add_bos_token", true}});
  auto llama_bos = Load(on);
  EXPECT_TRUE(llama_bos->add_bos());
  EXPECT_EQ(llama_bos->Encode("Hi", {.add_special_tokens = true}).front(), 128000);
  const std::string off = CopyTokenizer(tmp, "gemma3", "gemma_nobos");
  PatchConfig(off, {{"add_bos_token", false}});
  EXPECT_FALSE(Load(off)->add_bos());
  EXPECT_EQ(Load(off)->Encode("Hi", {.add_special_tokens = true}), std::vector<int>({10979}));
}

TEST(CheckpointTokenizer, SpecialTokensInsideText) {
  TempDir tmp;
  auto qwen = Load(CopyTokenizer(tmp, "qwen3", "qwen"));
  const std::vector<int> ids = qwen->Encode("a<|im_end|>b");
  EXPECT_EQ(ids, std::vector<int>({64, 151645, 65}));
  EXPECT_GT(qwen->Encode("a<|im_end|>b", {.parse_special = false}).size(), 3u);
  EXPECT_TRUE(qwen->IsSpecial(151645));
  EXPECT_FALSE(qwen->IsSpecial(151667));  // <think> is an added token, not special
  EXPECT_EQ(qwen->Decode(ids, true), "ab");
  EXPECT_EQ(qwen->Decode(ids, false), "a<|im_end|>b");
}

TEST(CheckpointTokenizer, StreamedTextHoldsBackPartialCharacters) {
  TempDir tmp;
  auto llama = Load(CopyTokenizer(tmp, "llama3", "llama"));
  const std::string text = "crab 🦀 and 漢字, done";
  const std::vector<int> ids = llama->Encode(text);
  StreamDecoder d(llama.get());
  std::string streamed;
  for (int id : ids) {
    const std::string piece = d.Push(id);
    EXPECT_TRUE(tokenizer::IsValidUtf8(piece)) << piece;
    streamed += piece;
  }
  streamed += d.Flush();
  EXPECT_EQ(streamed, text);

  bool stopped = false;
  OutputText keep(llama.get(), {}, /*skip_special_tokens=*/false);
  OutputText skip(llama.get(), {});
  for (int id : llama->Encode("x<|eot_id|>y")) {
    keep.Add(id, &stopped);
    skip.Add(id, &stopped);
  }
  EXPECT_EQ(keep.released() + keep.Finish(), "x<|eot_id|>y");
  EXPECT_EQ(skip.released() + skip.Finish(), "xy");
}

class Collect : public GenerationSink {
 public:
  void OnToken(int id, const std::string&, const TokenLogprobs*) override { ids.push_back(id); }
  void OnDone(absl::StatusOr<GenerationResult> r) override { result = std::move(r); }
  std::vector<int> ids;
  absl::StatusOr<GenerationResult> result = absl::UnknownError("not done");
};

std::vector<int> Generate(const std::string& dir, bool ignore_eos, FinishReason* reason) {
  ModelEngineOptions o;
  o.name = "tiny";
  o.path = dir;
  auto e = ModelEngine::Create(o);
  EXPECT_TRUE(e.ok()) << e.status();
  if (!e.ok()) return {};
  GenerationRequest r;
  r.id = "r";
  r.prompt = (*e)->tokenizer().Encode("Hello there", {.add_special_tokens = true});
  r.params.max_tokens = 6;
  r.params.ignore_eos = ignore_eos;
  r.params.sampling.temperature = 0;
  Collect sink;
  EXPECT_TRUE((*e)->Submit(r, &sink).ok());
  while ((*e)->HasWork()) (*e)->Step();
  EXPECT_TRUE(sink.result.ok()) << sink.result.status();
  if (sink.result.ok()) *reason = sink.result->reason;
  return sink.ids;
}

TEST(CheckpointTokenizer, GenerationStopsAtAnyEosId) {
  TempDir tmp;
  SyntheticModelSpec spec;
  spec.vocab = 151936;  // Qwen3's padded vocabulary
  spec.hidden = 32;
  spec.heads = 2;
  spec.kv_heads = 1;
  spec.intermediate = 64;
  spec.layers = 1;
  spec.tie_embeddings = true;
  const std::string dir = engine::testing::WriteTinyModel(tmp, "model", spec);
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) {
    fs::copy_file(tokenizer::testing::TokenizerDir("qwen3") + "/" + f, dir + "/" + f);
  }
  FinishReason reason;
  const std::vector<int> free_run = Generate(dir, true, &reason);
  ASSERT_EQ(free_run.size(), 6u);
  // Make the third greedy token a second EOS id: generation ends there.
  WriteJson(dir + "/generation_config.json", {{"eos_token_id", {151645, free_run[2]}}});
  size_t end = 0;
  while (free_run[end] != 151645 && free_run[end] != free_run[2]) ++end;
  const std::vector<int> stopped = Generate(dir, false, &reason);
  EXPECT_EQ(stopped, std::vector<int>(free_run.begin(), free_run.begin() + end + 1));
  EXPECT_EQ(reason, FinishReason::kEos);
}

}  // namespace
}  // namespace ballast::engine
