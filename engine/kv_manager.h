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
//     and its prefill wasted: thrashing). Blocks held by cached sessions
//     count as free, since Reserve evicts them on demand; counting them as
//     used would let a pool full of cached sessions block every new request
//     for good.
//   * Recency (KvRecencyNow) is nanoseconds of the steady clock, strictly
//     increasing within the process, so holdings of different engines on
//     one device compare.
//
// Thread-safety: thread-compatible; the engine's step thread owns it.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

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
  int64_t BytesOf(const SequenceKv& kv) const { return kv.num_blocks() * block_bytes(); }

  // Grows `kv` to cover `tokens` positions, evicting cached sessions (least
  // recently used first) while blocks are short. False when it cannot fit
  // even with no cached session left; `kv` is then unchanged.
  bool Reserve(SequenceKv* kv, int tokens);
  // The admission watermark (see the file comment): may a waiting sequence
  // whose table is `kv` reserve up to `tokens` positions while `running`
  // sequences run?
  bool FitsWatermark(const SequenceKv& kv, int tokens, int running) const;
  // Frees `kv`'s blocks and clears it; returns the bytes freed.
  int64_t Free(SequenceKv* kv);

  // Moves the kept KV of `session_id` (if any) into `kv` (which must be
  // empty) and returns how many leading `tokens` it already holds (0 if
  // none). The session leaves the cache.
  int TakePrefix(const std::string& session_id, const std::vector<int>& tokens, SequenceKv* kv);
  // Keeps `kv` (holding the KV of `tokens`) for the session's next turn.
  void Keep(const std::string& session_id, SequenceKv kv, std::vector<int> tokens, int priority);
  // Forgets a session's kept KV; returns the bytes freed (0 if none).
  int64_t Drop(const std::string& session_id);
  // Frees the least recently used session; returns bytes freed (0: none).
  int64_t EvictLeastRecent();
  int num_sessions() const { return static_cast<int>(sessions_.size()); }
  // One kCachedSession holding per kept session.
  std::vector<KvHolding> Holdings() const;

 private:
  struct CachedSession {
    SequenceKv kv;
    std::vector<int> tokens;  // tokens whose KV is in kv
    int priority = 0;
    uint64_t last_use = 0;  // KvRecencyNow
  };

  // Frees one cached session and forgets it; returns the bytes freed.
  int64_t Erase(std::map<std::string, CachedSession>::iterator it);

  KvCache* const kv_;
  std::map<std::string, CachedSession> sessions_;
  int64_t cached_blocks_ = 0;  // blocks held by sessions_
};

}  // namespace ballast::engine
