// The OpenAI wire format of the HTTP gateway, as pure functions: request
// JSON -> ballast.v1.GenerateRequest, and Ballast's answers (ListModels,
// Final, gRPC statuses) -> OpenAI-shaped JSON. No I/O here, so every rule
// is unit-testable.
//
// Rules (documented in README, "OpenAI-compatible gateway"):
// * Accepted fields of POST /v1/completions: model, prompt (a string, or a
//   list holding one string), max_tokens / max_completion_tokens (default
//   16), temperature (default 1), top_p, seed (>= 0), stop (string or list
//   of up to 4), stream, stream_options.include_usage, user (ignored), n (1
//   only), and the Ballast extensions top_k and ignore_eos.
// * Fields accepted only at their neutral value (anything else is HTTP 400
//   naming the field): logprobs / top_logprobs (null or 0), echo (false),
//   best_of (1), presence_penalty / frequency_penalty (0), suffix (null or
//   ""), logit_bias (null or {}).
// * Any other field is HTTP 400 naming it: a silently ignored field would
//   change results without telling the client.
//
// Thread-safety: stateless free functions; safe from any thread.
#pragma once

#include <cstdint>
#include <string>

#include <grpcpp/support/status.h>

#include "absl/status/statusor.h"
#include "ballast/v1/inference.pb.h"

namespace ballast::server::gateway {

// An OpenAI error: HTTP status plus the fields of {"error": {...}}.
struct ApiError {
  int http_status = 500;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // empty -> null
  std::string code;   // empty -> null
};

// A parsed POST /v1/completions body.
struct CompletionRequest {
  v1::GenerateRequest generate;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
};

// Parses a /v1/completions body; an error names the offending field.
// On failure returns false and fills *error (HTTP 400).
bool ParseCompletionRequest(const std::string& body, CompletionRequest* out, ApiError* error);

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

// The non-streaming /v1/completions response.
std::string CompletionJson(const std::string& id, const std::string& model, int64_t created,
                           const v1::Final& final);

// One SSE event ("data: {...}\n\n") of a streamed completion. `finish` empty
// -> null; `usage` null -> the "usage" key is omitted unless include_usage,
// in which case it is null.
std::string StreamChunkEvent(const std::string& id, const std::string& model, int64_t created,
                             const std::string& text, const std::string& finish,
                             bool include_usage);
// The usage-only last chunk (choices []) sent when include_usage is set.
std::string StreamUsageEvent(const std::string& id, const std::string& model, int64_t created,
                             const v1::Usage& usage);
// An error inside an already started stream: "data: {"error": ...}\n\n".
std::string StreamErrorEvent(const ApiError& e);
inline constexpr char kStreamDone[] = "data: [DONE]\n\n";

}  // namespace ballast::server::gateway
