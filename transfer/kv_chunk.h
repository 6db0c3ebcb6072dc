// KV chunks: the unit in which session KV moves below the device (DRAM,
// SSD, peers) and is deduplicated.
//
// A chunk is the KV of `num_tokens` consecutive positions starting at
// `first_token` (a multiple of the store's chunk size), for layers
// [0, num_layers), as the engine's blocks hold it: per layer,
// `blocks_per_layer` whole blocks of `block_bytes` bytes (K then V of the
// block's positions), layer after layer. A partial last block carries
// unused bytes past the chunk's tokens, which the engine overwrites.
//
// Keys (the design the tiering issue suggests): a chunk's key is a 128-bit
// XXH3 hash chained over (tenant, model fingerprint, every token up to the
// chunk's end):
//     key(-1)  = XXH3-128("ballast-kv/1" | tenant | model_fp)   (RootKey)
//     key(i)   = XXH3-128(key(i-1) | tokens of chunk i)          (NextKey)
// so equal keys mean equal KV (same weights and layout, same tokens, same
// tenant), a system prompt shared by many sessions is one set of chunks,
// and nothing is ever shared across tenants (the tenant is hashed in).
//
// Integrity: the payload checksum is computed when the chunk is made and
// verified on every read below the device (VerifyPayload, DecodeChunk). It
// is the XXH3-64 of the layers' XXH3-64s (LayerChecksum, CombineChecksums),
// so a reader can verify the layers of a chunk in parallel. The
// serialized form also checksums its header, so a file describes itself
// (key, tenant, model, token and layer range, checksum) and a restarted
// node can rebuild its index from the headers alone (DecodeHeader).
//
// Thread-safety: plain data and pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace ballast::transfer {

struct KvChunkKey {
  uint64_t hi = 0, lo = 0;
  bool operator==(const KvChunkKey& o) const { return hi == o.hi && lo == o.lo; }
  bool operator!=(const KvChunkKey& o) const { return !(*this == o); }
  bool operator<(const KvChunkKey& o) const { return hi != o.hi ? hi < o.hi : lo < o.lo; }
  template <typename H>
  friend H AbslHashValue(H h, const KvChunkKey& k) {
    return H::combine(std::move(h), k.hi, k.lo);
  }
  // 32 hex digits (file names, logs).
  std::string Hex() const;
};

// The key before a sequence's first chunk.
KvChunkKey RootKey(std::string_view tenant, uint64_t model_fingerprint);
// The key of the chunk holding `tokens` after the chunk keyed `parent`.
KvChunkKey NextKey(const KvChunkKey& parent, absl::Span<const int> tokens);

struct KvChunkMeta {
  KvChunkKey key;
  KvChunkKey parent;  // the previous chunk's key (RootKey for the first)
  std::string tenant;
  uint64_t model_fingerprint = 0;
  uint32_t first_token = 0;
  uint32_t num_tokens = 0;
  uint32_t num_layers = 0;
  uint32_t blocks_per_layer = 0;
  uint64_t block_bytes = 0;
  uint64_t payload_checksum = 0;  // CombineChecksums of the layers' LayerChecksum

  uint64_t payload_bytes() const {
    return static_cast<uint64_t>(num_layers) * blocks_per_layer * block_bytes;
  }
  uint32_t end_token() const { return first_token + num_tokens; }
};

// Frees a payload: page-aligned malloc memory, or, with `recycle` set,
// hands it back to the PinnedBufferPool it came from.
struct PayloadFree {
  std::function<void(uint8_t*)> recycle;
  void operator()(uint8_t* p) const;
};

// A chunk in host memory. The payload is page-aligned (so it can be pinned
// for DMA, and written with O_DIRECT), its buffer is a whole number of
// pages, and it is not zero-initialised on creation.
struct KvChunk {
  KvChunkMeta meta;
  std::unique_ptr<uint8_t[], PayloadFree> payload;  // meta.payload_bytes() bytes
  // Keeps the payload pinned for DMA while set (its deleter unpins);
  // declared after `payload`, so it is released first. Null for payloads
  // from a PinnedBufferPool, pinned for as long as the pool keeps them.
  std::shared_ptr<void> pin;

  // A chunk with room for the payload `meta` describes (checksum unset).
  static std::unique_ptr<KvChunk> Allocate(const KvChunkMeta& meta);
  // Sets meta.payload_checksum from the payload (after filling it).
  void Seal();
  // DATA_LOSS (naming the key) unless the payload matches its checksum.
  absl::Status VerifyPayload() const;
  uint8_t* layer_data(uint32_t layer) {
    return payload.get() + static_cast<size_t>(layer) * meta.blocks_per_layer * meta.block_bytes;
  }
  const uint8_t* layer_data(uint32_t layer) const {
    return payload.get() + static_cast<size_t>(layer) * meta.blocks_per_layer * meta.block_bytes;
  }
};

// XXH3-64 of one layer's bytes of `chunk`.
uint64_t LayerChecksum(const KvChunk& chunk, uint32_t layer);
// The payload checksum from the layers' checksums, in layer order.
uint64_t CombineChecksums(absl::Span<const uint64_t> layer_checksums);

// Bytes of a serialized header for a tenant of `tenant_bytes` bytes.
size_t EncodedHeaderBytes(size_t tenant_bytes);
// Longest header DecodeHeader accepts (tenant names are at most 256 bytes).
inline constexpr size_t kMaxEncodedHeaderBytes = 512;

// Header then payload: what an SSD file and a peer transfer carry.
std::string EncodeHeader(const KvChunkMeta& meta);
// Parses and checks a header at the start of `bytes` (DATA_LOSS for a bad
// magic, version or header checksum; OUT_OF_RANGE if `bytes` is shorter
// than the header). `*header_bytes` gets its length.
absl::StatusOr<KvChunkMeta> DecodeHeader(std::string_view bytes, size_t* header_bytes);
// Parses a whole serialized chunk and verifies both checksums and the
// length (DATA_LOSS naming what is wrong: truncated, corrupt).
absl::StatusOr<std::unique_ptr<KvChunk>> DecodeChunk(std::string_view bytes);

}  // namespace ballast::transfer
