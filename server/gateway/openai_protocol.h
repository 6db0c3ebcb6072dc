// The OpenAI wire format of the HTTP gateway, as pure functions: request
// JSON -> ballast.v1.GenerateRequest, and Ballast's answers (ListModels,
// tokens, Final, gRPC statuses) -> OpenAI-shaped JSON. No I/O here, so every
// rule is unit-testable. Requests are parsed in openai_request.cc,
// responses built in openai_response.cc.
//
// Rules (documented in README, "OpenAI-compatible gateway"):
// * Both endpoints accept: model, max_tokens / max_completion_tokens,
//   temperature (default 1), top_p, seed (>= 0), stop (string or list of up
//   to 4), stream, stream_options.include_usage, presence_penalty /
//   frequency_penalty ([-2, 2]), user (ignored), n (1 only), and the
//   Ballast extensions top_k, min_p, repetition_penalty, ignore_eos,
//   skip_special_tokens and session_id (a multi-turn session kept by the
//   server: later requests send only the new prompt text or messages).
// * POST /v1/completions: prompt (a string, or a list holding one string);
//   max_tokens defaults to 16; logprobs is an integer in [0, 5] (that many
//   alternatives per token); echo (false), best_of (1), suffix (null or "")
//   and logit_bias (null or {}) only at their neutral values.
// * POST /v1/chat/completions: messages (role + content, a string or a list
//   of {"type": "text"} parts, joined with "\n"), rendered with the model's
//   chat template; max_tokens defaults to "until the context window is
//   full"; logprobs (bool) and top_logprobs ([0, 20]); logit_bias,
//   tools (null or []), tool_choice (null or "none"), response_format
//   ({"type": "text"}) and parallel_tool_calls only at their neutral values.
// * Any other field, or a neutral-only field at another value, is HTTP 400
//   naming it: a silently ignored field would change results without
//   telling the client.
//
// Thread-safety: stateless free functions; safe from any thread.
#pragma once

#include <cstdint>
#include <string>

#include <grpcpp/support/status.h>

#include "absl/types/span.h"
#include "ballast/v1/inference.pb.h"

namespace ballast::server::gateway {

// An OpenAI error: HTTP status plus the fields of {"error": {...}}.
struct ApiError {
  int http_status = 500;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // empty -> null
  std::string code;   // empty -> null
  // A quota refusal's retry hint (the scheduler's retry-after-ms trailing
  // metadata), sent as Retry-After and retry-after-ms headers; -1: none.
  int64_t retry_after_ms = -1;
};

enum class Endpoint { kCompletions, kChatCompletions };

// A parsed POST /v1/completions or /v1/chat/completions body.
struct CompletionRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  v1::GenerateRequest generate;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  // Whether the response carries log-probabilities (the alternatives per
  // token are generate.sampling().top_logprobs()).
  bool logprobs = false;
};

// Parse a body; an error names the offending field. On failure they return
// false and fill *error (HTTP 400).
bool ParseCompletionRequest(const std::string& body, CompletionRequest* out, ApiError* error);
bool ParseChatCompletionRequest(const std::string& body, CompletionRequest* out, ApiError* error);

// {"error": {...}} as a JSON string.
std::string ErrorJson(const ApiError& e);

// Maps a gRPC status of Generate/ListModels to an OpenAI error (404 for
// NOT_FOUND, 429 for RESOURCE_EXHAUSTED, 503 for UNAVAILABLE and for
// CANCELLED, which only shutdown produces, ...).
ApiError FromGrpcStatus(const grpc::Status& st);

// GET /v1/models body.
std::string ModelsJson(const v1::ListModelsResponse& models, int64_t created);

// "stop" or "length", from Ballast's finish reason.
std::string FinishReasonName(v1::FinishReason r);

// What every response of one request shares.
struct ResponseContext {
  std::string id;  // "cmpl-..." or "chatcmpl-..."
  std::string model;
  int64_t created = 0;
  Endpoint endpoint = Endpoint::kCompletions;
  bool include_usage = false;  // streams: "usage": null in chunks, a usage chunk last
  bool logprobs = false;
};

// The non-streaming response. `tokens` are the generated tokens (their
// logprob fields are read when ctx.logprobs).
std::string CompletionJson(const ResponseContext& ctx, const v1::Final& final,
                           absl::Span<const v1::Token> tokens);

// One SSE event ("data: {...}\n\n") of a streamed response carrying `text`
// and the log-probabilities of `tokens` (the tokens since the last event).
// `finish` empty -> null.
std::string StreamChunkEvent(const ResponseContext& ctx, const std::string& text,
                             absl::Span<const v1::Token> tokens, const std::string& finish);
// Chat streams open with a chunk whose delta is {"role": "assistant",
// "content": ""}.
std::string StreamRoleEvent(const ResponseContext& ctx);
// The usage-only last chunk (choices []) sent when include_usage is set.
std::string StreamUsageEvent(const ResponseContext& ctx, const v1::Usage& usage);
// An error inside an already started stream: "data: {"error": ...}\n\n".
std::string StreamErrorEvent(const ApiError& e);
inline constexpr char kStreamDone[] = "data: [DONE]\n\n";

}  // namespace ballast::server::gateway
