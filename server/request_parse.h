// Requests received as raw bytes (a raw callback method) and parsed here,
// so that a request gRPC's protobuf codec would refuse with INTERNAL and an
// empty message — a proto3 `string` field holding invalid UTF-8 — is
// refused INVALID_ARGUMENT with the field's path instead.
//
// Thread-safety: pure functions.
#pragma once

#include <grpcpp/support/byte_buffer.h>

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"

namespace ballast::server {

// Parses `buffer` into `msg`. INVALID_ARGUMENT naming the field
// ("GenerateRequest.messages[1].content: not valid UTF-8 ...") or saying
// the bytes are not a `msg` at all.
absl::Status ParseRequest(const grpc::ByteBuffer& buffer, google::protobuf::Message* msg);

// The path of the first string field of `bytes` (a serialized `type`) that
// is not valid UTF-8, e.g. "messages[1].content"; "" if there is none (or
// the bytes are not well-formed).
std::string FirstInvalidUtf8Field(std::string_view bytes, const google::protobuf::Descriptor* type);

}  // namespace ballast::server
