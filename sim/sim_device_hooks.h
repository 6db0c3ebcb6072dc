// What a simulated GPU (SimDevice, sim_device.h) calls back into the
// simulator: requests ending, models leaving, a tensor-parallel group's
// GPUs keeping pace, and the records `--step-log` writes. `done` and
// `drained` must be set; each other member's comment says what unset means.
//
// Thread-safety: none (the simulator's single thread).
#pragma once

#include <cstdint>
#include <functional>

#include "node_manager/arbitration_log.h"
#include "sim/engine_model.h"
#include "sim/sim_request.h"
#include "sim/simulator.h"

namespace ballast::sim {

struct SimDeviceHooks {
  std::function<void(SimRequest*)> done;   // a request's last token
  std::function<void(int model)> drained;  // a draining model left
  // Tensor-parallel models this device leads: whether every other GPU of
  // the group can take `bytes` more KV now, and KV taken (> 0) or freed
  // (< 0) there. Unset: tp = 1 models only.
  std::function<bool(int model, int64_t bytes)> group_fits;
  std::function<void(int model, int64_t bytes)> group_kv;
  // A shadow here: the work of the last step of `model` that its leader
  // started, and how many it has started.
  std::function<StepWork(int model)> lead_work;
  std::function<int64_t(int model)> lead_steps;
  // Leading: the fewest steps of `model` the group's other GPUs have
  // started (the lockstep gate).
  std::function<int64_t(int model)> members_steps;
  // Whether the simulation has requests outstanding (remapping's idle
  // ticks stop with them, as the control ticks do). Unset: always.
  std::function<bool()> outstanding;
  // Tells the group's other GPUs (a leader's) or its leader (a shadow's)
  // that `model` stepped here: they may have a step to run now.
  std::function<void(int model)> stepped;
  // Each model step as it ends (unset: none recorded).
  std::function<void(const SimStepRecord&)> step;
  // Each change in a queued request's arbitration state, as the node's
  // log_decisions reports it (entry.id: the request's index; unset:
  // none), with the GPU's free KV bytes then.
  std::function<void(double now_s, const node_manager::ArbitrationEvent&, int64_t kv_free)>
      arbitration;
};

}  // namespace ballast::sim
