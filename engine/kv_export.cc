#include "engine/kv_export.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "xxhash.h"

namespace ballast::engine {
namespace {

// Appends the block copies between `chunk`'s payload and the table's
// blocks to layers[l] for each layer l, adjacent ones merged: for layers
// below `resident_layers` only blocks ending after `from_token`.
void AppendBlockCopies(const KvCache& kv, const SequenceKv& table, const transfer::KvChunk& chunk,
                       LayerKvCopies* out, int from_token = 0,
                       int resident_layers = std::numeric_limits<int>::max()) {
  const transfer::KvChunkMeta& m = chunk.meta;
  const int bt = kv.layout().block_tokens;
  const size_t first_block = m.first_token / bt;
  out->layers.resize(std::max<size_t>(out->layers.size(), m.num_layers));
  for (uint32_t l = 0; l < m.num_layers; ++l) {
    std::vector<KvBlockCopy>& copies = out->layers[l];
    uint8_t* host = const_cast<uint8_t*>(chunk.layer_data(l));
    const int start = static_cast<int>(l) < resident_layers ? from_token : 0;
    for (uint32_t j = 0; j < m.blocks_per_layer; ++j) {
      const int block_end = std::min(static_cast<int>(m.first_token) + static_cast<int>(j + 1) * bt,
                                     static_cast<int>(m.end_token()));
      if (block_end <= start) continue;  // its tokens are on the device already
      const memory::BlockId id = table.blocks[l][first_block + j];
      uint8_t* block = kv.allocator()->Address(id);
      uint8_t* at = host + j * m.block_bytes;
      // Blocks allocated together usually sit side by side: one copy.
      if (!copies.empty() && copies.back().block + copies.back().bytes == block &&
          copies.back().host + copies.back().bytes == at) {
        copies.back().bytes += m.block_bytes;
      } else {
        copies.push_back({block, at, m.block_bytes});
      }
    }
  }
}

// One chunk's copies, every layer's in one list (export).
std::vector<KvBlockCopy> BlockCopies(const KvCache& kv, const SequenceKv& table,
                                     const transfer::KvChunk& chunk) {
  LayerKvCopies by_layer;
  AppendBlockCopies(kv, table, chunk, &by_layer);
  std::vector<KvBlockCopy> copies;
  for (auto& l : by_layer.layers) copies.insert(copies.end(), l.begin(), l.end());
  return copies;
}

}  // namespace

uint64_t KvFingerprint(uint64_t model_fingerprint, const KvLayout& l, WeightQuant quant) {
  const uint64_t fields[] = {model_fingerprint,
                             static_cast<uint64_t>(l.num_layers),
                             static_cast<uint64_t>(l.num_kv_heads),
                             static_cast<uint64_t>(l.head_dim),
                             static_cast<uint64_t>(l.block_tokens),
                             static_cast<uint64_t>(l.dtype),
                             static_cast<uint64_t>(l.k_scale * 1e6f),
                             static_cast<uint64_t>(l.v_scale * 1e6f),
                             static_cast<uint64_t>(quant)};
  // kNone leaves the last field out: the keys from before it existed.
  const size_t n = quant == WeightQuant::kNone ? sizeof(fields) - sizeof(uint64_t) : sizeof(fields);
  return XXH3_64bits(fields, n);
}

absl::Status ExportSessionKv(const KvCache& kv, Executor* executor, KvTierPort* tiers,
                             const std::string& tenant, uint64_t kv_fingerprint,
                             absl::Span<const int> tokens, const SequenceKv& table,
                             const std::string& session_id, int priority, ExportTimes* times) {
  ExportTimes local;
  ExportTimes& t = times ? *times : local;
  auto lap = [last = absl::Now()](double* ms) mutable {
    const absl::Time now = absl::Now();
    *ms += absl::ToDoubleMilliseconds(now - last);
    last = now;
  };
  const KvLayout& layout = kv.layout();
  const int chunk = tiers->chunk_tokens();
  const int n = static_cast<int>(tokens.size());
  if (chunk <= 0 || chunk % layout.block_tokens != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "KV tiers: chunk of ", chunk, " tokens is not a multiple of ", layout.block_tokens));
  }
  std::vector<transfer::KvChunkKey> keys;
  transfer::KvChunkKey parent = transfer::RootKey(tenant, kv_fingerprint);
  for (int start = 0; start < n; start += chunk) {
    const int len = std::min(chunk, n - start);
    const transfer::KvChunkKey key = transfer::NextKey(parent, tokens.subspan(start, len));
    keys.push_back(key);
    if (!tiers->Contains(key)) {
      transfer::KvChunkMeta m;
      m.key = key;
      m.parent = parent;
      m.tenant = tenant;
      m.model_fingerprint = kv_fingerprint;
      m.first_token = static_cast<uint32_t>(start);
      m.num_tokens = static_cast<uint32_t>(len);
      m.num_layers = static_cast<uint32_t>(layout.num_layers);
      m.blocks_per_layer =
          static_cast<uint32_t>((len + layout.block_tokens - 1) / layout.block_tokens);
      m.block_bytes = kv.allocator()->block_bytes();
      double skipped = 0;
      lap(&skipped);
      auto c = tiers->NewChunk(m);
      lap(&t.alloc_ms);
      if (auto st = executor->CopyKvToHost(BlockCopies(kv, table, *c)); !st.ok()) return st;
      lap(&t.copy_ms);
      c->Seal();
      lap(&t.seal_ms);
      ++t.chunks;
      t.bytes += static_cast<int64_t>(m.payload_bytes());
      tiers->Put(std::move(c), priority);
      lap(&t.put_ms);
    }
    parent = key;
  }
  tiers->SetSession(session_id, std::move(keys), priority);
  return absl::OkStatus();
}

absl::Status LeaseKvCopies(const KvCache& kv, const KvPrefixLease& lease, int from_token,
                           const SequenceKv& table, LayerKvCopies* out, int resident_layers) {
  const bool all_layers = resident_layers >= kv.layout().num_layers;
  for (const auto& c : lease.chunks) {
    const transfer::KvChunkMeta& m = c->meta;
    // On the device already (every layer).
    if (all_layers && static_cast<int>(m.end_token()) <= from_token) continue;
    if (m.block_bytes != kv.allocator()->block_bytes() ||
        static_cast<int>(m.num_layers) != kv.layout().num_layers) {
      return absl::FailedPreconditionError(
          absl::StrCat("KV chunk ", m.key.Hex(), " does not match the model's KV layout"));
    }
    AppendBlockCopies(kv, table, *c, out, from_token, resident_layers);
  }
  return absl::OkStatus();
}

absl::Status LoadLeaseKv(const KvCache& kv, Executor* executor, const KvPrefixLease& lease,
                         int from_token, const SequenceKv& table) {
  LayerKvCopies load;
  if (auto st = LeaseKvCopies(kv, lease, from_token, table, &load); !st.ok()) return st;
  // Waits also after a failed start: copies it queued may still write.
  const absl::Status started = executor->StartKvLoad(std::move(load));
  const absl::Status done = executor->WaitKvLoad();
  return started.ok() ? done : started;
}

}  // namespace ballast::engine
