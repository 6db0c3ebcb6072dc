// The simulator's virtual clock: a queue of timed callbacks run in time
// order (ties in the order they were scheduled, so a run is deterministic).
// Nothing sleeps and nothing reads wall time: `now()` is the time of the
// event being run. Cancelling is the caller's business (callbacks check a
// version they captured).
//
// Thread-safety: none; one simulation runs on one thread.
#pragma once

#include <cstdint>
#include <functional>
#include <queue>
#include <utility>
#include <vector>

namespace ballast::sim {

class EventQueue {
 public:
  // Runs `fn` at time `t` (never before now: an earlier time runs now).
  void At(double t, std::function<void()> fn) {
    heap_.push(Event{t < now_ ? now_ : t, next_seq_++, std::move(fn)});
  }
  // Runs events in order until none is left or the next is after `until`.
  // Returns the number of events run.
  int64_t RunUntil(double until) {
    int64_t n = 0;
    while (!heap_.empty() && heap_.top().t <= until) {
      Event e = heap_.top();
      heap_.pop();
      now_ = e.t;
      e.fn();
      ++n;
    }
    return n;
  }
  double now() const { return now_; }
  bool empty() const { return heap_.empty(); }
  double next_time() const { return heap_.top().t; }

 private:
  struct Event {
    double t;
    uint64_t seq;
    std::function<void()> fn;
    bool operator>(const Event& o) const { return t != o.t ? t > o.t : seq > o.seq; }
  };
  std::priority_queue<Event, std::vector<Event>, std::greater<>> heap_;
  double now_ = 0;
  uint64_t next_seq_ = 0;
};

}  // namespace ballast::sim
