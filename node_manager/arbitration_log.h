// ArbitrationTracker: what changed for each queued request from one
// arbitration decision to the next, so a device can log why its requests
// wait (node.arbitration.log_decisions) and the simulator can write the
// same events (`ballast simulate --step-log`'s arbitration-<rate>.csv),
// to be lined up request by request (scripts/arbitration-timeline.py).
//
// A request's state at a decision: on time or late (served back to back in
// the decision's order from its predicted costs, does its prefill end
// after its deadline?) and whether its model refused it for KV room at its
// last admission attempt. An event is reported for a request seen for the
// first time (kQueued), for each change of its state (kLate, kOnTime,
// kKvRefused, kKvFits), when the decision rejects it (kRejected), and when
// it is no longer queued at a later decision (kLeft: admitted or
// cancelled). Preempted requests, which arbitration leaves out, are not
// tracked.
//
// Thread-safety: thread-compatible (a device's step thread, or the
// simulator's loop, owns one).
#pragma once

#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"

namespace ballast::node_manager {

// One queued request at a decision. Times are seconds from the decision.
struct ArbitrationEntry {
  std::string id;
  std::string model;
  int tokens = 0;           // prompt tokens still to prefill
  double arrival_s = 0;     // when it arrived (<= 0)
  double start_s = 0;       // its prefill's predicted start in the order
  double deadline_s = 0;    // its TTFT deadline
  double cost_s = 0;        // its predicted prefill time
  bool late = false;        // start_s + cost_s > deadline_s (its prefill ends late)
  bool kv_refused = false;  // its model found no KV room for it last time
  bool rejected = false;    // this decision refused it (RESOURCE_EXHAUSTED)
  // Its model's prefill cost fit (PrefillCostModel) the cost came from.
  double fit_intercept_ms = 0, fit_ms_per_token = 0;
  int fit_steps = 0;
};

enum class ArbitrationChange { kQueued, kLate, kOnTime, kKvRefused, kKvFits, kRejected, kLeft };

// "queued", "late", "on_time", "kv_refused", "kv_fits", "rejected", "left".
const char* ArbitrationChangeName(ArbitrationChange c);

struct ArbitrationEvent {
  ArbitrationChange change = ArbitrationChange::kQueued;
  // At this decision (kLeft: as last seen, its times then).
  ArbitrationEntry entry;
  double queued_s = 0;  // kLeft: from the first decision that saw it to now
};

class ArbitrationTracker {
 public:
  // The events of a decision at `now_s` (any clock, seconds) over the
  // requests queued then, in the decision's order.
  std::vector<ArbitrationEvent> Decide(double now_s, const std::vector<ArbitrationEntry>& queued);

 private:
  struct Seen {
    ArbitrationEntry last;
    double first_s = 0;
  };
  absl::flat_hash_map<std::string, Seen> seen_;
};

}  // namespace ballast::node_manager
