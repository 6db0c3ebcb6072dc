// The engine's view of its node's lower KV tiers (DRAM, SSD, peers): what
// it hands down when a session's turn ends, and what it receives, as a
// lease, when a request's prompt prefix is held below the device.
//
// Export (ModelEngine, at the end of a turn with a session id): the
// sequence's computed tokens are cut into chunks of chunk_tokens() tokens
// (the last may be partial), keyed by transfer::NextKey from the model's
// root key. Chunks the tiers already hold (Contains) are not copied again;
// the others are copied out of the blocks and Put. SetSession then names
// the session's chunks, replacing its earlier list (which frees chunks no
// session names any more).
//
// Import (BatchPlanner at admission, ModelEngine before the step runs): a
// request may carry a KvPrefixLease. When it covers more of the prompt than
// the session's device cache, the step first copies the lease's chunks
// into the sequence's blocks and computes only the rest.
//
// Thread-safety: implementations are thread-safe (several engines, the
// node's RPC threads and the tiers' own writer share them).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "transfer/kv_chunk.h"

namespace ballast::engine {

enum class KvSource { kNone, kDevice, kRecomputed, kHostDram, kSsd, kPeer };

// Chunks, in order, covering prompt positions [0, tokens), pinned in host
// memory for one request.
struct KvPrefixLease {
  int tokens = 0;
  KvSource source = KvSource::kHostDram;  // the slowest tier a chunk came from
  std::vector<std::shared_ptr<const transfer::KvChunk>> chunks;
};

class KvTierPort {
 public:
  virtual ~KvTierPort() = default;
  // Tokens per chunk; a multiple of every engine's block_tokens.
  virtual int chunk_tokens() const = 0;
  virtual bool Contains(const transfer::KvChunkKey& key) const = 0;
  // A chunk for `meta` to fill and Put (pinned for DMA where the node's
  // backend copies KV with the device's copy engines).
  virtual std::unique_ptr<transfer::KvChunk> NewChunk(const transfer::KvChunkMeta& meta) = 0;
  // A new chunk (sealed: its payload checksum set). `priority`: of the
  // request that made it; lower goes first when a tier needs room.
  virtual void Put(std::unique_ptr<transfer::KvChunk> chunk, int priority) = 0;
  // The session's KV is now exactly these chunks, in order.
  virtual void SetSession(const std::string& session_id, std::vector<transfer::KvChunkKey> keys,
                          int priority) = 0;
};

}  // namespace ballast::engine
