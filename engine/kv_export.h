// Moving a sequence's KV between its device blocks and host chunks
// (engine/kv_tiers.h): export at the end of a session's turn, load of a
// lease at admission. The chunk layout is transfer/kv_chunk.h's.
//
// Thread-safety: functions run on the engine's step thread (they use its
// executor and read its block tables).
#pragma once

#include <cstdint>
#include <limits>
#include <string>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "engine/executor.h"
#include "engine/kv_cache.h"
#include "engine/kv_tiers.h"
#include "engine/model_config.h"

namespace ballast::engine {

// The fingerprint chunk keys use: the model's weights and config
// (`model_fingerprint`), how its linear layers compute (`quant`: fp8
// weights make other KV) and everything that shapes the KV bytes. kNone
// hashes what it hashed before the field existed, so stored chunks keep
// their keys.
uint64_t KvFingerprint(uint64_t model_fingerprint, const KvLayout& layout,
                       WeightQuant quant = WeightQuant::kNone);

// Where an export's time went (the slow-step log).
struct ExportTimes {
  int chunks = 0;       // copied (chunks the tiers held already are not)
  int64_t bytes = 0;    // payload copied
  double alloc_ms = 0;  // host buffers for the chunks
  double copy_ms = 0;   // device to host
  double seal_ms = 0;   // payload checksums
  double put_ms = 0;    // handing the chunks to the tiers
};

// Exports the KV of `tokens` (every one computed, held by `table`) as
// chunks of tiers->chunk_tokens(), copying only chunks the tiers lack, then
// names them as the session's chunks. `times` (optional) accumulates.
absl::Status ExportSessionKv(const KvCache& kv, Executor* executor, KvTierPort* tiers,
                             const std::string& tenant, uint64_t kv_fingerprint,
                             absl::Span<const int> tokens, const SequenceKv& table,
                             const std::string& session_id, int priority,
                             ExportTimes* times = nullptr);

// Appends, by layer, the copies of `lease`'s blocks into `table`'s blocks
// (which must cover lease.tokens positions) to `out`: for layers below
// `resident_layers`, the blocks that end after `from_token` (the device
// holds the rest); for later layers, every block. FAILED_PRECONDITION if a
// chunk's layout is not `kv`'s.
absl::Status LeaseKvCopies(const KvCache& kv, const KvPrefixLease& lease, int from_token,
                           const SequenceKv& table, LayerKvCopies* out,
                           int resident_layers = std::numeric_limits<int>::max());

// LeaseKvCopies, then copies them and returns when they are done.
absl::Status LoadLeaseKv(const KvCache& kv, Executor* executor, const KvPrefixLease& lease,
                         int from_token, const SequenceKv& table);

}  // namespace ballast::engine
