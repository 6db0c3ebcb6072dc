// KvManager: the KV side of one ModelEngine, as vLLM v1 splits it from the
// scheduler. It reserves blocks for sequences, keeps finished sessions' KV
// for their next turn, sheds KV on request, and owns the admission
// watermark. It knows neither the executor nor the running set: the batch
// planner asks it narrow questions and decides preemption itself.
//
// Rules (each written once, here):
//   * Reserve grows a block table, all or nothing. While blocks are short
//     it evicts cached sessions, least recently used first; it never
//     preempts a running sequence.
//   * Session cache: Keep stores a finished request's KV under its session
//     id (replacing an older entry). TakePrefix hands the session's next
//     request the kept blocks and the length of the longest common prefix
//     of its tokens with the kept ones, capped so at least one token is left
//     to compute (logits need one).
//   * Admission watermark: a waiting sequence may be admitted only if, after
//     its reservation, every running sequence could still grow by one block
//     per layer (else the newcomer is preempted at the next block boundary
//     and its prefill wasted: thrashing). On a pool shared by several
//     models (the elastic arena) that counts their running sequences too
//     (SetGrowthReserve): the newcomer is the device's newest, the first
//     another model's growth preempts. Blocks held by cached sessions
//     count as free, since Reserve evicts them on demand; counting them as
//     used would let a pool full of cached sessions block every new request
//     for good.
//   * Prefetches (Advise): Keep with a deadline marks the entry a
//     prefetch. The first TakePrefix uses it (counted used, with its lead
//     time); DropPrefetch drops it while unused (invalidated); past its
//     deadline ExpirePrefetches drops it (expired). Until then it is a
//     cached session like any other: shed first when memory is wanted.
//   * Layer-wise shedding (Symphony's layer-wise priority): ShedLayers
//     gives back a kept session's KV from its last layer down, keeping the
//     first layers, for engines whose sessions have a full copy in the
//     lower tiers. The entry then no longer counts as cached (CachedTokens
//     0, so the node reads the tiers), and TakePrefix reports how many
//     layers stayed: the next turn computes those layers at once while the
//     rest load from the lease.
//   * Recency (KvRecencyNow) is nanoseconds of the steady clock, strictly
//     increasing within the process, so holdings of different engines on
//     one device compare.
//
// Thread-safety: thread-compatible (the engine's step thread owns it),
// except CachedTokens, which is thread-safe.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/kv_cache.h"

namespace ballast::engine {

// One thing holding KV that an engine could give back (device-wide
// shedding).
struct KvHolding {
  enum class Kind { kCachedSession, kRunning };
  Kind kind = Kind::kRunning;
  std::string id;  // session id (kCachedSession) or request id (kRunning)
  // The request's priority (cached session: of the request that left it);
  // lower sheds first.
  int priority = 0;
  // Larger = more recent (cached: last use; running: admission), in
  // KvRecencyNow units: comparable across the engines of one process.
  uint64_t recency = 0;
  int64_t bytes = 0;  // KV bytes freed by shedding it
  // Its blocks by arena slab; filled only where asked (Holdings(true)).
  std::vector<memory::SlabBlocks> slabs;
};

// What became of Advise prefetches (KvManager's rule), cumulative.
struct PrefetchOutcomes {
  int64_t used = 0, invalidated = 0, expired = 0;
};

// Steady-clock nanoseconds, strictly increasing across calls in this
// process (ties are bumped by 1 ns). Thread-safe.
uint64_t KvRecencyNow();

class KvManager {
 public:
  // `kv` must outlive the manager.
  explicit KvManager(KvCache* kv);
  // Frees the blocks of every cached session.
  ~KvManager();
  KvManager(const KvManager&) = delete;
  KvManager& operator=(const KvManager&) = delete;

  const KvLayout& layout() const { return kv_->layout(); }
  int64_t block_bytes() const { return static_cast<int64_t>(kv_->allocator()->block_bytes()); }
  // True once the blocks this model could hold (now) reach the most it
  // may ever hold (its arena limit or the device): freeing other models'
  // memory cannot give it more.
  bool AtCapacity() const { return kv_->allocator()->num_total() >= kv_->allocator()->num_max(); }
  int64_t BytesOf(const SequenceKv& kv) const { return kv.num_blocks() * block_bytes(); }
  // Its blocks counted by the allocator's slabs (BlockAddressing).
  std::vector<memory::SlabBlocks> SlabsOf(const SequenceKv& kv) const;
  // Bytes Reserve(kv, tokens) would allocate.
  int64_t BytesNeeded(const SequenceKv& kv, int tokens) const {
    return static_cast<int64_t>(kv_->BlocksNeeded(kv, tokens)) * block_bytes();
  }

  // Grows `kv` to cover `tokens` positions, evicting cached sessions (least
  // recently used first) while blocks are short. False when it cannot fit
  // even with no cached session left; `kv` is then unchanged.
  bool Reserve(SequenceKv* kv, int tokens);
  // The admission watermark (see the file comment): may a waiting sequence
  // whose table is `kv` reserve up to `tokens` positions while `running`
  // sequences run?
  bool FitsWatermark(const SequenceKv& kv, int tokens, int running) const;
  // Blocks the watermark keeps free while `running` sequences run: one per
  // layer for each of them, and the other models' growth on a shared pool.
  int64_t HeadroomBlocks(int running) const;
  // Tells a shared pool that `running` sequences of this model will grow
  // (one block per layer each): the other models' watermark leaves room.
  void SetGrowthReserve(int running);
  // Frees `kv`'s blocks and clears it; returns the bytes freed.
  int64_t Free(SequenceKv* kv);

  // Moves the kept KV of `session_id` (if any) into `kv` (which must be
  // empty) and returns how many leading `tokens` it already holds (0 if
  // none). The session leaves the cache.
  // A prefetched entry's lead time (from Keep to now) goes to
  // `*prefetch_lead` when given (else it is left alone).
  // `*resident_layers` (when given) gets the layers `kv` holds: all of
  // them unless ShedLayers took the later ones.
  int TakePrefix(const std::string& session_id, const std::vector<int>& tokens, SequenceKv* kv,
                 absl::Duration* prefetch_lead = nullptr, int* resident_layers = nullptr);
  // Keeps `kv` (holding the KV of `tokens`) for the session's next turn.
  // `prefetch_deadline` (not InfiniteFuture): an Advise prefetch, released
  // at that time if unused.
  // `lower_copy`: the lower tiers hold this KV too (ShedLayers may then
  // keep only the first layers; otherwise it drops the whole entry).
  void Keep(const std::string& session_id, SequenceKv kv, std::vector<int> tokens, int priority,
            absl::Time prefetch_deadline = absl::InfiniteFuture(), bool lower_copy = false);
  // Drops the session's entry if it is an unused prefetch; true if it was.
  bool DropPrefetch(const std::string& session_id);
  // Drops unused prefetches past their deadline.
  void ExpirePrefetches(absl::Time now);
  const PrefetchOutcomes& prefetch_outcomes() const { return outcomes_; }
  // Tokens of the session's kept KV (0: none). Thread-safe.
  int CachedTokens(const std::string& session_id) const;
  // Forgets a session's kept KV; returns the bytes freed (0 if none).
  int64_t Drop(const std::string& session_id);
  // Frees the session's KV from its last layer down until `want_bytes`
  // are freed, keeping its first layers (see the file comment); the whole
  // entry goes when that would leave no layer, or when the lower tiers
  // hold no copy (Keep's lower_copy). Returns the bytes freed.
  int64_t ShedLayers(const std::string& session_id, int64_t want_bytes);
  // The least recently used session gives back `want_bytes` (ShedLayers:
  // later layers first when the tiers hold it; default all of it).
  // Returns the bytes freed (0: no session).
  int64_t EvictLeastRecent(int64_t want_bytes = std::numeric_limits<int64_t>::max());
  int num_sessions() const { return static_cast<int>(sessions_.size()); }
  // One kCachedSession holding per kept session; with_slabs fills each
  // holding's slabs (a pass over its block table).
  std::vector<KvHolding> Holdings(bool with_slabs = false) const;
  // Adds every kept session's block table (KV relocation rewrites them).
  void AppendTables(std::vector<SequenceKv*>* out);

 private:
  struct CachedSession {
    SequenceKv kv;
    std::vector<int> tokens;  // tokens whose KV is in kv
    int priority = 0;
    uint64_t last_use = 0;                                  // KvRecencyNow
    absl::Time prefetch_deadline = absl::InfiniteFuture();  // a prefetch if finite
    absl::Time kept_at;
    int resident_layers = 0;  // layers [0, resident_layers) hold the KV
    bool lower_copy = false;  // the lower tiers hold it too
  };

  // Frees one cached session and forgets it; returns the bytes freed.
  int64_t Erase(std::map<std::string, CachedSession>::iterator it);

  KvCache* const kv_;
  std::map<std::string, CachedSession> sessions_;
  int64_t cached_blocks_ = 0;  // blocks held by sessions_
  int prefetches_ = 0;         // entries of sessions_ that are unused prefetches
  PrefetchOutcomes outcomes_;
  // Token counts of sessions_, readable from any thread (CachedTokens).
  mutable absl::Mutex published_mu_;
  absl::flat_hash_map<std::string, int> published_ ABSL_GUARDED_BY(published_mu_);
};

}  // namespace ballast::engine
