// CRC-32C (Castagnoli), the checksum carried by every KV chunk that moves
// between tiers and peers. Pure functions; thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace ballast::transfer {

// Extends `crc` (0 for a fresh checksum) over `n` bytes at `data`.
uint32_t Crc32c(const void* data, size_t n, uint32_t crc = 0);
inline uint32_t Crc32c(std::string_view s) { return Crc32c(s.data(), s.size()); }

}  // namespace ballast::transfer
