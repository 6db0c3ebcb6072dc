// KvTierStore: a node's session KV below the device — a DRAM tier and an
// SSD tier of KV chunks (transfer/kv_chunk.h), deduplicated by key, shared
// by every engine on the node (engine::KvTierPort) and read by requests
// (Acquire), prefetches and peers.
//
// Rules (each written once, here):
//   * Lowest tier holds everything. Put keeps a chunk in DRAM and, with an
//     SSD tier, queues it for the background writer; so the SSD holds a
//     full copy of every kept session and a DRAM copy may be dropped at any
//     time. Without an SSD tier, DRAM is the lowest tier.
//   * Eviction within a tier (kv_tier_policy.h, shared with the
//     simulator): lowest priority first, then least recently used. A DRAM
//     copy still waiting for its SSD write is not evicted. A chunk evicted
//     from its lowest tier is gone: the sessions naming it recompute from
//     it on (never a wrong token).
//   * Retention: a chunk lives while a session names it (SetSession,
//     DropSession); chunks found on disk at start (a restart) are named by
//     no session and kept until the SSD needs room or a session names and
//     then drops them.
//   * Integrity: every chunk read from DRAM, SSD or a peer is verified
//     against its checksum; a mismatch or a short file drops that copy,
//     counts a checksum failure and ends the lease there (the rest
//     recomputes).
//   * SSD files: the chunk's header (transfer/kv_chunk.h), zeros, then the
//     payload at kSsdPayloadOffset, page-aligned so the default env reads
//     it with io_uring and O_DIRECT straight into the chunk's page-aligned
//     buffer (transfer::NewDirectKvFileEnv).
//   * Restart: Create scans ssd_dir, deletes temporaries (torn writes) and
//     files whose header does not parse, and indexes the rest from their
//     headers.
//   * Tenants: keys hash the tenant in, and Acquire checks the tenant of
//     every chunk it returns, so KV is never shared across tenants.
//
// Thread-safety: all methods are thread-safe. File I/O runs outside the
// lock (the writer thread; Acquire's reads).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "engine/kv_tiers.h"
#include "node_manager/kv_tier_policy.h"
#include "transfer/kv_chunk.h"
#include "transfer/kv_file_env.h"
#include "transfer/pinned_pool.h"
#include "transfer/worker_pool.h"

namespace ballast::node_manager {

struct KvTierOptions {
  // DRAM tier budget in bytes. Default 0: no DRAM copies kept beyond what
  // the SSD writer has in flight (with an SSD tier), nothing at all without.
  int64_t dram_bytes = 0;
  // SSD tier directory; empty: no SSD tier.
  std::string ssd_dir;
  // SSD tier budget in bytes (files' total size). Default 0 = none.
  int64_t ssd_bytes = 0;
  // Tokens per chunk; a multiple of the engines' block_tokens. Smaller
  // chunks share more of a common prefix and cost more index entries.
  // Default 256.
  int chunk_tokens = 256;
  // File operations (tests inject faults); null: the real file system,
  // with ssd_direct_io's reads.
  std::shared_ptr<transfer::KvFileEnv> env;
  // Default true: SSD reads bypass the page cache (io_uring, O_DIRECT;
  // transfer::NewDirectKvFileEnv), so host memory holds only the DRAM
  // tier's budget and an SSD hit costs what the device does. False: pread
  // through the page cache (faster while the kernel happens to cache the
  // files, outside any budget).
  bool ssd_direct_io = true;
  // Freed chunk buffers kept pinned for the next chunks (SSD reads,
  // exports) instead of pinning new memory, which costs more than the copy.
  // Host memory beyond dram_bytes. Default 512 MiB.
  int64_t pinned_pool_bytes = 512ll << 20;
  // Pins a chunk's payload for DMA (CUDA nodes: engine::PinHostMemory),
  // returning the handle that unpins it (null: not pinned). Null: none.
  std::function<std::shared_ptr<void>(void* data, size_t bytes)> pin;
  // Threads that read and verify a lease's chunks in parallel; 0: one per
  // core (2 to 16). A DRAM hit of 256 MB verified on 8 threads took 6.7 ms,
  // on 16 4.4 ms (H100 host, 16 cores). Default 0.
  int io_threads = 0;
  // Load a lease layer by layer while the step computes (default true);
  // false copies it all before the step (engine::ModelEngineOptions::
  // layerwise_kv_load).
  bool layerwise_load = true;
};

struct KvTierStats {
  int64_t dram_bytes = 0, ssd_bytes = 0;  // held now
  int64_t chunks = 0;                     // indexed (any tier)
  int64_t sessions = 0;
  int64_t checksum_failures = 0;  // copies dropped as corrupt or truncated
  int64_t ssd_write_errors = 0;   // writes refused (full disk, I/O errors)
  int64_t ssd_read_bytes = 0, ssd_write_bytes = 0;
  int64_t peer_bytes = 0;  // received from peers
  int64_t dram_evictions = 0, ssd_evictions = 0;
  int64_t dropped_chunks = 0;  // evicted from their lowest tier
};

// Fetches chunks of a prompt from another node (PeerKvClient).
class KvPeerFetcher {
 public:
  virtual ~KvPeerFetcher() = default;
  // Room for a received chunk (the store's pinned pool).
  using ChunkAlloc =
      std::function<std::unique_ptr<transfer::KvChunk>(const transfer::KvChunkMeta&)>;
  // Chunks after the first `first_token` tokens, in order, up to
  // `max_tokens`, each verified, their payloads in chunks from `alloc`; an
  // empty list if the peer has none.
  virtual absl::StatusOr<std::vector<std::unique_ptr<transfer::KvChunk>>> Fetch(
      const std::string& peer, const std::string& tenant, uint64_t kv_fingerprint,
      absl::Span<const int> tokens, int first_token, int max_tokens, const ChunkAlloc& alloc) = 0;
};

class KvTierStore final : public engine::KvTierPort {
 public:
  // Where an SSD file's payload starts (see the file comment).
  static constexpr size_t kSsdPayloadOffset = 4096;

  // Validates the options, creates ssd_dir and rebuilds the index from it.
  static absl::StatusOr<std::unique_ptr<KvTierStore>> Create(const KvTierOptions& options);
  ~KvTierStore() override;

  // engine::KvTierPort.
  int chunk_tokens() const override { return options_.chunk_tokens; }
  bool Contains(const transfer::KvChunkKey& key) const override;
  std::unique_ptr<transfer::KvChunk> NewChunk(const transfer::KvChunkMeta& meta) override;
  void Put(std::unique_ptr<transfer::KvChunk> chunk, int priority) override;
  void SetSession(const std::string& session_id, std::vector<transfer::KvChunkKey> keys,
                  int priority) override;

  // The longest prefix of `tokens` (at most `max_tokens` of them) held
  // here, then (from `peer`, when given and reachable) as much more as the
  // peer holds; chunks read below DRAM are promoted into it. Never an
  // error: a lost or corrupt chunk ends the lease early. Null if nothing.
  std::shared_ptr<const engine::KvPrefixLease> Acquire(const std::string& tenant,
                                                       uint64_t kv_fingerprint,
                                                       absl::Span<const int> tokens, int max_tokens,
                                                       const std::string& peer = "",
                                                       KvPeerFetcher* fetcher = nullptr);
  // Forgets the session (EndSession): chunks no other session names are
  // deleted from every tier.
  void DropSession(const std::string& session_id);
  // Waits until the SSD writer's queue is empty (tests, shutdown).
  void Flush();
  // Drops every DRAM copy that has an SSD copy (an operator freeing host
  // memory; benchmarks measuring SSD reads). Returns the bytes freed.
  int64_t ShedDram();
  KvTierStats stats() const;

 private:
  struct Entry {
    uint64_t id = 0;  // unique per insertion (a re-inserted key gets a new one)
    transfer::KvChunkMeta meta;
    std::shared_ptr<const transfer::KvChunk> dram;  // null: not in DRAM
    bool on_ssd = false;
    int64_t file_bytes = 0;   // on_ssd: the file's size
    bool ssd_queued = false;  // waiting for (or in) the writer
    int refs = 0;             // sessions naming it
    int priority = 0;
    uint64_t last_use = 0;
  };
  struct Session {
    // The chunks it names, with the entry id each had when named (a chunk
    // evicted and re-inserted since is not this session's to release).
    std::vector<std::pair<transfer::KvChunkKey, uint64_t>> keys;
    int priority = 0;
  };
  using Map = absl::flat_hash_map<transfer::KvChunkKey, Entry>;

  explicit KvTierStore(const KvTierOptions& options);
  absl::Status Rebuild();
  void WriterLoop();
  std::string PathOf(const transfer::KvChunkKey& key) const;
  bool has_ssd() const { return !options_.ssd_dir.empty(); }
  // The chunk after `parent` at token `pos` matching `tokens`, at most
  // `room` tokens long: the full chunk if held, else the longest partial.
  const Entry* FindNext(const transfer::KvChunkKey& parent, absl::Span<const int> tokens, int pos,
                        int room) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The chunk's bytes: its DRAM copy (not verified here: LoadAll does),
  // else read from SSD and verified (then promoted into DRAM). Null if lost
  // or corrupt (counted, dropped); `*from_ssd` says where from.
  std::shared_ptr<const transfer::KvChunk> Load(const transfer::KvChunkKey& key, bool* from_ssd)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Counts a corrupt copy and drops its entry (if still entry `id`).
  void DropCorrupt(const transfer::KvChunkKey& key, uint64_t id, const absl::Status& why)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Counts a corrupt DRAM copy and drops its entry (if `copy` is still it).
  void DropCorruptCopy(const std::shared_ptr<const transfer::KvChunk>& copy)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Runs fn(0..n-1) on io_pool_ and waits. Never called from a pool task.
  void ParallelFor(size_t n, const std::function<void(size_t)>& fn);
  // Loads (Load) the chunks of `keys` in parallel on io_pool_ and verifies
  // the DRAM copies layer by layer in parallel; returns the leading ones
  // that loaded (a lost or corrupt one ends the list).
  std::vector<std::shared_ptr<const transfer::KvChunk>> LoadAll(
      const std::vector<transfer::KvChunkKey>& keys, bool* any_from_ssd) ABSL_LOCKS_EXCLUDED(mu_);
  // Adds a verified chunk (a peer's) to the index like Put.
  void Insert(std::shared_ptr<const transfer::KvChunk> chunk, int priority)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes an entry from every tier (its file deleted by the writer).
  void Erase(Map::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Unref(const transfer::KvChunkKey& key, uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The entry as the eviction rules see it (kv_tier_policy.h).
  static TierCopy CopyOf(const Entry& e);
  // Evicts DRAM copies / SSD files while over budget (kv_tier_policy.h).
  void TrimDram() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TrimSsd() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DropFromDram(Entry* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t Tick() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return ++clock_; }

  const KvTierOptions options_;
  std::shared_ptr<transfer::KvFileEnv> env_;
  // Chunk payloads, pinned once and recycled (NewChunk).
  std::shared_ptr<transfer::PinnedBufferPool> pool_;
  mutable absl::Mutex mu_;
  absl::CondVar cv_;
  Map entries_ ABSL_GUARDED_BY(mu_);
  // parent key -> the keys of chunks that follow it (partial lookups).
  absl::flat_hash_map<transfer::KvChunkKey, std::vector<transfer::KvChunkKey>> children_
      ABSL_GUARDED_BY(mu_);
  std::map<std::string, Session> sessions_ ABSL_GUARDED_BY(mu_);
  // Writer work: chunks to write (with their entry id), files to delete.
  std::deque<std::pair<std::shared_ptr<const transfer::KvChunk>, uint64_t>> to_write_
      ABSL_GUARDED_BY(mu_);
  std::deque<std::string> to_delete_ ABSL_GUARDED_BY(mu_);
  bool writer_busy_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t clock_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
  KvTierStats stats_ ABSL_GUARDED_BY(mu_);
  std::thread writer_;
  // A file's first page (header and padding), page-aligned for direct
  // writes; the writer thread's alone.
  struct FreeDeleter {
    void operator()(char* p) const { std::free(p); }
  };
  std::unique_ptr<char[], FreeDeleter> header_page_;
  std::unique_ptr<transfer::WorkerPool> io_pool_;  // reads and checksums
};

}  // namespace ballast::node_manager
