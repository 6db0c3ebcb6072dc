// SimKvTiers: one simulated node's session KV tiers below its GPUs, DRAM
// and SSD, as node_manager::KvTierStore keeps them, with a whole session's
// KV as one unit, evicted by the node's own rules
// (node_manager/kv_tier_policy.h).
//
// Rules (the store's, kv_tier_store.h, on a virtual clock):
//  * A copy is of one model's KV (the store keys chunks by the model's
//    fingerprint): Find and Read see only a copy of the model asked for.
//  * Write-through. Put (a finished turn, or KV fetched from a peer) keeps
//    the session's KV in DRAM and, with an SSD tier, writes it to SSD; it
//    replaces the session's older copy (the store's SetSession frees the
//    chunks the new turn superseded). The SSD write is taken as done at
//    once (no SSD write rate was measured), in the store's order: DRAM is
//    trimmed while the write is pending (the new copy cannot go then),
//    then SSD is trimmed, then DRAM again.
//  * Eviction: kv_tier_policy.h. A DRAM victim with an SSD copy is demoted
//    (its DRAM copy goes); one without is dropped, as is an SSD victim not
//    in DRAM. A dropped session recomputes at its next turn.
//  * Read (a turn's lease, an Advise's prefetch, a peer's fetch): the copy
//    is used (recency); a copy read from SSD is promoted into DRAM.
//  * Granularity: the store keeps chunks and deduplicates them, so a turn
//    writes only its new chunks and a lease may cover part of a prompt;
//    here a session's copy is all or nothing, and a new turn rewrites it
//    whole into DRAM.
//  * A budget of 0 is no such tier; with neither, nothing is kept.
//
// Thread-safety: none (the simulator's single thread).
#pragma once

#include <cstdint>
#include <map>

#include "node_manager/kv_tier_policy.h"

namespace ballast::sim {

class SimKvTiers {
 public:
  SimKvTiers(int64_t dram_bytes, int64_t ssd_bytes)
      : dram_budget_(dram_bytes), ssd_budget_(ssd_bytes) {}

  bool enabled() const { return dram_budget_ > 0 || ssd_budget_ > 0; }

  struct Held {
    int tokens = 0;  // 0: none held
    int64_t bytes = 0;
    bool in_dram = false, on_ssd = false;
  };
  // Where the session's copy of `model`'s KV is now, without using it
  // (tokens 0: none, or a copy of another model).
  Held Find(int session, int model) const;
  // Keeps `tokens` tokens (`bytes`) of the session's KV of `model` (see
  // the rules); it replaces the session's copy of any model.
  void Put(int session, int model, int tokens, int64_t bytes, int priority);
  // Uses the session's copy of `model`'s KV: as it was found (in_dram: a
  // DRAM read, else an SSD read, promoted into DRAM now); tokens 0 if none
  // (a copy of another model is left alone).
  Held Read(int session, int model);

  struct Counters {
    int64_t demoted = 0;      // DRAM evictions that left the SSD copy
    int64_t ssd_evicted = 0;  // SSD evictions (a DRAM copy may stay)
    int64_t dropped = 0;      // sessions' KV gone from their lowest tier
  };
  const Counters& counters() const { return counters_; }
  int64_t dram_used() const { return dram_used_; }
  int64_t ssd_used() const { return ssd_used_; }

 private:
  struct Copy {
    node_manager::TierCopy c;
    int model = -1;
    int tokens = 0;
    int64_t bytes = 0;
  };
  using Map = std::map<int, Copy>;  // by session: deterministic order

  void Erase(Map::iterator it);
  void TrimDram();
  void TrimSsd();

  const int64_t dram_budget_, ssd_budget_;
  Map copies_;
  int64_t dram_used_ = 0, ssd_used_ = 0;
  uint64_t clock_ = 0;
  Counters counters_;
};

}  // namespace ballast::sim
