// Request ids: one id per client request, carried from the HTTP gateway (or
// a gRPC client) through the scheduler to the node as the gRPC metadata key
// "x-request-id", and returned to the client (HTTP header X-Request-Id, gRPC
// initial metadata x-request-id), so that one request's log lines can be
// found in every process. A client may choose it (X-Request-Id, or the
// metadata); an invalid or absent one is replaced by a new one.
//
// Thread-safety: all functions are thread-safe.
#pragma once

#include <grpcpp/grpcpp.h>

#include <string>

#include "absl/random/random.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace ballast::server {

inline constexpr char kRequestIdKey[] = "x-request-id";
inline constexpr size_t kMaxRequestIdLength = 128;

// 1 to kMaxRequestIdLength characters of [A-Za-z0-9._:-] (safe in logs,
// headers and metadata).
inline bool ValidRequestId(absl::string_view id) {
  if (id.empty() || id.size() > kMaxRequestIdLength) return false;
  for (char c : id) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != ':' &&
        c != '-') {
      return false;
    }
  }
  return true;
}

// `prefix` and 24 random hex digits.
inline std::string NewRequestId(absl::string_view prefix) {
  thread_local absl::BitGen gen;
  return absl::StrCat(prefix, absl::Hex(absl::Uniform<uint64_t>(gen), absl::kZeroPad16),
                      absl::Hex(absl::Uniform<uint32_t>(gen), absl::kZeroPad8));
}

// The caller's x-request-id if valid, else a new "req-" id.
inline std::string RequestIdOf(const grpc::ServerContextBase& ctx) {
  const auto& md = ctx.client_metadata();
  auto it = md.find(kRequestIdKey);
  if (it != md.end()) {
    absl::string_view id(it->second.data(), it->second.size());
    if (ValidRequestId(id)) return std::string(id);
  }
  return NewRequestId("req-");
}

}  // namespace ballast::server
