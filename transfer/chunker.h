// Splitting a byte range into checksummed chunks and reassembling them, the
// framing used by peer KV fetches (node.proto's KvChunk) and tier copies.
//
// Reassembler rejects out-of-order, overlapping, oversized or corrupt
// chunks with DATA_LOSS naming the offset, so a damaged transfer is
// detected and the KV recomputed, never used.
// Thread-compatible (one reassembler per transfer).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace ballast::transfer {

struct Chunk {
  uint64_t offset = 0;
  std::string data;
  uint32_t crc32c = 0;
};

// Splits `n` bytes at `data` into chunks of at most `chunk_bytes` (> 0).
std::vector<Chunk> SplitIntoChunks(const void* data, size_t n, size_t chunk_bytes);

class Reassembler {
 public:
  explicit Reassembler(uint64_t expected_bytes) : expected_(expected_bytes) {}
  // Appends one chunk; chunks must arrive in order.
  absl::Status Add(uint64_t offset, const std::string& data, uint32_t crc32c);
  bool complete() const { return buffer_.size() == expected_; }
  // The reassembled bytes; FAILED_PRECONDITION unless complete().
  absl::Status Take(std::string* out);

 private:
  uint64_t expected_;
  std::string buffer_;
};

}  // namespace ballast::transfer
