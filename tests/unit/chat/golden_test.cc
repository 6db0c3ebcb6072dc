// The real Llama 3, Qwen3, Gemma 3 and DeepSeek-V3 chat templates render every
// conversation of tests/data/chat/conversations.json byte-identically to
// transformers' apply_chat_template (golden/<name>.json, made on the GPU host
// by make_golden.py), and refuse the same conversations with the template's
// own raise_exception message.
//
// The tokenizer configs come from scripts/fetch-test-tokenizers.sh (the ctest
// fixture chat_fetch_tokenizers runs it); the test fails when they are absent.
#include <cstdlib>
#include <filesystem>

#include "engine/chat/chat_template.h"
#include "gtest/gtest.h"
#include "tests/unit/chat/golden_util.h"

namespace ballast::chat {
namespace {

using testing::DataPath;
using testing::ReadJson;

std::string TokenizerDir(const std::string& name) {
  if (const char* env = std::getenv("BALLAST_TEST_TOKENIZERS"); env && *env) {
    return std::string(env) + "/" + name;
  }
  const char* home = std::getenv("HOME");
  return std::string(home ? home : "") + "/.cache/ballast/tokenizers/" + name;
}

ChatRequest RequestFor(const nlohmann::ordered_json& conv, bool add_generation_prompt) {
  ChatRequest r;
  r.messages = conv["messages"];
  r.add_generation_prompt = add_generation_prompt;
  if (conv.contains("tools")) r.tools = conv["tools"];
  if (conv.contains("kwargs")) r.kwargs = conv["kwargs"];
  return r;
}

// The template of `name`: from the fetched tokenizer directory, or for
// deepseek_v3 from its config committed beside the goldens.
absl::StatusOr<std::unique_ptr<ChatTemplate>> LoadTemplate(const std::string& name) {
  if (name == "deepseek_v3") {
    return ChatTemplate::FromTokenizerConfig(
        ReadJson(DataPath("deepseek_v3_tokenizer_config.json")));
  }
  const std::string dir = TokenizerDir(name);
  if (!std::filesystem::exists(dir + "/tokenizer_config.json")) {
    return absl::NotFoundError(dir +
                               "/tokenizer_config.json is missing: run "
                               "scripts/fetch-test-tokenizers.sh");
  }
  return ChatTemplate::Load(dir);
}

class ChatGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(ChatGolden, RendersLikeTransformers) {
  const std::string name = GetParam();
  auto tpl = LoadTemplate(name);
  ASSERT_TRUE(tpl.ok()) << tpl.status();
  const auto golden = ReadJson(DataPath("golden/" + name + ".json"));
  ASSERT_FALSE(golden["renders"].empty()) << "golden/" << name << ".json has no renders";
  ASSERT_EQ((*tpl)->source(), golden["chat_template"].get<std::string>())
      << "the fetched template differs from the one the goldens were made with";
  // The special tokens we put in the context are the ones transformers passed
  // (it may pass more, e.g. class defaults, which these templates do not read).
  const auto& passed = golden["info"]["template_kwargs"];
  for (const auto& [key, value] : (*tpl)->special_tokens().items()) {
    ASSERT_TRUE(passed.contains(key)) << key << " is not in transformers' template kwargs";
    std::string repr = "'";  // Python's repr of the token string
    repr += value.get<std::string>();
    repr += '\'';
    EXPECT_EQ(passed[key], repr) << key;
  }
  const auto conversations = ReadJson(DataPath("conversations.json"));
  int identical = 0, total = 0;
  for (const auto& g : golden["renders"]) {
    const auto conv = std::find_if(conversations.begin(), conversations.end(),
                                   [&](const auto& c) { return c["name"] == g["conversation"]; });
    ASSERT_NE(conv, conversations.end()) << g["conversation"];
    const bool agp = g["add_generation_prompt"].get<bool>();
    std::string why;
    ++total;
    if (testing::MatchesGolden((*tpl)->Apply(RequestFor(*conv, agp)), g, &why)) {
      ++identical;
    } else {
      ADD_FAILURE() << name << " / " << g["conversation"].get<std::string>()
                    << " add_generation_prompt=" << agp << ": " << why;
    }
  }
  std::cout << "chat golden " << name << ": " << identical << "/" << total
            << " renders match transformers\n";
}

INSTANTIATE_TEST_SUITE_P(RealTemplates, ChatGolden,
                         ::testing::Values("llama3", "qwen3", "gemma3", "deepseek_v3"));

}  // namespace
}  // namespace ballast::chat
