// Request parsing of the OpenAI wire format (openai_protocol.h).
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "server/gateway/openai_protocol.h"

namespace ballast::server::gateway {
namespace {

using json = nlohmann::json;
using Names = std::set<std::string>;

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
  if (key == "echo") return v.is_boolean() && !v.get<bool>();
  if (key == "best_of") return v.is_number_integer() && v.get<int64_t>() == 1;
  if (key == "suffix") return v.is_string() && v.get<std::string>().empty();
  if (key == "logit_bias") return v.is_object() && v.empty();
  if (key == "tools") return v.is_array() && v.empty();
  if (key == "tool_choice") return v == "none";
  if (key == "parallel_tool_calls") return v.is_boolean();
  if (key == "response_format")
    return v.is_object() && v.size() == 1 && v.value("type", "") == "text";
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

bool String(const json& body, const std::string& key, std::string* out, ApiError* error) {
  const auto it = body.find(key);
  if (it == body.end() || it->is_null()) return true;
  if (!it->is_string()) {
    *error = Invalid(key, absl::StrCat(key, " must be a string"));
    return false;
  }
  *out = it->get<std::string>();
  return true;
}

// Unknown fields and neutral-only fields at another value are refused.
bool CheckFields(const json& body, const Names& known, const Names& neutral_only, ApiError* error) {
  for (const auto& [key, value] : body.items()) {
    if (neutral_only.count(key)) {
      if (!IsNeutral(key, value)) {
        *error = Invalid(key, absl::StrCat(key,
                                           " is not supported by Ballast yet (only its "
                                           "default value is accepted)"));
        return false;
      }
    } else if (!known.count(key)) {
      *error = Invalid(key, absl::StrCat("unknown field \"", key, "\""));
      return false;
    }
  }
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

// A message's content: a string, or text parts joined with "\n".
bool MessageContent(const json& content, const std::string& where, std::string* out,
                    ApiError* error) {
  if (content.is_string()) {
    *out = content.get<std::string>();
    return true;
  }
  if (content.is_null()) return true;  // e.g. an assistant turn that only called tools
  std::vector<std::string> parts;
  bool ok = content.is_array();
  for (const auto& p : ok ? content : json::array()) {
    ok = ok && p.is_object() && p.value("type", "") == "text" && p.contains("text") &&
         p["text"].is_string();
    if (ok) parts.push_back(p["text"].get<std::string>());
  }
  if (!ok) {
    *error =
        Invalid(where, absl::StrCat(where,
                                    " must be a string or a list of {\"type\": \"text\", \"text\": "
                                    "...} parts (images, audio and files are not supported)"));
    return false;
  }
  *out = absl::StrJoin(parts, "\n");
  return true;
}

bool ParseMessages(const json& body, v1::GenerateRequest* g, ApiError* error) {
  const auto it = body.find("messages");
  if (it == body.end() || !it->is_array() || it->empty()) {
    *error = Invalid("messages", "messages must be a non-empty list of {role, content}");
    return false;
  }
  for (size_t i = 0; i < it->size(); ++i) {
    const json& m = (*it)[i];
    const std::string where = absl::StrCat("messages[", i, "]");
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string() ||
        m["role"].get<std::string>().empty()) {
      *error = Invalid(where, absl::StrCat(where, " must be an object with a string role"));
      return false;
    }
    for (const auto& [key, value] : m.items()) {
      if (key != "role" && key != "content" && !(key == "name" && value.is_null())) {
        *error = Invalid(absl::StrCat(where, ".", key),
                         absl::StrCat(where, ".", key, " is not supported (role and content are)"));
        return false;
      }
    }
    v1::ChatMessage* out = g->add_messages();
    out->set_role(m["role"].get<std::string>());
    if (m.contains("content") &&
        !MessageContent(m["content"], where + ".content", out->mutable_content(), error)) {
      return false;
    }
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

// n, user, stream and stream_options.
bool ParseEnvelope(const json& body, CompletionRequest* out, ApiError* error) {
  int64_t n = 1;
  if (!Integer(body, "n", 1, 1, &n, error)) {
    error->message = "n: only n = 1 is supported";
    return false;
  }
  std::string user;
  if (!String(body, "user", &user, error)) return false;
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

// The sampling fields both endpoints share, the model and session_id.
bool ParseCommon(const json& j, int64_t default_max_tokens, CompletionRequest* out,
                 ApiError* error) {
  if (!ParseEnvelope(j, out, error)) return false;
  v1::GenerateRequest& g = out->generate;
  const auto model = j.find("model");
  if (model == j.end() || !model->is_string() || model->get<std::string>().empty()) {
    *error = Invalid("model", "model is required (a string; GET /v1/models lists them)");
    return false;
  }
  g.set_model(model->get<std::string>());
  g.set_token_batches(true);  // a stream that falls behind catches up in fewer chunks
  if (!String(j, "session_id", g.mutable_session_id(), error)) return false;
  v1::SamplingParams* s = g.mutable_sampling();
  int64_t max_tokens = default_max_tokens, top_k = 0, seed = -1;
  const char* max_key =
      j.contains("max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  double temperature = 1, top_p = 1, min_p = 0, presence = 0, frequency = 0, repetition = 1;
  bool ignore_eos = false, skip_special = true;
  if (!Integer(j, max_key, 1, 1 << 24, &max_tokens, error) ||
      !Number(j, "temperature", 0, 2, &temperature, error) ||
      !Number(j, "top_p", 0, 1, &top_p, error) || !Integer(j, "top_k", 0, 1 << 24, &top_k, error) ||
      !Number(j, "min_p", 0, 1, &min_p, error) ||
      !Number(j, "presence_penalty", -2, 2, &presence, error) ||
      !Number(j, "frequency_penalty", -2, 2, &frequency, error) ||
      !Number(j, "repetition_penalty", 0.01, 10, &repetition, error) ||
      !Integer(j, "seed", 0, INT64_MAX, &seed, error) ||
      !Bool(j, "ignore_eos", &ignore_eos, error) ||
      !Bool(j, "skip_special_tokens", &skip_special, error) || !ParseStop(j, s, error)) {
    return false;
  }
  s->set_max_tokens(static_cast<int32_t>(max_tokens));
  // Absent temperature, top_p and top_k stay unset: the model's
  // generation_config.json defaults apply (SamplingParams).
  if (j.contains("temperature") && !j["temperature"].is_null()) {
    s->set_temperature(static_cast<float>(temperature));
  }
  if (j.contains("top_p") && !j["top_p"].is_null()) s->set_top_p(static_cast<float>(top_p));
  if (j.contains("top_k") && !j["top_k"].is_null()) s->set_top_k(static_cast<int32_t>(top_k));
  s->set_min_p(static_cast<float>(min_p));
  s->set_presence_penalty(static_cast<float>(presence));
  s->set_frequency_penalty(static_cast<float>(frequency));
  s->set_repetition_penalty(static_cast<float>(repetition));
  if (seed >= 0) s->set_seed(static_cast<uint64_t>(seed));
  s->set_ignore_eos(ignore_eos);
  if (!skip_special) s->set_skip_special_tokens(false);
  return true;
}

json ParseBody(const std::string& body, ApiError* error) {
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    *error = Invalid("", "the request body is not a JSON object");
    return json();
  }
  return j;
}

const Names kCommon = {"model",
                       "max_tokens",
                       "max_completion_tokens",
                       "temperature",
                       "top_p",
                       "seed",
                       "stop",
                       "stream",
                       "stream_options",
                       "user",
                       "n",
                       "presence_penalty",
                       "frequency_penalty",
                       "top_k",
                       "min_p",
                       "repetition_penalty",
                       "ignore_eos",
                       "skip_special_tokens",
                       "session_id"};

Names With(Names base, std::initializer_list<const char*> more) {
  for (const char* m : more) base.insert(m);
  return base;
}

}  // namespace

bool ParseCompletionRequest(const std::string& body, CompletionRequest* out, ApiError* error) {
  static const Names kKnown = With(kCommon, {"prompt", "logprobs"});
  static const Names kNeutral = {"echo", "best_of", "suffix", "logit_bias"};
  out->endpoint = Endpoint::kCompletions;
  const json j = ParseBody(body, error);
  if (!j.is_object() || !CheckFields(j, kKnown, kNeutral, error)) return false;
  if (!ParseCommon(j, 16, out, error)) return false;  // OpenAI's default max_tokens
  if (!ParsePrompt(j, out->generate.mutable_prompt(), error)) return false;
  int64_t logprobs = -1;
  if (!Integer(j, "logprobs", 0, 5, &logprobs, error)) return false;
  if (logprobs >= 0) {
    out->logprobs = true;
    out->generate.mutable_sampling()->set_logprobs(true);
    out->generate.mutable_sampling()->set_top_logprobs(static_cast<int32_t>(logprobs));
  }
  return true;
}

bool ParseChatCompletionRequest(const std::string& body, CompletionRequest* out, ApiError* error) {
  static const Names kKnown = With(kCommon, {"messages", "logprobs", "top_logprobs"});
  static const Names kNeutral = {"logit_bias", "tools", "tool_choice", "response_format",
                                 "parallel_tool_calls"};
  out->endpoint = Endpoint::kChatCompletions;
  const json j = ParseBody(body, error);
  if (!j.is_object() || !CheckFields(j, kKnown, kNeutral, error)) return false;
  // No max_tokens: until the context window is full (SamplingParams 0).
  if (!ParseCommon(j, 0, out, error)) return false;
  if (!ParseMessages(j, &out->generate, error)) return false;
  int64_t top = -1;
  if (!Bool(j, "logprobs", &out->logprobs, error) ||
      !Integer(j, "top_logprobs", 0, 20, &top, error)) {
    return false;
  }
  if (top >= 0 && !out->logprobs) {
    *error = Invalid("top_logprobs", "top_logprobs needs logprobs: true");
    return false;
  }
  out->generate.mutable_sampling()->set_logprobs(out->logprobs);
  out->generate.mutable_sampling()->set_top_logprobs(
      static_cast<int32_t>(std::max<int64_t>(top, 0)));
  return true;
}

}  // namespace ballast::server::gateway
