// DeviceWorker's loop with rolling_steps (device_worker.h): each model's
// step is finished when its own device work ends and its next one begins
// at once, instead of every model waiting for the pass's slowest step;
// with ahead_steps, each model's next step is queued behind its current
// one (BeginAheadSteps).
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "node_manager/device_worker.h"

namespace ballast::node_manager {
namespace {

// Remapping's reversion waits for every step in flight; under continuous
// load there is always one, so it is forced this often.
constexpr absl::Duration kRemapTickEvery = absl::Milliseconds(100);
// With steps in flight, the longest wait for any of their device-done
// callbacks (or new work) before waiting on the steps' events instead.
constexpr absl::Duration kCallbackLimit = absl::Seconds(1);

}  // namespace

void DeviceWorker::RollingLoop() {
  absl::Time last_tick = absl::InfinitePast();
  while (true) {
    const int64_t seen = signal_->Events();  // before this iteration looks at anything
    RollingIntake in = TakeRollingIntake();
    if (remap_) remap_->NoteEngines(in.engines);
    const absl::Time now = absl::Now();
    const bool tick = remap_ && now - last_tick >= kRemapTickEvery;
    if (!RunBetweenSteps(&in, tick, now)) return;
    if (tick) last_tick = now;
    // Steps may also be finished inside BeginSteps (a model short of KV
    // reclaims from the others, which first finishes every step in flight
    // unless an admission's ask finds nothing to take).
    const int64_t finished_before = finished_steps_;
    FinishSteps(TakeEndedSteps());
    // Every model not in flight with work begins its next step.
    const bool began = BeginSteps(std::move(in.engines));
    const bool finished = finished_steps_ != finished_before;
    if (OneEngineInFlight()) {
      FinishOldestStep();
      continue;
    }
    if (finished && in_flight_.empty()) continue;  // their models may have more work
    if (in_flight_.empty() && !began && balloon_) {
      balloon_->arena()->Replenish();  // idle: get the next slabs ready
    }
    NotifyLastSteps();
    const bool woken = AwaitRollingWake(seen);
    // Steps in flight and no callback for that long: wait on their events
    // (a lost signal, or a sticky CUDA error: the wait returns the error,
    // which fails the steps' requests).
    if (!woken) Drain(&StepDrains::idle);
  }
}

// Takes the pass's engines, tasks and retiring engines, and charges the
// step thread's clock and step starts into the guarded counters.
DeviceWorker::RollingIntake DeviceWorker::TakeRollingIntake() {
  RollingIntake in;
  absl::MutexLock lock(&mu_);
  thread_time_ += clock_.Take();
  step_starts_ += std::exchange(starts_, {});
  step_drains_ += std::exchange(drains_, {});
  in.stop = stop_;
  in.tasks.swap(tasks_);
  in.retiring.swap(retiring_);
  in.engines = EnginesInOrder();
  return in;
}

// Runs the pass's between-step work: tasks, retiring engines and the
// remapping tick; false (after handing the work back) on stop.
bool DeviceWorker::RunBetweenSteps(RollingIntake* in, bool tick, absl::Time now) {
  // Tasks and retiring engines need every engine between steps; the
  // remapping tick only when it reverts (TickRemap's quiesce).
  if (in->stop || !in->tasks.empty() || !in->retiring.empty()) Drain(&StepDrains::between);
  if (in->stop) {
    // Tasks not run are failed by Stop, after the thread is gone.
    absl::MutexLock lock(&mu_);
    for (auto& t : in->tasks) tasks_.push_back(std::move(t));
    for (auto& e : in->retiring) retiring_.push_back(std::move(e));
    return false;
  }
  for (auto& t : in->tasks) t(true);
  for (auto& e : in->retiring) {
    e->Close(absl::UnavailableError(absl::StrCat("model ", e->name(), " was evicted")));
  }
  in->retiring.clear();
  if (tick) TickRemap(in->engines, now);
  return true;
}

// Removes from in_flight_ the steps whose device work has ended.
std::vector<DeviceWorker::InFlight> DeviceWorker::TakeEndedSteps() {
  // The steps whose device work has ended: an engine's steps end in
  // order, so one that has ended ends those begun before it (whose own
  // callback may not have been asked for).
  std::vector<InFlight> done, running;
  for (size_t i = 0; i < in_flight_.size(); ++i) {
    bool ended = false;
    for (size_t j = i; j < in_flight_.size() && !ended; ++j) {
      ended = in_flight_[j].engine == in_flight_[i].engine && in_flight_[j].device_done->load();
    }
    (ended ? done : running).push_back(std::move(in_flight_[i]));
  }
  in_flight_ = std::move(running);
  return done;
}

// Finishes the oldest step in flight, waiting on its own event.
void DeviceWorker::FinishOldestStep() {
  // One model on the device: wait on its oldest step's own event, as
  // lockstep passes do (its ahead step, if any, keeps the device
  // busy meanwhile). A signal after every step costs more (as a host
  // function on the stream, it delayed the stream's next work until it
  // had run: a 130M model's batch-1 TPOT went from 0.30 to 0.39 ms on
  // an H200).
  std::vector<InFlight> oldest;
  oldest.push_back(std::move(in_flight_.front()));
  in_flight_.erase(in_flight_.begin());
  FinishSteps(std::move(oldest));
}

// Asks for the device-done callback of each engine's last step in flight.
void DeviceWorker::NotifyLastSteps() {
  // Several models' steps on the device: each one's end wakes this
  // thread. Only an engine's last step can ask (the signal follows the
  // engine's last queued work); its earlier ones end before it.
  for (size_t i = 0; i < in_flight_.size(); ++i) {
    const bool last =
        std::none_of(in_flight_.begin() + static_cast<std::ptrdiff_t>(i) + 1, in_flight_.end(),
                     [&](const InFlight& later) { return later.engine == in_flight_[i].engine; });
    if (last) Notify(&in_flight_[i]);
  }
}

// Sleeps (charged as idle) until woken; whether it was before the limit.
bool DeviceWorker::AwaitRollingWake(int64_t seen) {
  // Until a step's device work ends, work arrives or the worker stops.
  // Idle, the loop also wakes to replenish slabs (as lockstep does).
  clock_.Switch(&StepThreadTime::idle_s);
  const bool woken = arbitration_.poll_steps && !in_flight_.empty()
                         ? PollSteps(seen, kCallbackLimit)
                         : signal_->AwaitChange(
                               seen, in_flight_.empty() ? absl::Milliseconds(50) : kCallbackLimit);
  clock_.Switch(&StepThreadTime::other_s);
  return woken;
}

bool DeviceWorker::OneEngineInFlight() const {
  return !in_flight_.empty() &&
         std::all_of(in_flight_.begin(), in_flight_.end(),
                     [&](const InFlight& f) { return f.engine == in_flight_[0].engine; });
}

bool DeviceWorker::PollSteps(int64_t seen, absl::Duration limit) {
  const absl::Time until = absl::Now() + limit;
  for (int spin = 1;; ++spin) {
    bool ended = false;
    for (size_t i = 0; i < in_flight_.size(); ++i) {
      InFlight& f = in_flight_[i];
      // An engine's first entry is its oldest step; a later one has ended
      // once all of the engine's have.
      const bool oldest =
          std::none_of(in_flight_.begin(), in_flight_.begin() + static_cast<std::ptrdiff_t>(i),
                       [&](const InFlight& earlier) { return earlier.engine == f.engine; });
      if (f.device_done->load() ||
          (oldest ? f.engine->OldestStepDeviceEnded() : f.engine->StepDeviceEnded())) {
        f.device_done->store(true);
        ended = true;
      }
    }
    if (ended || signal_->Events() != seen) return true;
    if (spin % 256 == 0 && absl::Now() > until) return false;
  }
}

void DeviceWorker::Notify(InFlight* f) {
  if (f->notified) return;
  f->notified = true;
  if (arbitration_.poll_steps) return;  // PollSteps looks instead
  std::function<void()> done = [done = f->device_done, signal = signal_] {
    done->store(true);
    signal->Bump();
  };
  if (arbitration_.notify_device_done) {
    arbitration_.notify_device_done(*f->engine, std::move(done));
  } else {
    f->engine->NotifyWhenDeviceDone(std::move(done));
  }
}

bool DeviceWorker::BeginAheadSteps() {
  bool did = false;
  const size_t n = in_flight_.size();
  for (size_t i = 0; i < n; ++i) {
    const std::shared_ptr<engine::ModelEngine> e = in_flight_[i].engine;  // in_flight_ grows
    if (!e->CanBeginAhead() || !e->HasWork()) continue;
    // Several models in flight: each step's end is signalled after it, so
    // this one's must be asked for before its successor is queued (one
    // model alone waits on its oldest step's event).
    if (!OneEngineInFlight()) Notify(&in_flight_[i]);
    const bool late = e->StepDeviceEnded();  // its stream had nothing left
    const absl::Time t0 = absl::Now();
    if (!e->BeginStep(engine::StepUrgency::kDefault)) continue;
    did = true;
    ++(late ? starts_.late : starts_.ahead);
    InFlight f = Began(e, t0);
    for (InFlight& other : in_flight_) {
      if (other.engine != e) other.overlapped = f.overlapped = true;
    }
    in_flight_.push_back(std::move(f));
  }
  return did;
}

}  // namespace ballast::node_manager
