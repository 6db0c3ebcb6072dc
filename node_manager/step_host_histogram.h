// StepHostHistogram: the cumulative distribution of one device's per-step
// host time — the part of an engine step spent outside the executor's
// forward (draining the inbox, planning, issuing KV loads, streaming
// tokens, finishing sequences, exporting session KV). The GPU idles for
// it unless steps overlap (issue 13); `ballast_node_step_host_seconds`
// exports it.
//
// StepThreadTime: where the device's step thread spends its wall time,
// cumulative; `ballast_node_step_thread_seconds_total` exports it. A step
// thread near 100% busy (little idle) is what limits a device whose
// engines' steps overlap.
//
// Thread-compatible value types (DeviceWorker guards its copies).
#pragma once

#include <array>
#include <chrono>
#include <cstdint>

namespace ballast::node_manager {

struct StepHostHistogram {
  // Upper bounds (seconds) of the buckets; one more bucket takes the rest.
  static constexpr std::array<double, 10> kBoundsS = {25e-6, 50e-6, 100e-6, 200e-6, 500e-6,
                                                      1e-3,  2e-3,  5e-3,   10e-3,  50e-3};
  std::array<int64_t, kBoundsS.size() + 1> counts{};  // per bucket, not cumulative
  double sum_s = 0;
  int64_t steps = 0;

  void Add(double seconds) {
    size_t b = 0;
    while (b < kBoundsS.size() && seconds > kBoundsS[b]) ++b;
    ++counts[b];
    sum_s += seconds;
    ++steps;
  }
};

struct StepThreadTime {
  double begin_s = 0;  // arbitration, then planning and launching steps
  // Finishing steps: tokens, finished sequences; and the wait for the
  // device when the loop waits on a step's event (lockstep, or one step
  // in flight).
  double finish_s = 0;
  double idle_s = 0;   // waiting for work or for a step's device work to end
  double other_s = 0;  // tasks, evictions, remapping ticks, the loop itself

  StepThreadTime& operator+=(const StepThreadTime& o) {
    begin_s += o.begin_s;
    finish_s += o.finish_s;
    idle_s += o.idle_s;
    other_s += o.other_s;
    return *this;
  }
};

// How each step on the device was begun (cumulative counts; disjoint).
// With rolling and ahead steps a model's stream idles between its steps
// for every one counted as alone or late.
struct StepStarts {
  int64_t alone = 0;  // none of its model's steps in flight
  int64_t ahead = 0;  // queued behind its model's running step
  // Queued behind a step of its model whose device work had already ended
  // (as far as the step thread had been told).
  int64_t late = 0;

  StepStarts& operator+=(const StepStarts& o) {
    alone += o.alone;
    ahead += o.ahead;
    late += o.late;
    return *this;
  }
};

// Waits for every step in flight (rolling steps) before work that needs
// the device's engines quiescent, by cause (cumulative). Each one ends the
// overlap of the models' steps until the next ones begin; a wait with no
// step in flight is not counted.
struct StepDrains {
  int64_t reclaim = 0;  // idle session KV or newer running sequences shed for a model's KV
  int64_t lender = 0;   // only the steps of a model about to lend weight layers
  int64_t shed = 0;     // only the steps of the models whose newer sequences are shed
  int64_t remap = 0;    // a remapping revert (a model taking its layers back)
  int64_t between = 0;  // tasks, a model leaving, stop
  int64_t idle = 0;     // no step-end signal within the wait limit

  StepDrains& operator+=(const StepDrains& o) {
    reclaim += o.reclaim;
    lender += o.lender;
    shed += o.shed;
    remap += o.remap;
    between += o.between;
    idle += o.idle;
    return *this;
  }
};

// A device's KV reclaims (DeviceWorker::ReclaimFor): a model's planner
// asking the device's other models for room, at a step boundary, when an
// admission or a running sequence's growth does not fit (cumulative).
struct KvReclaims {
  // The other models' idle session KV, newer running sequences or weight
  // layers (remapping) were asked for the room, after the steps in flight
  // that could read them were finished (every step, or a lender's own:
  // StepDrains). Counts asks, not blocked requests: a planner asks again
  // while an ask frees something.
  int64_t asked = 0;
  // An admission's ask that no other model could answer (no idle session
  // KV seen, no layer to lend): answered at once, no wait.
  int64_t nothing = 0;
};

// KV compaction for weights (DeviceWorker::CompactForWeights), cumulative.
struct KvCompactions {
  int64_t drains = 0;       // times slabs were drained
  int64_t moved_bytes = 0;  // KV blocks moved to other slabs
  int64_t freed_bytes = 0;  // slab pages given back by the drains
  int64_t failed = 0;       // a model's blocks that could not move (left in place)
};

// A device's request arbitration (DeviceWorker::Arbitrate).
struct ArbitrationStats {
  int64_t decisions = 0;        // passes that ordered a non-empty queue
  int64_t rejected = 0;         // requests refused (unmeetable SLO, or overload)
  int64_t expected_late = 0;    // in the last decision
  int64_t urgent_steps = 0;     // steps run at the greatest stream priority
  double last_decision_us = 0;  // time the last decision took
};

// Charges the step thread's time to the activity it is in: Switch
// charges the time since the last switch to the current activity and makes
// `next` current (returning the previous one, to switch back); Take
// returns what was charged since the last Take. Step thread only.
class StepThreadClock {
 public:
  using Activity = double StepThreadTime::*;
  Activity Switch(Activity next) {
    Charge();
    const Activity prev = current_;
    current_ = next;
    return prev;
  }
  StepThreadTime Take() {
    Charge();
    StepThreadTime t = charged_;
    charged_ = {};
    return t;
  }

 private:
  void Charge() {
    const auto now = std::chrono::steady_clock::now();
    charged_.*current_ += std::chrono::duration<double>(now - since_).count();
    since_ = now;
  }
  Activity current_ = &StepThreadTime::other_s;
  std::chrono::steady_clock::time_point since_ = std::chrono::steady_clock::now();
  StepThreadTime charged_;
};

}  // namespace ballast::node_manager
