// Response building of the OpenAI wire format (openai_protocol.h).
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "server/gateway/openai_protocol.h"

namespace ballast::server::gateway {
namespace {

using json = nlohmann::json;

// Token texts of random-weight models may hold invalid UTF-8: replace it
// rather than throw.
std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

json UsageJson(const v1::Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens()},
          {"completion_tokens", u.completion_tokens()},
          {"total_tokens", u.prompt_tokens() + u.completion_tokens()},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_prompt_tokens()}}}};
}

bool IsChat(const ResponseContext& ctx) { return ctx.endpoint == Endpoint::kChatCompletions; }

json Envelope(const ResponseContext& ctx, bool chunk) {
  const char* object =
      IsChat(ctx) ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion";
  return {{"id", ctx.id}, {"object", object}, {"created", ctx.created}, {"model", ctx.model}};
}

std::string Event(const json& j) { return absl::StrCat("data: ", Dump(j), "\n\n"); }

json Bytes(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(static_cast<int>(c));
  return b;
}

// Chat: {"content": [{token, logprob, bytes, top_logprobs}], "refusal": null}.
json ChatLogprobs(absl::Span<const v1::Token> tokens) {
  json content = json::array();
  for (const v1::Token& t : tokens) {
    json top = json::array();
    for (const auto& a : t.top_logprobs()) {
      top.push_back({{"token", a.token()}, {"logprob", a.logprob()}, {"bytes", Bytes(a.token())}});
    }
    content.push_back({{"token", t.token_bytes()},
                       {"logprob", t.logprob()},
                       {"bytes", Bytes(t.token_bytes())},
                       {"top_logprobs", top}});
  }
  return {{"content", content}, {"refusal", nullptr}};
}

// Completions: parallel lists; text_offset counts from `offset`, the length
// of the text before these tokens.
json CompletionLogprobs(absl::Span<const v1::Token> tokens, size_t offset) {
  json j = {{"tokens", json::array()},
            {"token_logprobs", json::array()},
            {"top_logprobs", json::array()},
            {"text_offset", json::array()}};
  for (const v1::Token& t : tokens) {
    json top = json::object();
    for (const auto& a : t.top_logprobs()) top[a.token()] = a.logprob();
    j["tokens"].push_back(t.token_bytes());
    j["token_logprobs"].push_back(t.logprob());
    j["top_logprobs"].push_back(top);
    j["text_offset"].push_back(offset);
    offset += t.token_bytes().size();
  }
  return j;
}

json Logprobs(const ResponseContext& ctx, absl::Span<const v1::Token> tokens, size_t offset) {
  if (!ctx.logprobs) return nullptr;
  return IsChat(ctx) ? ChatLogprobs(tokens) : CompletionLogprobs(tokens, offset);
}

}  // namespace

std::string ErrorJson(const ApiError& e) {
  json err = {{"message", e.message},
              {"type", e.type},
              {"param", e.param.empty() ? json(nullptr) : json(e.param)},
              {"code", e.code.empty() ? json(nullptr) : json(e.code)}};
  return Dump(json{{"error", err}});
}

ApiError FromGrpcStatus(const grpc::Status& st) {
  ApiError e;
  e.message = st.error_message();
  switch (st.error_code()) {
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::OUT_OF_RANGE:
      e.http_status = 400;
      break;
    case grpc::StatusCode::NOT_FOUND:
      e.http_status = 404;
      e.code = "model_not_found";
      e.param = "model";
      break;
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      e.http_status = 429;
      e.type = "rate_limit_error";
      e.code = "rate_limit_exceeded";
      break;
    case grpc::StatusCode::UNAVAILABLE:
      e.http_status = 503;
      e.type = "service_unavailable";
      break;
    case grpc::StatusCode::CANCELLED:
      // The gateway cancels its calls only when the client left (nothing is
      // sent then) or the server is shutting down.
      e.http_status = 503;
      e.type = "service_unavailable";
      e.message = absl::StrCat("request cancelled: the server is shutting down (", e.message, ")");
      break;
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      e.http_status = 504;
      e.type = "timeout";
      break;
    case grpc::StatusCode::UNAUTHENTICATED:  // OpenAI's codes for a bad or missing key
      e.http_status = 401;
      e.type = "invalid_request_error";
      e.code = "invalid_api_key";
      break;
    case grpc::StatusCode::PERMISSION_DENIED:
      e.http_status = 403;
      e.type = "permission_error";
      break;
    case grpc::StatusCode::UNIMPLEMENTED:
      e.http_status = 501;
      e.type = "not_implemented";
      break;
    case grpc::StatusCode::FAILED_PRECONDITION:
      // A model whose load failed, or one without a chat template: the
      // request cannot succeed until an operator acts.
      e.http_status = 400;
      e.code = "model_unavailable";
      break;
    default:
      e.http_status = 500;
      e.type = "server_error";
      break;
  }
  return e;
}

std::string ModelsJson(const v1::ListModelsResponse& models, int64_t created) {
  json data = json::array();
  for (const auto& m : models.models()) {
    data.push_back(
        {{"id", m.name()}, {"object", "model"}, {"created", created}, {"owned_by", "ballast"}});
  }
  return Dump(json{{"object", "list"}, {"data", data}});
}

std::string FinishReasonName(v1::FinishReason r) {
  return r == v1::FINISH_REASON_LENGTH || r == v1::FINISH_REASON_CONTEXT ? "length" : "stop";
}

std::string CompletionJson(const ResponseContext& ctx, const v1::Final& final,
                           absl::Span<const v1::Token> tokens) {
  json j = Envelope(ctx, false);
  json choice = {{"index", 0}};
  if (IsChat(ctx)) {
    choice["message"] = {{"role", "assistant"}, {"content", final.text()}, {"refusal", nullptr}};
  } else {
    choice["text"] = final.text();
  }
  choice["logprobs"] = Logprobs(ctx, tokens, 0);
  choice["finish_reason"] = FinishReasonName(final.finish_reason());
  j["choices"] = json::array({choice});
  j["usage"] = UsageJson(final.usage());
  return Dump(j);
}

std::string StreamChunkEvent(const ResponseContext& ctx, const std::string& text,
                             absl::Span<const v1::Token> tokens, const std::string& finish) {
  json j = Envelope(ctx, true);
  json choice = {{"index", 0}};
  if (IsChat(ctx)) {
    choice["delta"] = text.empty() && !finish.empty() ? json::object() : json{{"content", text}};
  } else {
    choice["text"] = text;
  }
  // Streamed completions' text_offset restarts in each chunk: clients read
  // the offsets of a chunk relative to it (vLLM does the same).
  choice["logprobs"] = tokens.empty() ? json(nullptr) : Logprobs(ctx, tokens, 0);
  choice["finish_reason"] = finish.empty() ? json(nullptr) : json(finish);
  j["choices"] = json::array({choice});
  if (ctx.include_usage) j["usage"] = nullptr;
  return Event(j);
}

std::string StreamRoleEvent(const ResponseContext& ctx) {
  json j = Envelope(ctx, true);
  j["choices"] = json::array({{{"index", 0},
                               {"delta", {{"role", "assistant"}, {"content", ""}}},
                               {"logprobs", nullptr},
                               {"finish_reason", nullptr}}});
  if (ctx.include_usage) j["usage"] = nullptr;
  return Event(j);
}

std::string StreamUsageEvent(const ResponseContext& ctx, const v1::Usage& usage) {
  json j = Envelope(ctx, true);
  j["choices"] = json::array();
  j["usage"] = UsageJson(usage);
  return Event(j);
}

std::string StreamErrorEvent(const ApiError& e) {
  return absl::StrCat("data: ", ErrorJson(e), "\n\n");
}

}  // namespace ballast::server::gateway
