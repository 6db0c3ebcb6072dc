// The eviction decisions of a node's session KV tiers below the device
// (DRAM, SSD), as pure functions of plain data: which copy a tier gives up
// when it is over budget, and what giving it up leaves. KvTierStore applies
// them to its chunks (under its lock, with its files and writer); the
// simulator (sim/sim_kv_tiers.h) applies the same functions to whole
// sessions on a virtual clock. Written once, here.
//
// The rules (kv_tier_store.h states the tiers around them):
//   * DRAM: only a copy held in DRAM whose SSD write is not pending may be
//     evicted (a pending one is the only copy until written). Lowest
//     priority first, then least recently used. The victim's DRAM copy
//     goes; with an SSD copy it lives on there (demoted), else it is gone
//     from its lowest tier (dropped: its sessions recompute from it on).
//   * SSD: only a copy on SSD. Copies no session names (found on disk at a
//     restart) first, then lowest priority, then least recently used. A
//     victim still in DRAM stays there only; else it is dropped.
//   * Ties (equal rank): the first candidate in the caller's order wins.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>

namespace ballast::node_manager {

// One unit of KV below the device: a chunk (the node) or a session's whole
// KV (the simulator).
struct TierCopy {
  bool in_dram = false;
  bool on_ssd = false;
  bool ssd_pending = false;  // its SSD write is queued or running
  bool named = true;         // some session names it
  int priority = 0;          // lower gives way first
  uint64_t last_use = 0;     // larger = more recent
};

// What evicting a copy from a tier leaves.
enum class TierEviction {
  kDemote,        // DRAM victim: its DRAM copy goes, its SSD copy stays
  kKeepDramOnly,  // SSD victim: its file goes, its DRAM copy stays
  kDrop,          // its last copy goes: gone from every tier
};

bool DramEvictable(const TierCopy& c);
// Whether `a` is evicted from DRAM before `b` (both evictable).
bool DramEvictsBefore(const TierCopy& a, const TierCopy& b);
TierEviction DramEviction(const TierCopy& c);

bool SsdEvictable(const TierCopy& c);
// Whether `a` is evicted from SSD before `b` (both evictable).
bool SsdEvictsBefore(const TierCopy& a, const TierCopy& b);
TierEviction SsdEviction(const TierCopy& c);

// The next victim among [begin, end) (`end` if none may be evicted):
// view(*it) is the element's TierCopy.
template <typename It, typename View>
It PickDramVictim(It begin, It end, View view) {
  It victim = end;
  for (It it = begin; it != end; ++it) {
    const TierCopy c = view(*it);
    if (DramEvictable(c) && (victim == end || DramEvictsBefore(c, view(*victim)))) victim = it;
  }
  return victim;
}

template <typename It, typename View>
It PickSsdVictim(It begin, It end, View view) {
  It victim = end;
  for (It it = begin; it != end; ++it) {
    const TierCopy c = view(*it);
    if (SsdEvictable(c) && (victim == end || SsdEvictsBefore(c, view(*victim)))) victim = it;
  }
  return victim;
}

}  // namespace ballast::node_manager
