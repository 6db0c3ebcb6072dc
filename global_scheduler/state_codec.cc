#include "global_scheduler/state_codec.h"

#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/util/delimited_message_util.h"

namespace ballast::global_scheduler {

std::string EncodeTokens(const std::vector<int>& tokens) {
  std::string out(tokens.size() * 4, '\0');
  for (size_t i = 0; i < tokens.size(); ++i) {
    const auto v = static_cast<uint32_t>(tokens[i]);
    for (int b = 0; b < 4; ++b) out[i * 4 + b] = static_cast<char>((v >> (8 * b)) & 0xff);
  }
  return out;
}

std::string EncodeMessages(const std::vector<v1::ChatMessage>& messages) {
  std::string out;
  google::protobuf::io::StringOutputStream stream(&out);
  for (const auto& m : messages) {
    google::protobuf::util::SerializeDelimitedToZeroCopyStream(m, &stream);
  }
  return out;
}

absl::Status DecodeTokens(const std::string& origin, const std::string& id, const std::string& blob,
                          std::vector<int>* out) {
  if (blob.size() % 4 != 0) {
    return absl::DataLossError(absl::StrCat("state store ", origin, ": session ", id,
                                            ": tokens: ", blob.size(),
                                            " bytes is not a whole number of int32 tokens"));
  }
  out->reserve(out->size() + blob.size() / 4);  // appended: a session's turns in order
  for (size_t i = 0; i < blob.size() / 4; ++i) {
    uint32_t v = 0;
    for (int b = 0; b < 4; ++b) v |= uint32_t{static_cast<uint8_t>(blob[i * 4 + b])} << (8 * b);
    out->push_back(static_cast<int>(v));
  }
  return absl::OkStatus();
}

absl::Status DecodeMessages(const std::string& origin, const std::string& id,
                            const std::string& blob, std::vector<v1::ChatMessage>* out) {
  google::protobuf::io::ArrayInputStream stream(blob.data(), static_cast<int>(blob.size()));
  while (stream.ByteCount() < static_cast<int64_t>(blob.size())) {
    v1::ChatMessage m;
    bool clean_eof = false;
    if (!google::protobuf::util::ParseDelimitedFromZeroCopyStream(&m, &stream, &clean_eof)) {
      return absl::DataLossError(absl::StrCat("state store ", origin, ": session ", id,
                                              ": messages: message ", out->size() + 1,
                                              " cannot be parsed"));
    }
    out->push_back(std::move(m));
  }
  return absl::OkStatus();
}

}  // namespace ballast::global_scheduler
