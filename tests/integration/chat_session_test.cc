// Chat turns through the whole cluster (scheduler + node processes, public
// gRPC API): GenerateRequest.messages are rendered with the model's chat
// template, a session's later turns send only their new messages (the
// server keeps the conversation and reuses the KV of the common prefix),
// and what cannot be served gets a clear status.
#include <sys/wait.h>

#include <algorithm>
#include <fstream>

#include "tests/integration/cluster_fixture.h"

namespace ballast {
namespace {

// A ChatML-like template in plain text (the synthetic models' byte
// tokenizer has no special tokens); it refuses a conversation that does not
// open with a system message, as real templates refuse bad role orders.
constexpr char kTemplate[] =
    "{% if messages[0]['role'] != 'system' %}{{ raise_exception('the first message must be the "
    "system prompt') }}{% endif %}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] "
    "}}\n{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}";

v1::ChatMessage Msg(const std::string& role, const std::string& content) {
  v1::ChatMessage m;
  m.set_role(role);
  m.set_content(content);
  return m;
}

// What kTemplate renders for `messages` with a generation prompt.
std::string Render(const std::vector<v1::ChatMessage>& messages) {
  std::string out;
  for (const auto& m : messages) out += "<|" + m.role() + "|>" + m.content() + "\n";
  return out + "<|assistant|>";
}

class ChatSessionTest : public ClusterTest {
 protected:
  void WriteTemplate(const std::string& model) {
    nlohmann::json config = {{"chat_template", kTemplate}};
    std::ofstream(Model(model) + "/tokenizer_config.json") << config.dump();
  }

  StreamResult Chat(const std::string& model, const std::vector<v1::ChatMessage>& messages,
                    int max_tokens, const std::string& session = "") {
    v1::GenerateRequest req;
    req.set_model(model);
    for (const auto& m : messages) *req.add_messages() = m;
    req.set_session_id(session);
    req.mutable_sampling()->set_max_tokens(max_tokens);
    req.mutable_sampling()->set_ignore_eos(true);
    return Run(req);
  }
};

TEST_F(ChatSessionTest, LaterTurnsSendOnlyNewMessagesAndReuseTheConversationsKv) {
  WriteTemplate("alpha");
  std::vector<v1::ChatMessage> conversation = {Msg("system", "Be brief."), Msg("user", "Hi")};
  StreamResult t1 = Chat("alpha", conversation, 10, "chat-1");
  ASSERT_TRUE(t1.status.ok()) << t1.status.error_message();
  // The template's text, tokenized without BOS (the template owns the
  // special tokens), then greedy decoding as an in-process engine does it.
  const std::vector<int> p1 = Bytes(Render(conversation), /*bos=*/false);
  EXPECT_EQ(t1.ids, Reference("alpha", p1, 10));
  EXPECT_EQ(t1.final.usage().prompt_tokens(), static_cast<int>(p1.size()));
  EXPECT_EQ(t1.final.kv_source(), v1::KV_SOURCE_NONE);

  // Turn 2 sends one message; the server renders the whole conversation,
  // the first reply included.
  conversation.push_back(Msg("assistant", t1.final.text()));
  conversation.push_back(Msg("user", "And again?"));
  StreamResult t2 = Chat("alpha", {conversation.back()}, 10, "chat-1");
  ASSERT_TRUE(t2.status.ok()) << t2.status.error_message();
  const std::vector<int> p2 = Bytes(Render(conversation), false);
  EXPECT_EQ(t2.ids, Reference("alpha", p2, 10));
  EXPECT_EQ(t2.final.usage().prompt_tokens(), static_cast<int>(p2.size()));
  EXPECT_EQ(t2.final.kv_source(), v1::KV_SOURCE_DEVICE);
  // The KV kept after turn 1 covers its prompt and reply but the last token
  // (never fed back); turn 2 reuses the part its rendering shares.
  std::vector<int> kept = p1;
  kept.insert(kept.end(), t1.ids.begin(), t1.ids.end() - 1);
  const int common = static_cast<int>(
      std::mismatch(kept.begin(), kept.end(), p2.begin(), p2.end()).first - kept.begin());
  EXPECT_GT(common, static_cast<int>(p1.size()) - 1);
  EXPECT_EQ(t2.final.usage().cached_prompt_tokens(), common);

  // A session keeps its kind: no raw prompt turn in a chat session.
  v1::GenerateRequest text;
  text.set_model("alpha");
  text.set_prompt("raw");
  text.set_session_id("chat-1");
  text.mutable_sampling()->set_max_tokens(2);
  StreamResult mixed = Run(text);
  EXPECT_EQ(mixed.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(mixed.status.error_message().find("chat session"), std::string::npos);
}

TEST_F(ChatSessionTest, WhatCannotBeRenderedGetsAClearStatus) {
  WriteTemplate("alpha");
  // The template's own raise_exception, word for word.
  StreamResult refused = Chat("alpha", {Msg("user", "no system prompt")}, 4);
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(refused.status.error_message().find("the first message must be the system prompt"),
            std::string::npos)
      << refused.status.error_message();
  // beta has no chat template.
  StreamResult none = Chat("beta", {Msg("system", "x"), Msg("user", "y")}, 4);
  EXPECT_EQ(none.status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(none.status.error_message().find("chat template"), std::string::npos);
  // Both a prompt and messages; a message without a role.
  v1::GenerateRequest both;
  both.set_model("alpha");
  both.set_prompt("p");
  *both.add_messages() = Msg("user", "m");
  both.mutable_sampling()->set_max_tokens(2);
  EXPECT_EQ(Run(both).status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  StreamResult no_role = Chat("alpha", {Msg("", "x")}, 4);
  EXPECT_EQ(no_role.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(no_role.status.error_message().find("messages[0].role"), std::string::npos);
  // max_tokens 0: until the context window (256) is full.
  StreamResult full = Chat("alpha", {Msg("system", "s"), Msg("user", "u")}, 0);
  ASSERT_TRUE(full.status.ok()) << full.status.error_message();
  EXPECT_EQ(full.final.usage().prompt_tokens() + full.final.usage().completion_tokens(), 256);
  // The server keeps serving.
  EXPECT_TRUE(Chat("alpha", {Msg("system", "s"), Msg("user", "u")}, 3).status.ok());
}

// `ballast chat` as a script would use it: two lines in, two streamed
// replies out, the second reusing the first turn's KV.
TEST_F(ChatSessionTest, TheChatCommandHoldsOneConversation) {
  WriteTemplate("alpha");
  const std::string input = (dir_ / "input.txt").string();
  std::ofstream(input) << "Hi\n\nAnd again?\n";
  const std::string cmd =
      absl::StrCat(BALLAST_BINARY_DIR, "/server/ballast chat --target ", Addr(sched_port_),
                   " --model alpha --system 'Be brief.' --max-tokens 6 --temperature 0 ",
                   "--ignore-eos --stats < ", input);
  testing::ChildProcess p({"/bin/bash", "-c", cmd}, (dir_ / "chat.log").string());
  for (int i = 0; i < 3000 && p.running(); ++i) usleep(10000);
  const int status = p.Stop(SIGKILL);
  const std::string log = p.Log();
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << log;
  // Two turns, the same numbers a gRPC client sees: turn 1 renders the
  // system prompt and "Hi"; turn 2 reuses what the two share.
  const std::vector<v1::ChatMessage> first = {Msg("system", "Be brief."), Msg("user", "Hi")};
  const std::string p1 = absl::StrCat("[prompt ", Render(first).size(), " tokens, 0 cached; 6 ");
  EXPECT_NE(log.find(p1), std::string::npos) << log;
  const size_t second = log.find("[prompt ", log.find(p1) + 1);
  ASSERT_NE(second, std::string::npos) << log;
  EXPECT_EQ(log.find(" 0 cached", second), std::string::npos) << log;
  // The session was ended on exit.
  EXPECT_EQ(State().sessions(), 0);
}

}  // namespace
}  // namespace ballast
