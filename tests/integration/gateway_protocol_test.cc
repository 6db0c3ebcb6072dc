// The gateway's OpenAI wire rules without sockets: request fields map onto
// GenerateRequest, unsupported values are refused naming the field, gRPC
// statuses map to OpenAI errors, and responses have OpenAI's shapes.
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "server/gateway/openai_protocol.h"

namespace ballast::server::gateway {
namespace {

using json = nlohmann::json;

// The error of a body the parser must refuse (HTTP 400).
ApiError Refused(const std::string& body, bool chat = false) {
  CompletionRequest r;
  ApiError e;
  EXPECT_FALSE(chat ? ParseChatCompletionRequest(body, &r, &e)
                    : ParseCompletionRequest(body, &r, &e))
      << body;
  EXPECT_EQ(e.http_status, 400);
  return e;
}

TEST(GatewayProtocol, MapsFieldsOntoGenerateRequest) {
  CompletionRequest r;
  ApiError e;
  ASSERT_TRUE(ParseCompletionRequest(
      R"({"model":"m","prompt":["hi"],"max_completion_tokens":5,"temperature":0.5,"top_p":0.9,)"
      R"("seed":7,"stop":["a","b"],"stream":true,"stream_options":{"include_usage":true},)"
      R"("user":"u","n":1,"logprobs":null,"presence_penalty":0,"top_k":3,"ignore_eos":true})",
      &r, &e))
      << e.message;
  EXPECT_EQ(r.generate.model(), "m");
  EXPECT_EQ(r.generate.prompt(), "hi");
  const auto& s = r.generate.sampling();
  EXPECT_EQ(s.max_tokens(), 5);
  EXPECT_FLOAT_EQ(s.temperature(), 0.5f);
  EXPECT_FLOAT_EQ(s.top_p(), 0.9f);
  EXPECT_EQ(s.seed(), 7u);
  EXPECT_EQ(s.stop_size(), 2);
  EXPECT_EQ(s.top_k(), 3);
  EXPECT_TRUE(s.ignore_eos());
  EXPECT_TRUE(r.stream && r.include_usage);
  EXPECT_FALSE(r.logprobs);

  CompletionRequest p;
  ASSERT_TRUE(ParseCompletionRequest(
      R"({"model":"m","prompt":"x","logprobs":3,"presence_penalty":0.5,"frequency_penalty":-1,)"
      R"("repetition_penalty":1.2,"min_p":0.1,"session_id":"s1","skip_special_tokens":false})",
      &p, &e))
      << e.message;
  EXPECT_TRUE(p.logprobs);
  const auto& ps = p.generate.sampling();
  EXPECT_TRUE(ps.logprobs());
  EXPECT_EQ(ps.top_logprobs(), 3);
  EXPECT_FLOAT_EQ(ps.presence_penalty(), 0.5f);
  EXPECT_FLOAT_EQ(ps.frequency_penalty(), -1.0f);
  EXPECT_FLOAT_EQ(ps.repetition_penalty(), 1.2f);
  EXPECT_FLOAT_EQ(ps.min_p(), 0.1f);
  EXPECT_FALSE(ps.skip_special_tokens());
  EXPECT_EQ(p.generate.session_id(), "s1");

  CompletionRequest d;
  ASSERT_TRUE(ParseCompletionRequest(R"({"model":"m","prompt":"x","stop":"s"})", &d, &e));
  EXPECT_EQ(d.generate.sampling().max_tokens(), 16);  // OpenAI's default
  // Unset: the model's generation_config.json defaults apply on the node.
  EXPECT_FALSE(d.generate.sampling().has_temperature());
  EXPECT_FALSE(d.generate.sampling().has_top_p());
  EXPECT_FALSE(d.generate.sampling().has_seed());
  EXPECT_EQ(d.generate.sampling().stop(0), "s");
}

TEST(GatewayProtocol, RefusesWhatItCannotHonourNamingTheField) {
  EXPECT_EQ(Refused("{not json").param, "");
  EXPECT_EQ(Refused(R"([1,2])").param, "");
  EXPECT_EQ(Refused(R"({"prompt":"x"})").param, "model");
  EXPECT_EQ(Refused(R"({"model":"m"})").param, "prompt");
  EXPECT_EQ(Refused(R"({"model":"m","prompt":[1,2]})").param, "prompt");
  EXPECT_EQ(Refused(R"({"model":"m","prompt":"x","n":2})").param, "n");
  EXPECT_EQ(Refused(R"({"model":"m","prompt":"x","logprobs":6})").param, "logprobs");
  EXPECT_EQ(Refused(R"({"model":"m","prompt":"x","top_logprobs":2})").param, "top_logprobs");
  EXPECT_EQ(Refused(R"({"model":"m","prompt":"x","presence_penalty":2.5})").param,
            "presence_penalty");
  EXPECT_EQ(Refused(R"({"model":"m","prompt":"x","logit_bias":{"1":2}})").param, "logit_bias");
  EXPECT_EQ(Refused(R"({"model":"m","prompt":"x","echo":true})").param, "echo");
  EXPECT_EQ(Refused(R"({"model":"m","prompt":"x","frobnicate":1})").param, "frobnicate");
  EXPECT_EQ(Refused(R"({"model":"m","prompt":"x","max_tokens":0})").param, "max_tokens");
  EXPECT_EQ(Refused(R"({"model":"m","prompt":"x","seed":-1})").param, "seed");
  EXPECT_EQ(Refused(R"({"model":"m","prompt":"x","stop":["a","b","c","d","e"]})").param, "stop");
  EXPECT_EQ(Refused(R"({"model":"m","prompt":"x","stream":"yes"})").param, "stream");
  EXPECT_EQ(Refused(R"({"model":"m","prompt":"x","stream_options":{"x":1}})").param,
            "stream_options.x");
}

ApiError ChatRefused(const std::string& body) { return Refused(body, /*chat=*/true); }

TEST(GatewayProtocol, ChatRequestsCarryMessages) {
  CompletionRequest r;
  ApiError e;
  ASSERT_TRUE(ParseChatCompletionRequest(
      R"({"model":"m","messages":[{"role":"system","content":"be brief"},)"
      R"({"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}],)"
      R"("logprobs":true,"top_logprobs":2,"tools":[],"tool_choice":"none",)"
      R"("response_format":{"type":"text"}})",
      &r, &e))
      << e.message;
  EXPECT_EQ(r.endpoint, Endpoint::kChatCompletions);
  ASSERT_EQ(r.generate.messages_size(), 2);
  EXPECT_EQ(r.generate.messages(0).role(), "system");
  EXPECT_EQ(r.generate.messages(1).content(), "a\nb");
  EXPECT_TRUE(r.generate.prompt().empty());
  EXPECT_EQ(r.generate.sampling().max_tokens(), 0);  // until the context window is full
  EXPECT_TRUE(r.logprobs && r.generate.sampling().logprobs());
  EXPECT_EQ(r.generate.sampling().top_logprobs(), 2);

  EXPECT_EQ(ChatRefused(R"({"model":"m"})").param, "messages");
  EXPECT_EQ(ChatRefused(R"({"model":"m","messages":[]})").param, "messages");
  EXPECT_EQ(ChatRefused(R"({"model":"m","messages":[{"content":"x"}]})").param, "messages[0]");
  EXPECT_EQ(
      ChatRefused(R"({"model":"m","messages":[{"role":"user","content":[{"type":"image_url"}]}]})")
          .param,
      "messages[0].content");
  EXPECT_EQ(
      ChatRefused(R"({"model":"m","messages":[{"role":"user","content":"x","tool_calls":[]}]})")
          .param,
      "messages[0].tool_calls");
  EXPECT_EQ(ChatRefused(R"({"model":"m","messages":[{"role":"user","content":"x"}],)"
                        R"("top_logprobs":2})")
                .param,
            "top_logprobs");
  EXPECT_EQ(ChatRefused(R"({"model":"m","messages":[{"role":"user","content":"x"}],)"
                        R"("tools":[{"type":"function"}]})")
                .param,
            "tools");
  EXPECT_EQ(
      ChatRefused(R"({"model":"m","messages":[{"role":"user","content":"x"}],"prompt":"p"})").param,
      "prompt");
}

TEST(GatewayProtocol, StatusesMapToOpenAiErrors) {
  EXPECT_EQ(FromGrpcStatus({grpc::StatusCode::NOT_FOUND, "m"}).http_status, 404);
  EXPECT_EQ(FromGrpcStatus({grpc::StatusCode::NOT_FOUND, "m"}).code, "model_not_found");
  EXPECT_EQ(FromGrpcStatus({grpc::StatusCode::INVALID_ARGUMENT, "m"}).http_status, 400);
  EXPECT_EQ(FromGrpcStatus({grpc::StatusCode::RESOURCE_EXHAUSTED, "m"}).http_status, 429);
  EXPECT_EQ(FromGrpcStatus({grpc::StatusCode::UNAVAILABLE, "m"}).http_status, 503);
  EXPECT_EQ(FromGrpcStatus({grpc::StatusCode::CANCELLED, "m"}).http_status, 503);
  EXPECT_EQ(FromGrpcStatus({grpc::StatusCode::INTERNAL, "m"}).http_status, 500);
  const json j = json::parse(ErrorJson(FromGrpcStatus({grpc::StatusCode::UNAVAILABLE, "gone"})));
  EXPECT_EQ(j["error"]["message"], "gone");
  EXPECT_TRUE(j["error"]["param"].is_null());
  EXPECT_TRUE(j["error"].contains("code"));
}

ResponseContext Ctx(Endpoint endpoint, bool logprobs = false) {
  return ResponseContext{.id = std::string("cmpl-1"),
                         .model = std::string("m"),
                         .created = 5,
                         .endpoint = endpoint,
                         .include_usage = true,
                         .logprobs = logprobs};
}

v1::Token Tok(int id, const std::string& bytes, float lp, int alternatives) {
  v1::Token t;
  t.set_id(id);
  t.set_text(bytes);
  t.set_token_bytes(bytes);
  t.set_logprob(lp);
  for (int i = 0; i < alternatives; ++i) {
    auto* a = t.add_top_logprobs();
    a->set_id(i);
    a->set_token(std::string(1, static_cast<char>('a' + i)));
    a->set_logprob(-1.0f - i);
  }
  return t;
}

TEST(GatewayProtocol, LogprobsHaveEachEndpointsShape) {
  v1::Final f;
  f.set_text("hi!");
  f.set_finish_reason(v1::FINISH_REASON_LENGTH);
  const std::vector<v1::Token> toks = {Tok(1, "hi", -0.5f, 2), Tok(2, "!", -0.25f, 2)};
  const json c = json::parse(CompletionJson(Ctx(Endpoint::kCompletions, true), f, toks));
  const json& lp = c["choices"][0]["logprobs"];
  EXPECT_EQ(lp["tokens"], json({"hi", "!"}));
  EXPECT_EQ(lp["token_logprobs"], json({-0.5, -0.25}));
  EXPECT_EQ(lp["text_offset"], json({0, 2}));
  EXPECT_EQ(lp["top_logprobs"][0]["b"], -2.0);
  const json chat = json::parse(CompletionJson(Ctx(Endpoint::kChatCompletions, true), f, toks));
  EXPECT_EQ(chat["object"], "chat.completion");
  EXPECT_EQ(chat["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(chat["choices"][0]["message"]["content"], "hi!");
  const json& content = chat["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 2u);
  EXPECT_EQ(content[0]["token"], "hi");
  EXPECT_EQ(content[0]["bytes"], json({104, 105}));
  EXPECT_EQ(content[1]["top_logprobs"][1]["token"], "b");
  // No logprobs asked: null.
  EXPECT_TRUE(
      json::parse(CompletionJson(Ctx(Endpoint::kChatCompletions), f, {}))["choices"][0]["logprobs"]
          .is_null());
}

TEST(GatewayProtocol, ChatStreamsOpenWithTheRoleAndEndWithAnEmptyDelta) {
  const ResponseContext ctx = Ctx(Endpoint::kChatCompletions);
  const json role = json::parse(StreamRoleEvent(ctx).substr(6));
  EXPECT_EQ(role["object"], "chat.completion.chunk");
  EXPECT_EQ(role["choices"][0]["delta"]["role"], "assistant");
  const json text = json::parse(StreamChunkEvent(ctx, "yo", {}, "").substr(6));
  EXPECT_EQ(text["choices"][0]["delta"]["content"], "yo");
  EXPECT_TRUE(text["choices"][0]["finish_reason"].is_null());
  const json last = json::parse(StreamChunkEvent(ctx, "", {}, "stop").substr(6));
  EXPECT_TRUE(last["choices"][0]["delta"].empty());
  EXPECT_EQ(last["choices"][0]["finish_reason"], "stop");
}

TEST(GatewayProtocol, ResponsesHaveOpenAiShapes) {
  v1::Final f;
  f.set_text("abc");
  f.set_finish_reason(v1::FINISH_REASON_EOS);
  f.mutable_usage()->set_prompt_tokens(3);
  f.mutable_usage()->set_completion_tokens(2);
  const json c = json::parse(CompletionJson(Ctx(Endpoint::kCompletions), f, {}));
  EXPECT_EQ(c["object"], "text_completion");
  EXPECT_EQ(c["choices"][0]["text"], "abc");
  EXPECT_EQ(c["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(c["usage"]["total_tokens"], 5);
  EXPECT_EQ(FinishReasonName(v1::FINISH_REASON_CONTEXT), "length");
  const std::string ev = StreamChunkEvent(Ctx(Endpoint::kCompletions), "\xff", {}, "");
  ASSERT_EQ(ev.substr(0, 6), "data: ");
  ASSERT_EQ(ev.substr(ev.size() - 2), "\n\n");
  const json chunk = json::parse(ev.substr(6));  // invalid UTF-8 replaced, not thrown
  EXPECT_TRUE(chunk["choices"][0]["finish_reason"].is_null());
  EXPECT_TRUE(chunk["usage"].is_null());
  const json usage =
      json::parse(StreamUsageEvent(Ctx(Endpoint::kCompletions), f.usage()).substr(6));
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["completion_tokens"], 2);
  v1::ListModelsResponse list;
  list.add_models()->set_name("m");
  EXPECT_EQ(json::parse(ModelsJson(list, 1))["data"][0]["id"], "m");
}

}  // namespace
}  // namespace ballast::server::gateway
