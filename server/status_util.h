// Conversions between absl::Status (used inside Ballast) and grpc::Status
// (at the service edge). Codes map one to one; messages pass through.
#pragma once

#include <grpcpp/grpcpp.h>

#include <string>

#include "absl/status/status.h"
#include "global_scheduler/tenant_quotas.h"

namespace ballast::server {

inline grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

inline absl::Status FromGrpc(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

// The trailing metadata key of a refusal's retry hint (milliseconds).
inline constexpr char kRetryAfterMsKey[] = "retry-after-ms";

// Copies a quota refusal's retry hint (global_scheduler/tenant_quotas.h)
// into the call's trailing metadata.
inline void AddRetryHint(grpc::ServerContextBase* ctx, const absl::Status& s) {
  if (auto p = s.GetPayload(global_scheduler::kRetryAfterPayload)) {
    ctx->AddTrailingMetadata(kRetryAfterMsKey, std::string(*p));
  }
}

// "OK", "NOT_FOUND", ... as used in metric labels.
inline std::string CodeName(grpc::StatusCode code) {
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
}

}  // namespace ballast::server
