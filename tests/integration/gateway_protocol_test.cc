// The gateway's OpenAI wire rules without sockets: request fields map onto
// GenerateRequest, unsupported values are refused naming the field, gRPC
// statuses map to OpenAI errors, and responses have OpenAI's shapes.
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "server/gateway/openai_protocol.h"

namespace ballast::server::gateway {
namespace {

using json = nlohmann::json;

ApiError Refused(const std::string& body) {
  CompletionRequest r;
  ApiError e;
  EXPECT_FALSE(ParseCompletionRequest(body, &r, &e)) << body;
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

  CompletionRequest d;
  ASSERT_TRUE(ParseCompletionRequest(R"({"model":"m","prompt":"x","stop":"s"})", &d, &e));
  EXPECT_EQ(d.generate.sampling().max_tokens(), 16);  // OpenAI's default
  EXPECT_FLOAT_EQ(d.generate.sampling().temperature(), 1.0f);
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
  EXPECT_EQ(Refused(R"({"model":"m","prompt":"x","logprobs":1})").param, "logprobs");
  EXPECT_EQ(Refused(R"({"model":"m","prompt":"x","top_logprobs":2})").param, "top_logprobs");
  EXPECT_EQ(Refused(R"({"model":"m","prompt":"x","presence_penalty":0.5})").param,
            "presence_penalty");
  EXPECT_EQ(Refused(R"({"model":"m","prompt":"x","echo":true})").param, "echo");
  EXPECT_EQ(Refused(R"({"model":"m","prompt":"x","frobnicate":1})").param, "frobnicate");
  EXPECT_EQ(Refused(R"({"model":"m","prompt":"x","max_tokens":0})").param, "max_tokens");
  EXPECT_EQ(Refused(R"({"model":"m","prompt":"x","seed":-1})").param, "seed");
  EXPECT_EQ(Refused(R"({"model":"m","prompt":"x","stop":["a","b","c","d","e"]})").param, "stop");
  EXPECT_EQ(Refused(R"({"model":"m","prompt":"x","stream":"yes"})").param, "stream");
  EXPECT_EQ(Refused(R"({"model":"m","prompt":"x","stream_options":{"x":1}})").param,
            "stream_options.x");
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

TEST(GatewayProtocol, ResponsesHaveOpenAiShapes) {
  v1::Final f;
  f.set_text("abc");
  f.set_finish_reason(v1::FINISH_REASON_EOS);
  f.mutable_usage()->set_prompt_tokens(3);
  f.mutable_usage()->set_completion_tokens(2);
  const json c = json::parse(CompletionJson("cmpl-1", "m", 5, f));
  EXPECT_EQ(c["object"], "text_completion");
  EXPECT_EQ(c["choices"][0]["text"], "abc");
  EXPECT_EQ(c["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(c["usage"]["total_tokens"], 5);
  EXPECT_EQ(FinishReasonName(v1::FINISH_REASON_CONTEXT), "length");
  const std::string ev = StreamChunkEvent("cmpl-1", "m", 5, "\xff", "", true);
  ASSERT_EQ(ev.substr(0, 6), "data: ");
  ASSERT_EQ(ev.substr(ev.size() - 2), "\n\n");
  const json chunk = json::parse(ev.substr(6));  // invalid UTF-8 replaced, not thrown
  EXPECT_TRUE(chunk["choices"][0]["finish_reason"].is_null());
  EXPECT_TRUE(chunk["usage"].is_null());
  const json usage = json::parse(StreamUsageEvent("cmpl-1", "m", 5, f.usage()).substr(6));
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["completion_tokens"], 2);
  v1::ListModelsResponse list;
  list.add_models()->set_name("m");
  EXPECT_EQ(json::parse(ModelsJson(list, 1))["data"][0]["id"], "m");
}

}  // namespace
}  // namespace ballast::server::gateway
