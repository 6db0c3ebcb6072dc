#include "server/gateway/openai_protocol.h"

#include <set>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace ballast::server::gateway {
namespace {

using json = nlohmann::json;

// Token texts of random-weight models may hold invalid UTF-8: replace it
// rather than throw.
std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

ApiError Invalid(const std::string& param, const std::string& message) {
  ApiError e;
  e.http_status = 400;
  e.param = param;
  e.message = message;
  return e;
}

// Fields accepted only at a neutral value: true if `v` is that value.
bool IsNeutral(const std::string& key, const json& v) {
  if (v.is_null()) return true;
  if (key == "logprobs" || key == "top_logprobs") {
    return (v.is_number() && v.get<double>() == 0) || (v.is_boolean() && !v.get<bool>());
  }
  if (key == "echo") return v.is_boolean() && !v.get<bool>();
  if (key == "best_of") return v.is_number_integer() && v.get<int64_t>() == 1;
  if (key == "presence_penalty" || key == "frequency_penalty") {
    return v.is_number() && v.get<double>() == 0;
  }
  if (key == "suffix") return v.is_string() && v.get<std::string>().empty();
  if (key == "logit_bias") return v.is_object() && v.empty();
  return false;
}

bool Number(const json& body, const std::string& key, double lo, double hi, double* out,
            ApiError* error) {
  const auto it = body.find(key);
  if (it == body.end() || it->is_null()) return true;
  if (!it->is_number() || it->get<double>() < lo || it->get<double>() > hi) {
    *error = Invalid(key, absl::StrCat(key, " must be a number in [", lo, ", ", hi, "]"));
    return false;
  }
  *out = it->get<double>();
  return true;
}

bool Integer(const json& body, const std::string& key, int64_t lo, int64_t hi, int64_t* out,
             ApiError* error) {
  const auto it = body.find(key);
  if (it == body.end() || it->is_null()) return true;
  if (!it->is_number_integer() || it->get<int64_t>() < lo || it->get<int64_t>() > hi) {
    *error = Invalid(key, absl::StrCat(key, " must be an integer in [", lo, ", ", hi, "]"));
    return false;
  }
  *out = it->get<int64_t>();
  return true;
}

bool Bool(const json& body, const std::string& key, bool* out, ApiError* error) {
  const auto it = body.find(key);
  if (it == body.end() || it->is_null()) return true;
  if (!it->is_boolean()) {
    *error = Invalid(key, absl::StrCat(key, " must be a boolean"));
    return false;
  }
  *out = it->get<bool>();
  return true;
}

bool ParsePrompt(const json& body, std::string* prompt, ApiError* error) {
  const auto it = body.find("prompt");
  if (it != body.end() && it->is_array() && it->size() == 1 && (*it)[0].is_string()) {
    *prompt = (*it)[0].get<std::string>();
  } else if (it != body.end() && it->is_string()) {
    *prompt = it->get<std::string>();
  } else {
    *error = Invalid("prompt",
                     "prompt must be a string (or a list of one string); token-id prompts and "
                     "batches are not supported");
    return false;
  }
  if (prompt->empty()) {
    *error = Invalid("prompt", "prompt must not be empty");
    return false;
  }
  return true;
}

bool ParseStop(const json& body, v1::SamplingParams* s, ApiError* error) {
  const auto it = body.find("stop");
  if (it == body.end() || it->is_null()) return true;
  if (it->is_string()) {
    s->add_stop(it->get<std::string>());
    return true;
  }
  bool ok = it->is_array() && it->size() <= 4;
  for (const auto& v : ok ? *it : json::array()) ok = ok && v.is_string();
  if (!ok) {
    *error = Invalid("stop", "stop must be a string or a list of at most 4 strings");
    return false;
  }
  for (const auto& v : *it) s->add_stop(v.get<std::string>());
  return true;
}

// The fields that are checked and then need no further work here.
bool CheckPassiveFields(const json& body, CompletionRequest* out, ApiError* error) {
  static const std::set<std::string> kKnown = {
      "model", "prompt",    "max_tokens", "max_completion_tokens", "temperature", "top_p",
      "seed",  "stop",      "stream",     "stream_options",        "user",        "n",
      "top_k", "ignore_eos"};
  static const std::set<std::string> kNeutralOnly = {
      "logprobs",         "top_logprobs",      "echo",   "best_of",
      "presence_penalty", "frequency_penalty", "suffix", "logit_bias"};
  for (const auto& [key, value] : body.items()) {
    if (kNeutralOnly.count(key)) {
      if (!IsNeutral(key, value)) {
        *error = Invalid(key, absl::StrCat(key,
                                           " is not supported by Ballast yet (only its "
                                           "default value is accepted)"));
        return false;
      }
    } else if (!kKnown.count(key)) {
      *error = Invalid(key, absl::StrCat("unknown field \"", key, "\""));
      return false;
    }
  }
  int64_t n = 1;
  if (!Integer(body, "n", 1, 1, &n, error)) {
    error->message = "n: only n = 1 is supported";
    return false;
  }
  if (auto u = body.find("user"); u != body.end() && !u->is_null() && !u->is_string()) {
    *error = Invalid("user", "user must be a string");
    return false;
  }
  if (!Bool(body, "stream", &out->stream, error)) return false;
  if (auto so = body.find("stream_options"); so != body.end() && !so->is_null()) {
    if (!so->is_object()) {
      *error = Invalid("stream_options", "stream_options must be an object");
      return false;
    }
    for (const auto& [key, value] : so->items()) {
      if (key != "include_usage") {
        *error = Invalid(absl::StrCat("stream_options.", key),
                         absl::StrCat("unknown field \"stream_options.", key, "\""));
        return false;
      }
    }
    if (!Bool(*so, "include_usage", &out->include_usage, error)) return false;
  }
  return true;
}

}  // namespace

bool ParseCompletionRequest(const std::string& body, CompletionRequest* out, ApiError* error) {
  const json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    *error = Invalid("", "the request body is not a JSON object");
    return false;
  }
  if (!CheckPassiveFields(j, out, error)) return false;
  v1::GenerateRequest& g = out->generate;
  const auto model = j.find("model");
  if (model == j.end() || !model->is_string() || model->get<std::string>().empty()) {
    *error = Invalid("model", "model is required (a string; GET /v1/models lists them)");
    return false;
  }
  g.set_model(model->get<std::string>());
  if (!ParsePrompt(j, g.mutable_prompt(), error)) return false;
  v1::SamplingParams* s = g.mutable_sampling();
  int64_t max_tokens = 16, top_k = 0;
  const char* max_key =
      j.contains("max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  if (!Integer(j, max_key, 1, 1 << 20, &max_tokens, error)) return false;
  double temperature = 1, top_p = 1;
  if (!Number(j, "temperature", 0, 2, &temperature, error)) return false;
  if (!Number(j, "top_p", 0, 1, &top_p, error)) return false;
  if (!Integer(j, "top_k", 0, 1 << 20, &top_k, error)) return false;
  int64_t seed = -1;
  if (!Integer(j, "seed", 0, INT64_MAX, &seed, error)) return false;
  bool ignore_eos = false;
  if (!Bool(j, "ignore_eos", &ignore_eos, error)) return false;
  if (!ParseStop(j, s, error)) return false;
  s->set_max_tokens(static_cast<int32_t>(max_tokens));
  s->set_temperature(static_cast<float>(temperature));
  s->set_top_p(static_cast<float>(top_p));
  s->set_top_k(static_cast<int32_t>(top_k));
  if (seed >= 0) s->set_seed(static_cast<uint64_t>(seed));
  s->set_ignore_eos(ignore_eos);
  return true;
}

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
    case grpc::StatusCode::UNIMPLEMENTED:
      e.http_status = 501;
      e.type = "not_implemented";
      break;
    case grpc::StatusCode::FAILED_PRECONDITION:
      // A model whose load failed permanently: nothing the client can retry.
      e.http_status = 500;
      e.type = "server_error";
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

namespace {
json UsageJson(const v1::Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens()},
          {"completion_tokens", u.completion_tokens()},
          {"total_tokens", u.prompt_tokens() + u.completion_tokens()}};
}
json Envelope(const std::string& id, const std::string& model, int64_t created) {
  return {{"id", id}, {"object", "text_completion"}, {"created", created}, {"model", model}};
}
std::string Event(const json& j) { return absl::StrCat("data: ", Dump(j), "\n\n"); }
}  // namespace

std::string CompletionJson(const std::string& id, const std::string& model, int64_t created,
                           const v1::Final& final) {
  json j = Envelope(id, model, created);
  j["choices"] = json::array({{{"text", final.text()},
                               {"index", 0},
                               {"logprobs", nullptr},
                               {"finish_reason", FinishReasonName(final.finish_reason())}}});
  j["usage"] = UsageJson(final.usage());
  return Dump(j);
}

std::string StreamChunkEvent(const std::string& id, const std::string& model, int64_t created,
                             const std::string& text, const std::string& finish,
                             bool include_usage) {
  json j = Envelope(id, model, created);
  j["choices"] = json::array({{{"text", text},
                               {"index", 0},
                               {"logprobs", nullptr},
                               {"finish_reason", finish.empty() ? json(nullptr) : json(finish)}}});
  if (include_usage) j["usage"] = nullptr;
  return Event(j);
}

std::string StreamUsageEvent(const std::string& id, const std::string& model, int64_t created,
                             const v1::Usage& usage) {
  json j = Envelope(id, model, created);
  j["choices"] = json::array();
  j["usage"] = UsageJson(usage);
  return Event(j);
}

std::string StreamErrorEvent(const ApiError& e) {
  return absl::StrCat("data: ", ErrorJson(e), "\n\n");
}

}  // namespace ballast::server::gateway
