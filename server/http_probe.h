// HttpProbe: one blocking HTTP GET that succeeds when the server answers
// 200, for liveness probes that must not need a gRPC port: a standby
// scheduler of a highly available pair (scheduler.state.etcd) keeps its
// gRPC ports closed until it leads, but serves /metrics from the start
// (`ballast health --metrics-url http://localhost:9400/metrics`).
//
// Plain HTTP/1.0 only (the Prometheus exposer has no TLS); Boost.Beast, as
// the gateway (server/gateway/). Only the status line and headers are
// read: the body is not needed to know the process answers.
//
// Thread-safety: ProbeHttp and ParseHttpUrl are thread-safe (each GET has
// its own I/O context).
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace ballast::server {

struct HttpUrl {
  std::string host;    // a name, an IPv4 address, or an IPv6 address without brackets
  std::string port;    // "80" when the URL names none
  std::string target;  // path and query, "/" when the URL names none
};

// Parses http://HOST[:PORT][/PATH]. INVALID_ARGUMENT, naming the URL, for
// anything else (https://, a missing host, a port outside 1..65535).
absl::StatusOr<HttpUrl> ParseHttpUrl(const std::string& url);

// GETs `url` and waits at most `timeout` for the status line and headers.
// OK when the status is 200. Every error names the URL:
//   INVALID_ARGUMENT   not an http:// URL (ParseHttpUrl)
//   UNAVAILABLE        the host does not resolve, the connection is refused,
//                      or it closes before an answer
//   DEADLINE_EXCEEDED  no answer within `timeout`
//   FAILED_PRECONDITION  an answer other than 200 (its status and reason)
absl::Status ProbeHttp(const std::string& url, absl::Duration timeout);

}  // namespace ballast::server
