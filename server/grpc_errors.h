// What a gRPC server does with requests it cannot parse. gRPC C++ refuses
// a proto3 `string` field that holds invalid UTF-8 while parsing the
// request, before any handler runs: the client gets INTERNAL with an empty
// message and protobuf logs an ERROR line per request. InstallRequestErrors
// turns that status into INVALID_ARGUMENT naming the field (when protobuf
// named it on this thread) and routes protobuf's log lines through a rate
// limit: each distinct source line is logged at most once a minute, with a
// count of the lines it suppressed.
//
// Thread-safety: InstallRequestErrors may be called from any thread, any
// number of times (the log handler is installed once).
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>

namespace ballast::server {

// Adds the status-rewriting interceptor to `builder` and installs the
// rate-limited protobuf log handler.
void InstallRequestErrors(grpc::ServerBuilder* builder);

// Protobuf log lines written (not suppressed) since the process started.
int64_t ProtobufLogLinesWritten();

}  // namespace ballast::server
