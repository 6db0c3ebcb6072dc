// What a gRPC server does with requests it cannot parse. gRPC C++ refuses
// a proto3 `string` field that holds invalid UTF-8 while parsing the
// request, before any handler runs: the client gets INTERNAL with an empty
// message and protobuf logs an ERROR line per request. InstallRequestErrors
// routes protobuf's log lines through a rate limit: each distinct source
// line is logged at most once a minute, with a count of the lines it
// suppressed. The scheduler's Generate, where client text arrives
// (prompts, chat messages, stop strings), is a raw method parsed by
// request_parse.h: there such a request is refused INVALID_ARGUMENT naming
// the field. (A server interceptor that rewrote the status into
// INVALID_ARGUMENT raced inside gRPC 1.51 when calls of its callback-API
// services, e.g. health checks, ran the interceptor chain: ThreadSanitizer
// found the interceptor freed while another thread ran it. It is not
// installed; other methods' status stays gRPC's INTERNAL.)
//
// Thread-safety: InstallRequestErrors may be called from any thread, any
// number of times (the log handler is installed once).
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>

namespace ballast::server {

// Installs the rate-limited protobuf log handler (once per process);
// `builder` is unchanged.
void InstallRequestErrors(grpc::ServerBuilder* builder);

// Protobuf log lines written (not suppressed) since the process started.
int64_t ProtobufLogLinesWritten();

}  // namespace ballast::server
