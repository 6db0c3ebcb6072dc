#include "node_manager/kv_tier_store.h"

#include <algorithm>
#include <cstring>
#include <new>
#include <string_view>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"
#include "transfer/thread_name.h"

namespace ballast::node_manager {

using transfer::KvChunk;
using transfer::KvChunkKey;

namespace {
constexpr char kFileSuffix[] = ".kv";
static_assert(transfer::kMaxEncodedHeaderBytes <= KvTierStore::kSsdPayloadOffset);
}  // namespace

absl::StatusOr<std::unique_ptr<KvTierStore>> KvTierStore::Create(const KvTierOptions& o) {
  if (o.chunk_tokens <= 0) {
    return absl::InvalidArgumentError("node.kv_tiers.chunk_tokens must be > 0");
  }
  if (o.dram_bytes < 0 || o.ssd_bytes < 0) {
    return absl::InvalidArgumentError("node.kv_tiers: dram_gib and ssd_gib must be >= 0");
  }
  if (!o.ssd_dir.empty() && o.ssd_bytes == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("node.kv_tiers.ssd_dir is ", o.ssd_dir, " but ssd_gib is 0"));
  }
  if (o.io_threads < 0) return absl::InvalidArgumentError("KV tiers: io_threads must be >= 0");
  std::unique_ptr<KvTierStore> s(new KvTierStore(o));
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  s->io_pool_ = std::make_unique<transfer::WorkerPool>(
      o.io_threads > 0 ? o.io_threads : std::clamp(cores, 2, 16), 0, "kv-io");
  if (auto st = s->Rebuild(); !st.ok()) return st;
  s->writer_ = std::thread([p = s.get()] {
    transfer::NameThisThread("kv-writer");
    p->WriterLoop();
  });
  return s;
}

KvTierStore::KvTierStore(const KvTierOptions& options)
    : options_(options),
      env_(options.env ? options.env
                       : std::shared_ptr<transfer::KvFileEnv>(options.ssd_direct_io
                                                                  ? transfer::NewDirectKvFileEnv()
                                                                  : transfer::NewPosixKvFileEnv())),
      pool_(transfer::PinnedBufferPool::Create(
          options.pin, static_cast<size_t>(std::max<int64_t>(options.pinned_pool_bytes, 0)))),
      header_page_(static_cast<char*>(std::aligned_alloc(kSsdPayloadOffset, kSsdPayloadOffset))) {
  if (!header_page_) throw std::bad_alloc();
}

KvTierStore::~KvTierStore() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    cv_.SignalAll();
  }
  if (writer_.joinable()) writer_.join();
}

std::string KvTierStore::PathOf(const KvChunkKey& key) const {
  return absl::StrCat(options_.ssd_dir, "/", key.Hex(), kFileSuffix);
}

absl::Status KvTierStore::Rebuild() {
  if (!has_ssd()) return absl::OkStatus();
  if (auto st = env_->CreateDir(options_.ssd_dir); !st.ok()) return st;
  auto names = env_->List(options_.ssd_dir);
  if (!names.ok()) return names.status();
  absl::MutexLock lock(&mu_);
  int kept = 0, discarded = 0;
  for (const std::string& name : *names) {
    const std::string path = absl::StrCat(options_.ssd_dir, "/", name);
    if (absl::EndsWith(name, transfer::kTempSuffix)) {  // a torn write
      (void)env_->Remove(path);
      ++discarded;
      continue;
    }
    if (!absl::EndsWith(name, kFileSuffix)) continue;  // not ours
    auto size = env_->FileSize(path);
    std::string head(std::min<uint64_t>(size.ok() ? *size : 0, transfer::kMaxEncodedHeaderBytes),
                     '\0');
    size_t header_bytes = 0;  // <= kSsdPayloadOffset (checked by DecodeHeader's limit)
    absl::StatusOr<transfer::KvChunkMeta> meta = absl::DataLossError("empty file");
    if (size.ok() && env_->Read(path, 0, head.data(), head.size()).ok()) {
      meta = transfer::DecodeHeader(head, &header_bytes);
    }
    if (!meta.ok() || name != absl::StrCat(meta->key.Hex(), kFileSuffix) ||
        *size != kSsdPayloadOffset + meta->payload_bytes()) {
      spdlog::warn("KV tier: discarding {} ({})", path,
                   meta.ok() ? "size or name does not match its header" : meta.status().ToString());
      (void)env_->Remove(path);
      ++discarded;
      continue;
    }
    Entry& e = entries_[meta->key];
    e.id = ++next_id_;
    e.meta = *meta;
    e.on_ssd = true;
    e.file_bytes = static_cast<int64_t>(*size);
    stats_.ssd_bytes += e.file_bytes;
    children_[meta->parent].push_back(meta->key);
    ++kept;
  }
  spdlog::info("KV tier: SSD at {} ({}): {} chunks indexed, {} files discarded", options_.ssd_dir,
               env_->Describe(), kept, discarded);
  TrimSsd();
  return absl::OkStatus();
}

std::unique_ptr<KvChunk> KvTierStore::NewChunk(const transfer::KvChunkMeta& meta) {
  return pool_->NewChunk(meta);
}

bool KvTierStore::Contains(const KvChunkKey& key) const {
  absl::MutexLock lock(&mu_);
  return entries_.contains(key);
}

void KvTierStore::Put(std::unique_ptr<KvChunk> chunk, int priority) {
  absl::MutexLock lock(&mu_);
  Insert(std::shared_ptr<const KvChunk>(std::move(chunk)), priority);
}

void KvTierStore::Insert(std::shared_ptr<const KvChunk> chunk, int priority) {
  const KvChunkKey key = chunk->meta.key;
  const auto bytes = static_cast<int64_t>(chunk->meta.payload_bytes());
  auto [it, inserted] = entries_.try_emplace(key);
  Entry& e = it->second;
  e.priority = inserted ? priority : std::max(e.priority, priority);
  e.last_use = Tick();
  if (!inserted) {
    if (!e.dram) {
      e.dram = std::move(chunk);
      stats_.dram_bytes += bytes;
      TrimDram();
    }
    return;
  }
  e.id = ++next_id_;
  e.meta = chunk->meta;
  children_[e.meta.parent].push_back(key);
  if (has_ssd()) {
    e.ssd_queued = true;
    to_write_.emplace_back(chunk, e.id);
    cv_.SignalAll();
  }
  e.dram = std::move(chunk);
  stats_.dram_bytes += bytes;
  TrimDram();
}

void KvTierStore::SetSession(const std::string& session_id, std::vector<KvChunkKey> keys,
                             int priority) {
  absl::MutexLock lock(&mu_);
  Session next;
  next.priority = priority;
  for (const KvChunkKey& k : keys) {
    auto it = entries_.find(k);
    if (it == entries_.end()) continue;  // evicted already: recomputed next time
    ++it->second.refs;
    it->second.priority = std::max(it->second.priority, priority);
    next.keys.emplace_back(k, it->second.id);
  }
  Session& slot = sessions_[session_id];
  std::swap(slot, next);
  for (const auto& [k, id] : next.keys) Unref(k, id);  // the old list
}

void KvTierStore::DropSession(const std::string& session_id) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) return;
  Session s = std::move(it->second);
  sessions_.erase(it);
  for (const auto& [k, id] : s.keys) Unref(k, id);
}

void KvTierStore::Unref(const KvChunkKey& key, uint64_t id) {
  auto it = entries_.find(key);
  if (it == entries_.end() || it->second.id != id) return;
  if (--it->second.refs <= 0) Erase(it);
}

void KvTierStore::Erase(Map::iterator it) {
  Entry& e = it->second;
  if (e.dram) stats_.dram_bytes -= static_cast<int64_t>(e.meta.payload_bytes());
  if (e.on_ssd) {
    stats_.ssd_bytes -= e.file_bytes;
    to_delete_.push_back(PathOf(e.meta.key));
    cv_.SignalAll();
  }
  // A queued write finds its entry gone and deletes what it wrote.
  auto c = children_.find(e.meta.parent);
  if (c != children_.end()) {
    auto& v = c->second;
    v.erase(std::remove(v.begin(), v.end(), e.meta.key), v.end());
    if (v.empty()) children_.erase(c);
  }
  entries_.erase(it);
}

void KvTierStore::DropFromDram(Entry* e) {
  e->dram.reset();
  stats_.dram_bytes -= static_cast<int64_t>(e->meta.payload_bytes());
  ++stats_.dram_evictions;
}

node_manager::TierCopy KvTierStore::CopyOf(const Entry& e) {
  return {e.dram != nullptr, e.on_ssd, e.ssd_queued, e.refs > 0, e.priority, e.last_use};
}

void KvTierStore::TrimDram() {
  // Victims and what they leave: kv_tier_policy.h.
  auto view = [](const Map::value_type& kv) { return CopyOf(kv.second); };
  while (stats_.dram_bytes > options_.dram_bytes) {
    Map::iterator victim = PickDramVictim(entries_.begin(), entries_.end(), view);
    if (victim == entries_.end()) return;
    if (DramEviction(CopyOf(victim->second)) == TierEviction::kDemote) {
      DropFromDram(&victim->second);
    } else {
      ++stats_.dropped_chunks;
      Erase(victim);
    }
  }
}

void KvTierStore::TrimSsd() {
  auto view = [](const Map::value_type& kv) { return CopyOf(kv.second); };
  while (stats_.ssd_bytes > options_.ssd_bytes) {
    Map::iterator victim = PickSsdVictim(entries_.begin(), entries_.end(), view);
    if (victim == entries_.end()) return;
    ++stats_.ssd_evictions;
    Entry& e = victim->second;
    if (SsdEviction(CopyOf(e)) == TierEviction::kKeepDramOnly) {
      e.on_ssd = false;
      stats_.ssd_bytes -= e.file_bytes;
      to_delete_.push_back(PathOf(e.meta.key));
      cv_.SignalAll();
    } else {
      ++stats_.dropped_chunks;
      Erase(victim);
    }
  }
}

void KvTierStore::WriterLoop() {
  while (true) {
    std::vector<std::string> deletes;
    std::shared_ptr<const KvChunk> chunk;
    uint64_t id = 0;
    {
      absl::MutexLock lock(&mu_);
      while (!stop_ && to_write_.empty() && to_delete_.empty()) cv_.Wait(&mu_);
      if (stop_ && to_write_.empty() && to_delete_.empty()) return;
      deletes.assign(to_delete_.begin(), to_delete_.end());
      to_delete_.clear();
      if (!to_write_.empty()) {
        std::tie(chunk, id) = std::move(to_write_.front());
        to_write_.pop_front();
      }
      writer_busy_ = true;
    }
    for (const std::string& path : deletes) (void)env_->Remove(path);
    absl::Status st;
    std::string path;
    if (chunk) {
      path = PathOf(chunk->meta.key);
      // The header page and the payload are page-aligned: direct I/O.
      const std::string header = transfer::EncodeHeader(chunk->meta);
      std::memset(header_page_.get(), 0, kSsdPayloadOffset);
      std::memcpy(header_page_.get(), header.data(), header.size());
      const std::string_view pieces[] = {
          std::string_view(header_page_.get(), kSsdPayloadOffset),
          std::string_view(reinterpret_cast<const char*>(chunk->payload.get()),
                           chunk->meta.payload_bytes())};
      st = env_->WriteAtomicAligned(path, pieces);
    }
    absl::MutexLock lock(&mu_);
    writer_busy_ = false;
    if (chunk) {
      auto it = entries_.find(chunk->meta.key);
      const bool live = it != entries_.end() && it->second.id == id;
      const auto bytes = static_cast<int64_t>(kSsdPayloadOffset + chunk->meta.payload_bytes());
      if (!st.ok()) {
        ++stats_.ssd_write_errors;
        spdlog::warn("KV tier: SSD write failed, chunk kept in DRAM only: {}", st.ToString());
        if (live) it->second.ssd_queued = false;
      } else if (!live) {
        to_delete_.push_back(path);  // dropped while being written
      } else {
        Entry& e = it->second;
        e.ssd_queued = false;
        e.on_ssd = true;
        e.file_bytes = bytes;
        stats_.ssd_bytes += bytes;
        stats_.ssd_write_bytes += bytes;
        TrimSsd();
      }
      TrimDram();
    }
    cv_.SignalAll();
  }
}

void KvTierStore::Flush() {
  absl::MutexLock lock(&mu_);
  while (!to_write_.empty() || !to_delete_.empty() || writer_busy_) cv_.Wait(&mu_);
}

int64_t KvTierStore::ShedDram() {
  absl::MutexLock lock(&mu_);
  const int64_t before = stats_.dram_bytes;
  for (auto& [key, e] : entries_) {
    if (e.dram && e.on_ssd) DropFromDram(&e);
  }
  return before - stats_.dram_bytes;
}

KvTierStats KvTierStore::stats() const {
  absl::MutexLock lock(&mu_);
  KvTierStats s = stats_;
  s.chunks = static_cast<int64_t>(entries_.size());
  s.sessions = static_cast<int64_t>(sessions_.size());
  return s;
}

}  // namespace ballast::node_manager
