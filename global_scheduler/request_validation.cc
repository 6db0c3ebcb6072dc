#include "global_scheduler/request_validation.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace ballast::global_scheduler {
namespace {

absl::Status Invalid(absl::string_view field, absl::string_view rule, double got) {
  return absl::InvalidArgumentError(absl::StrCat(field, " ", rule, " (got ", got, ")"));
}

absl::Status ValidatePromptOrMessages(const v1::GenerateRequest& req) {
  if (!req.prompt().empty() && !req.messages().empty()) {
    return absl::InvalidArgumentError("give either prompt (raw text) or messages (chat), not both");
  }
  if (req.prompt().empty() && req.messages().empty()) {
    return absl::InvalidArgumentError("prompt is empty (give a prompt or chat messages)");
  }
  if (req.messages_size() > kMaxTurnMessages) {
    return absl::InvalidArgumentError(absl::StrCat("messages holds ", req.messages_size(),
                                                   " messages; at most ", kMaxTurnMessages,
                                                   " per turn"));
  }
  for (int i = 0; i < req.messages_size(); ++i) {
    if (req.messages(i).role().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("messages[", i, "].role is empty (system, user, assistant, ...)"));
    }
  }
  return absl::OkStatus();
}

// NaN passes every range comparison and infinities would poison the sampler:
// each float field must be finite before its range is checked.
absl::Status ValidateFinite(const v1::SamplingParams& s) {
  const std::pair<absl::string_view, float> fields[] = {
      {"sampling.temperature", s.temperature()},
      {"sampling.top_p", s.top_p()},
      {"sampling.min_p", s.min_p()},
      {"sampling.presence_penalty", s.presence_penalty()},
      {"sampling.frequency_penalty", s.frequency_penalty()},
      {"sampling.repetition_penalty", s.repetition_penalty()},
  };
  for (const auto& [field, value] : fields) {
    if (!std::isfinite(value)) return Invalid(field, "must be a finite number", value);
  }
  return absl::OkStatus();
}

absl::Status ValidateSampling(const v1::SamplingParams& s, int context_window) {
  if (auto st = ValidateFinite(s); !st.ok()) return st;
  if (s.max_tokens() < 0) {
    return Invalid("sampling.max_tokens", "must be >= 0 (0: until the context window is full)",
                   s.max_tokens());
  }
  if (context_window > 0 && s.max_tokens() >= context_window) {
    return absl::InvalidArgumentError(absl::StrCat("sampling.max_tokens ", s.max_tokens(),
                                                   " does not fit the context window of ",
                                                   context_window));
  }
  if (s.temperature() < 0) return Invalid("sampling.temperature", "must be >= 0", s.temperature());
  if (s.top_p() < 0 || s.top_p() > 1)
    return Invalid("sampling.top_p", "must be in [0, 1]", s.top_p());
  if (s.top_k() < 0) return Invalid("sampling.top_k", "must be >= 0", s.top_k());
  if (s.min_p() < 0 || s.min_p() > 1)
    return Invalid("sampling.min_p", "must be in [0, 1]", s.min_p());
  if (s.presence_penalty() < -2 || s.presence_penalty() > 2) {
    return Invalid("sampling.presence_penalty", "must be in [-2, 2]", s.presence_penalty());
  }
  if (s.frequency_penalty() < -2 || s.frequency_penalty() > 2) {
    return Invalid("sampling.frequency_penalty", "must be in [-2, 2]", s.frequency_penalty());
  }
  if (s.repetition_penalty() < 0 || s.repetition_penalty() > 10) {
    return Invalid("sampling.repetition_penalty", "must be in (0, 10], or 0 for off",
                   s.repetition_penalty());
  }
  if (s.top_logprobs() < 0 || s.top_logprobs() > 20) {
    return Invalid("sampling.top_logprobs", "must be in [0, 20]", s.top_logprobs());
  }
  if (s.top_logprobs() > 0 && !s.logprobs()) {
    return absl::InvalidArgumentError("sampling.top_logprobs needs sampling.logprobs = true");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateSessionId(absl::string_view session_id) {
  if (session_id.size() > kMaxSessionIdLength) {
    return absl::InvalidArgumentError(
        absl::StrCat("session_id is ", session_id.size(), " bytes; at most ", kMaxSessionIdLength));
  }
  return absl::OkStatus();
}

absl::Status ValidateTenant(absl::string_view tenant) {
  if (tenant.size() > kMaxTenantLength) {
    return absl::InvalidArgumentError(
        absl::StrCat("tenant is ", tenant.size(), " bytes; at most ", kMaxTenantLength));
  }
  return absl::OkStatus();
}

absl::Status ValidateGenerateRequest(const v1::GenerateRequest& req, int context_window) {
  if (auto st = ValidateSessionId(req.session_id()); !st.ok()) return st;
  if (auto st = ValidateTenant(req.tenant()); !st.ok()) return st;
  if (auto st = ValidatePromptOrMessages(req); !st.ok()) return st;
  return ValidateSampling(req.sampling(), context_window);
}

}  // namespace ballast::global_scheduler
