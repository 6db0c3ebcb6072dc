// KvTierStore's read side: prefix lookup, loads from SSD, peer fetches
// (kv_tier_store.h states the rules).
#include <algorithm>

#include "absl/synchronization/blocking_counter.h"

#include "node_manager/kv_tier_store.h"
#include "spdlog/spdlog.h"

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
  if (dram) return dram;  // verified by the caller (VerifyAll)
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
    if (st.ok()) st = env_->Read(path, header_bytes, read->payload.get(), meta.payload_bytes());
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

void KvTierStore::DropCorrupt(const KvChunkKey& key, uint64_t id, const absl::Status& why) {
  spdlog::warn("KV tier: chunk {} dropped, its KV will be recomputed: {}", key.Hex(),
               why.ToString());
  absl::MutexLock lock(&mu_);
  ++stats_.checksum_failures;
  auto it = entries_.find(key);
  if (it != entries_.end() && it->second.id == id) Erase(it);
}

size_t KvTierStore::VerifyAll(const std::vector<std::shared_ptr<const KvChunk>>& chunks,
                              const std::vector<bool>& verified) {
  std::vector<absl::Status> st(chunks.size());
  size_t todo = 0;
  for (size_t i = 0; i < chunks.size(); ++i) todo += verified[i] ? 0 : 1;
  absl::BlockingCounter pending(static_cast<int>(todo));
  for (size_t i = 0; i < chunks.size(); ++i) {
    if (verified[i]) continue;
    auto check = [&, i] {
      st[i] = chunks[i]->VerifyPayload();
      pending.DecrementCount();
    };
    if (!verify_pool_->Schedule(check)) check();
  }
  pending.Wait();
  for (size_t i = 0; i < chunks.size(); ++i) {
    if (st[i].ok()) continue;
    uint64_t id = 0;
    {
      absl::MutexLock lock(&mu_);
      auto it = entries_.find(chunks[i]->meta.key);
      if (it != entries_.end()) id = it->second.id;
    }
    DropCorrupt(chunks[i]->meta.key, id, st[i]);
    return i;
  }
  return chunks.size();
}

std::shared_ptr<const engine::KvPrefixLease> KvTierStore::Acquire(
    const std::string& tenant, uint64_t kv_fingerprint, absl::Span<const int> tokens,
    int max_tokens, const std::string& peer, KvPeerFetcher* fetcher) {
  max_tokens = std::min<int>(max_tokens, static_cast<int>(tokens.size()));
  auto lease = std::make_shared<engine::KvPrefixLease>();
  KvChunkKey parent = transfer::RootKey(tenant, kv_fingerprint);
  int pos = 0;
  std::vector<bool> verified;  // per chunk: read from SSD (verified there)
  while (pos < max_tokens) {
    KvChunkKey key;
    {
      absl::MutexLock lock(&mu_);
      const Entry* e = FindNext(parent, tokens, pos, max_tokens - pos);
      if (e == nullptr) break;
      key = e->meta.key;
    }
    bool from_ssd = false;
    std::shared_ptr<const KvChunk> c = Load(key, &from_ssd);
    // The key hashes tenant and model in; the header must agree all the same.
    if (!c || c->meta.tenant != tenant || c->meta.model_fingerprint != kv_fingerprint) break;
    if (from_ssd) lease->source = engine::KvSource::kSsd;
    lease->chunks.push_back(c);
    verified.push_back(from_ssd);
    pos = static_cast<int>(c->meta.end_token());
    parent = key;
  }
  // DRAM copies are checked in parallel; a corrupt one ends the lease.
  if (const size_t good = VerifyAll(lease->chunks, verified); good < lease->chunks.size()) {
    lease->chunks.resize(good);
    if (good == 0) return nullptr;
    lease->tokens = static_cast<int>(lease->chunks.back()->meta.end_token());
    return lease;
  }
  if (pos < max_tokens && fetcher != nullptr && !peer.empty()) {
    auto got = fetcher->Fetch(peer, tenant, kv_fingerprint, tokens, pos, max_tokens);
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
        if (options_.pin && !c->pin) c->pin = options_.pin(c->payload.get(), m.payload_bytes());
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
