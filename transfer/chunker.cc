#include "transfer/chunker.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "transfer/checksum.h"

namespace ballast::transfer {

std::vector<Chunk> SplitIntoChunks(const void* data, size_t n, size_t chunk_bytes) {
  std::vector<Chunk> out;
  if (chunk_bytes == 0) chunk_bytes = 1;
  const auto* p = static_cast<const char*>(data);
  for (size_t off = 0; off < n; off += chunk_bytes) {
    const size_t len = std::min(chunk_bytes, n - off);
    Chunk c;
    c.offset = off;
    c.data.assign(p + off, len);
    c.crc32c = Crc32c(c.data.data(), len);
    out.push_back(std::move(c));
  }
  return out;
}

absl::Status Reassembler::Add(uint64_t offset, const std::string& data, uint32_t crc32c) {
  if (offset != buffer_.size()) {
    return absl::DataLossError(
        absl::StrCat("chunk at offset ", offset, " out of order (expected ", buffer_.size(), ")"));
  }
  if (buffer_.size() + data.size() > expected_) {
    return absl::DataLossError(
        absl::StrCat("chunk at offset ", offset, " runs past the expected ", expected_, " bytes"));
  }
  if (Crc32c(data.data(), data.size()) != crc32c) {
    return absl::DataLossError(absl::StrCat("checksum mismatch in chunk at offset ", offset));
  }
  buffer_.append(data);
  return absl::OkStatus();
}

absl::Status Reassembler::Take(std::string* out) {
  if (!complete()) {
    return absl::FailedPreconditionError(
        absl::StrCat("transfer incomplete: ", buffer_.size(), " of ", expected_, " bytes"));
  }
  *out = std::move(buffer_);
  buffer_.clear();
  return absl::OkStatus();
}

}  // namespace ballast::transfer
