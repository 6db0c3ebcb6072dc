// KvTierStore's read side: prefix lookup, loads from SSD, peer fetches
// (kv_tier_store.h states the rules).
#include <algorithm>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

#include "node_manager/kv_tier_store.h"
#include "spdlog/spdlog.h"
#include "transfer/latch.h"

namespace ballast::node_manager {

using transfer::KvChunk;
using transfer::KvChunkKey;

const KvTierStore::Entry* KvTierStore::FindNext(const KvChunkKey& parent,
                                                absl::Span<const int> tokens, int pos,
                                                int room) const {
  const int chunk = options_.chunk_tokens;
  if (room >= chunk) {
    auto it = entries_.find(transfer::NextKey(parent, tokens.subspan(pos, chunk)));
    if (it != entries_.end()) return &it->second;
  }
  auto c = children_.find(parent);
  if (c == children_.end()) return nullptr;
  const Entry* best = nullptr;
  for (const KvChunkKey& k : c->second) {
    auto it = entries_.find(k);
    if (it == entries_.end()) continue;
    const transfer::KvChunkMeta& m = it->second.meta;
    const int n = static_cast<int>(m.num_tokens);
    if (n > room || static_cast<int>(m.first_token) != pos) continue;
    if (best != nullptr && n <= static_cast<int>(best->meta.num_tokens)) continue;
    if (transfer::NextKey(parent, tokens.subspan(pos, n)) == k) best = &it->second;
  }
  return best;
}

std::shared_ptr<const KvChunk> KvTierStore::Load(const KvChunkKey& key, bool* from_ssd) {
  std::shared_ptr<const KvChunk> dram;
  transfer::KvChunkMeta meta;
  uint64_t id = 0;
  {
    absl::MutexLock lock(&mu_);
    auto it = entries_.find(key);
    if (it == entries_.end()) return nullptr;
    Entry& e = it->second;
    e.last_use = Tick();
    if (!e.dram && !e.on_ssd) return nullptr;
    dram = e.dram;
    meta = e.meta;
    id = e.id;
  }
  *from_ssd = dram == nullptr;
  if (dram) return dram;  // verified by LoadAll, layer by layer in parallel
  absl::Status st;
  std::shared_ptr<KvChunk> read;
  {
    // The header is read back too: the file must still describe this chunk.
    const size_t header_bytes = transfer::EncodedHeaderBytes(meta.tenant.size());
    std::string head(header_bytes, '\0');
    read = NewChunk(meta);
    const std::string path = PathOf(key);
    st = env_->Read(path, 0, head.data(), head.size());
    size_t parsed = 0;
    if (st.ok()) {
      auto m = transfer::DecodeHeader(head, &parsed);
      if (!m.ok()) {
        st = m.status();
      } else if (m->key != key || m->payload_checksum != meta.payload_checksum) {
        st = absl::DataLossError(absl::StrCat(path, ": header describes another chunk"));
      }
    }
    if (st.ok())
      st = env_->Read(path, kSsdPayloadOffset, read->payload.get(), meta.payload_bytes());
    if (st.ok()) st = read->VerifyPayload();
  }
  if (!st.ok()) {
    DropCorrupt(key, id, st);
    return nullptr;
  }
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(key);
  const bool live = it != entries_.end() && it->second.id == id;
  stats_.ssd_read_bytes += static_cast<int64_t>(meta.payload_bytes());
  if (live && !it->second.dram) {  // promote
    it->second.dram = read;
    stats_.dram_bytes += static_cast<int64_t>(meta.payload_bytes());
    TrimDram();
  }
  return read;
}

void KvTierStore::DropCorruptCopy(const std::shared_ptr<const KvChunk>& copy) {
  const KvChunkKey key = copy->meta.key;
  spdlog::warn("KV tier: DRAM copy of chunk {} is corrupt; dropped, its KV will be recomputed",
               key.Hex());
  absl::MutexLock lock(&mu_);
  ++stats_.checksum_failures;
  auto it = entries_.find(key);
  if (it != entries_.end() && it->second.dram == copy) Erase(it);
}

void KvTierStore::DropCorrupt(const KvChunkKey& key, uint64_t id, const absl::Status& why) {
  spdlog::warn("KV tier: chunk {} dropped, its KV will be recomputed: {}", key.Hex(),
               why.ToString());
  absl::MutexLock lock(&mu_);
  ++stats_.checksum_failures;
  auto it = entries_.find(key);
  if (it != entries_.end() && it->second.id == id) Erase(it);
}

void KvTierStore::ParallelFor(size_t n, const std::function<void(size_t)>& fn) {
  // transfer::Latch, not absl::BlockingCounter: ThreadSanitizer sees it
  // order the tasks' work before Wait returns.
  std::shared_ptr<transfer::Latch> left = transfer::Latch::Create(static_cast<int64_t>(n));
  for (size_t i = 0; i < n; ++i) {
    auto task = [&fn, left, i] {
      fn(i);
      left->CountDown();
    };
    if (!io_pool_->Schedule(task)) task();
  }
  left->Wait();
}

std::vector<std::shared_ptr<const KvChunk>> KvTierStore::LoadAll(
    const std::vector<KvChunkKey>& keys, bool* any_from_ssd) {
  // Reads first (SSD copies are verified as they are read) ...
  std::vector<std::shared_ptr<const KvChunk>> got(keys.size());
  std::vector<char> from_ssd(keys.size(), 0);
  ParallelFor(keys.size(), [&](size_t i) {
    bool ssd = false;
    got[i] = Load(keys[i], &ssd);
    from_ssd[i] = ssd;
  });
  // ... then the DRAM copies, every (chunk, layer) at once.
  std::vector<std::pair<size_t, uint32_t>> tasks;
  std::vector<std::vector<uint64_t>> sums(keys.size());
  for (size_t i = 0; i < got.size(); ++i) {
    if (!got[i] || from_ssd[i]) continue;
    sums[i].resize(got[i]->meta.num_layers);
    for (uint32_t l = 0; l < got[i]->meta.num_layers; ++l) tasks.emplace_back(i, l);
  }
  ParallelFor(tasks.size(), [&](size_t t) {
    const auto [i, l] = tasks[t];
    sums[i][l] = transfer::LayerChecksum(*got[i], l);
  });
  size_t good = 0;
  for (; good < got.size() && got[good]; ++good) {
    if (!from_ssd[good] &&
        transfer::CombineChecksums(sums[good]) != got[good]->meta.payload_checksum) {
      DropCorruptCopy(got[good]);
      break;
    }
    *any_from_ssd = *any_from_ssd || from_ssd[good];
  }
  got.resize(good);  // the rest follows a lost or corrupt chunk: recomputed
  return got;
}

std::shared_ptr<const engine::KvPrefixLease> KvTierStore::Acquire(
    const std::string& tenant, uint64_t kv_fingerprint, absl::Span<const int> tokens,
    int max_tokens, const std::string& peer, KvPeerFetcher* fetcher) {
  max_tokens = std::min<int>(max_tokens, static_cast<int>(tokens.size()));
  auto lease = std::make_shared<engine::KvPrefixLease>();
  // The chain of chunks the index holds for this prefix (no data yet) ...
  std::vector<KvChunkKey> keys;
  KvChunkKey parent = transfer::RootKey(tenant, kv_fingerprint);
  {
    absl::MutexLock lock(&mu_);
    int at = 0;
    while (at < max_tokens) {
      const Entry* e = FindNext(parent, tokens, at, max_tokens - at);
      if (e == nullptr) break;
      keys.push_back(e->meta.key);
      at = static_cast<int>(e->meta.end_token());
      parent = e->meta.key;
    }
  }
  // ... then every chunk read (SSD) and verified at once on the pool.
  bool from_ssd = false;
  lease->chunks = LoadAll(keys, &from_ssd);
  if (from_ssd) lease->source = engine::KvSource::kSsd;
  int pos = 0;
  parent = transfer::RootKey(tenant, kv_fingerprint);
  for (size_t i = 0; i < lease->chunks.size(); ++i) {
    const transfer::KvChunkMeta& m = lease->chunks[i]->meta;
    // The key hashes tenant and model in; the header must agree all the same.
    if (m.tenant != tenant || m.model_fingerprint != kv_fingerprint) {
      lease->chunks.resize(i);
      break;
    }
    pos = static_cast<int>(m.end_token());
    parent = m.key;
  }
  if (pos < max_tokens && fetcher != nullptr && !peer.empty()) {
    auto got = fetcher->Fetch(peer, tenant, kv_fingerprint, tokens, pos, max_tokens,
                              [this](const transfer::KvChunkMeta& m) { return NewChunk(m); });
    if (!got.ok()) {
      spdlog::warn("KV tier: fetch from peer {} failed, recomputing: {}", peer,
                   got.status().ToString());
    } else {
      for (auto& c : *got) {
        const transfer::KvChunkMeta& m = c->meta;
        const int end = static_cast<int>(m.end_token());
        // Accept only the chunk that follows, for exactly these tokens (the
        // fetcher verified its checksums).
        if (static_cast<int>(m.first_token) != pos || end > max_tokens || m.parent != parent ||
            m.tenant != tenant || m.model_fingerprint != kv_fingerprint ||
            transfer::NextKey(parent, tokens.subspan(pos, end - pos)) != m.key) {
          break;
        }
        std::shared_ptr<const KvChunk> shared(std::move(c));
        {
          absl::MutexLock lock(&mu_);
          stats_.peer_bytes += static_cast<int64_t>(m.payload_bytes());
          Insert(shared, 0);
        }
        lease->source = engine::KvSource::kPeer;
        lease->chunks.push_back(shared);
        pos = end;
        parent = shared->meta.key;
      }
    }
  }
  lease->tokens = pos;
  return pos > 0 ? lease : nullptr;
}

}  // namespace ballast::node_manager
