// Byte encodings the scheduler's state stores share (SQLite and etcd): a
// session's tokens as little-endian int32s, its chat messages as
// length-delimited v1::ChatMessage protos. Decoders fail DATA_LOSS naming
// `origin` (the store) and the session.
//
// Thread-safety: pure functions.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "ballast/v1/inference.pb.h"

namespace ballast::global_scheduler {

std::string EncodeTokens(const std::vector<int>& tokens);
std::string EncodeMessages(const std::vector<v1::ChatMessage>& messages);
// Both append to *out.
absl::Status DecodeTokens(const std::string& origin, const std::string& id, const std::string& blob,
                          std::vector<int>* out);
absl::Status DecodeMessages(const std::string& origin, const std::string& id,
                            const std::string& blob, std::vector<v1::ChatMessage>* out);

}  // namespace ballast::global_scheduler
