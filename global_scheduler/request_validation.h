// The scheduler's checks of an Inference.Generate request, before it is
// routed: what a client can get wrong, each with a message naming the field
// and its allowed range. Nodes trust requests that passed.
//
// Thread-safety: a pure function.
#pragma once

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "ballast/v1/inference.pb.h"

namespace ballast::global_scheduler {

// Most chat messages one turn may carry.
inline constexpr int kMaxTurnMessages = 4096;

// Longest session_id, in bytes.
inline constexpr size_t kMaxSessionIdLength = 128;

// OK, or INVALID_ARGUMENT if `session_id` is longer than kMaxSessionIdLength.
absl::Status ValidateSessionId(absl::string_view session_id);

// Longest tenant name, in bytes.
inline constexpr size_t kMaxTenantLength = 128;
// OK, or INVALID_ARGUMENT if `tenant` is longer than kMaxTenantLength.
absl::Status ValidateTenant(absl::string_view tenant);

// OK, or INVALID_ARGUMENT: session_id and tenant within their limits; exactly one of prompt and
// messages; every message with a role; sampling.max_tokens in [0, context_window) (0: until the
// window is full; context_window 0: no window known); every float field finite;
// temperature >= 0; top_p and min_p in [0, 1];
// top_k >= 0; presence/frequency penalties in [-2, 2]; repetition_penalty 0 (off) or in (0, 10];
// top_logprobs in [0, 20] and only with logprobs.
absl::Status ValidateGenerateRequest(const v1::GenerateRequest& req, int context_window);

}  // namespace ballast::global_scheduler
