// The simulator's records of a request on a simulated GPU (SimRequest)
// and of what a GPU keeps for it (cached sessions, counters), shared by
// SimDevice (sim_device.h), the simulator and its session tiers.
//
// Thread-safety: plain data; the simulator's single thread.
#pragma once

#include <cstdint>

namespace ballast::sim {

// Where a turn's history KV came from (bench's kv_source names them).
enum class KvOrigin { kNone, kDevice, kAdvised, kDram, kSsd, kPeer, kRecomputed };

struct SimRequest {
  int index = 0;  // into the simulator's requests
  int model = 0;  // into the catalogue
  double release = 0, deadline = 0;
  int prompt = 0, output = 0;  // prompt: the history's tokens included
  int64_t kv_bytes = 0;        // its whole KV: prompt and output
  // KV held on its GPU now (policy.kv_paged: its blocks so far; else
  // kv_bytes from admission to its end).
  int64_t kv_held = 0;
  // kv_paged preemption (sim_device_kv.cc): tokens generated before its
  // last preemption, whose KV its next prefill recomputes with the
  // prompt's (it prefills prompt + recompute tokens); times preempted;
  // waiting to be admitted again (ahead of the arbitration's order); and
  // its admission's place among the GPU's (larger: newer).
  int recompute = 0;
  int preemptions = 0;
  bool requeued = false;
  int64_t admit_order = 0;
  int prefilled = 0, generated = 0;
  double admitted = -1, first_token = -1, end = -1;
  // Multi-turn sessions (sim_sessions.cc): the session (-1: none), its
  // tokens before this turn, and where the request was sent.
  int session = -1, history = 0, priority = 0, device = -1;
  // A lease the node read from its tiers (or a peer's) on arrival: the
  // history tokens it covers (0: none) and where from.
  int lease_tokens = 0;
  KvOrigin lease_origin = KvOrigin::kRecomputed;
  double load_s = 0;  // time its KV's load added before it was queued
  // Set at admission: where the history's KV came from and its tokens
  // not prefilled.
  KvOrigin origin = KvOrigin::kNone;
  int reused = 0;
  bool kv_waited = false;   // refused admission for KV room at least once
  bool kv_refused = false;  // ... at its last try (cleared when admitted)
  // Left out of its model's step in flight: that step was planned ahead
  // and its blocks did not fit (policy.ahead_growth_asks_nobody).
  bool sits_out = false;
};

// The tokens a request prefills: its prompt, and after a preemption the
// output it had generated too.
inline int PrefillEnd(const SimRequest& r) { return r.prompt + r.recompute; }

// policy.kv_paged's counters, per GPU.
struct KvCounters {
  int64_t preemptions = 0;
  int64_t recomputed_tokens = 0;  // KV tokens preempted requests gave back
  // Growths that waited for a victim model's steps (policy.
  // growth_waits_for_victims), and the seconds they waited in all.
  int64_t victim_drains = 0;
  double victim_drain_s = 0;
};

// A session's KV kept on a GPU between its turns.
struct CachedSession {
  int model = 0;
  int tokens = 0;
  int64_t bytes = 0;
  int64_t recency = 0;    // larger = more recently kept or advised
  bool prefetch = false;  // moved here by an Advise and not used yet
  double ready_at = 0;    // prefetch: when its load ends
  double expires = 0;     // prefetch: when it is dropped unused
};

struct SessionCounters {
  int64_t shed = 0;              // idle sessions' KV given back for room
  int64_t prefetch_shed = 0;     // ... of which unused prefetches
  int64_t prefetch_expired = 0;  // unused prefetches dropped at their deadline
  int64_t unloaded = 0;          // dropped with their model's weights
};

enum class ModelPhase { kAbsent, kLoading, kReady, kDraining };

}  // namespace ballast::sim
