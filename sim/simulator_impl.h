// The simulator's private state (simulator.h describes the behaviour).
// simulator.cc: requests, releases and outcomes; sim_control.cc: the
// control plane (placement, activation, eviction).
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "global_scheduler/cluster_state.h"
#include "sim/sim_device.h"
#include "sim/sim_kv_tiers.h"
#include "sim/simulator.h"

namespace ballast::sim {

class Simulator {
 public:
  Simulator(const SimConfig& config, const EngineModel& engine,
            const std::vector<bench::TraceRecord>& trace, double rate_scale, bool record_steps);
  SimResult Run();

 private:
  struct ModelState {
    // Its replicas' devices (loading, ready or draining), one per node, in
    // the order they were placed.
    std::vector<int> devices;
    // Tensor parallelism (tp > 1): `devices` holds each replica's leading
    // GPU; the group's other GPUs (shadows, sim_device.h) by leader, and
    // the leader of each of them.
    std::map<int, std::vector<int>> members;
    std::map<int, int> leader_of;
    bool needs_room = false;
    double last_request = 0;
    std::vector<SimRequest*> waiting;  // for a replica
    struct Arrival {
      double t;
      int prompt, output;
    };
    std::deque<Arrival> window;  // arrivals within demand_window_s (KVPR demand)
    // Sums over `window`, kept as arrivals enter and leave it (Demand is
    // asked per node and model at every placement).
    int64_t window_prompt = 0, window_output = 0;
  };

  // simulator.cc
  void Release(int i);
  void Route(SimRequest* r);
  // Where request r goes: among model r.model's ready replicas whose KV
  // can ever hold it, the one on the least loaded node (running and
  // queued requests of every model on the node's devices, the scheduler's
  // LeastLoaded), ties to the lowest device; else a replica still loading;
  // -1 if none. *ready_capacity: the most KV a ready replica offers (-1:
  // none ready), for the refusal when none can hold r.
  int PickReplica(const SimRequest& r, int64_t* ready_capacity) const;
  int NodeLoad(int d) const;  // running + queued requests on device d's node
  void Done(SimRequest* r);
  void Fail(int i, const std::string& status, const std::string& message);
  // Releases (ok) or aborts record i's dependents; the client saw i end
  // seen_after_s after now (its request path).
  void ReleaseDependents(int i, bool ok, double seen_after_s = 0);
  void ScheduleTick();
  // Runs the events up to `until`; returns how many ran. last_event_: the
  // time of the last that was not a prefetch's expiry.
  int64_t RunEvents(double until);

  // sim_sessions.cc (its comment has the rules)
  struct Session {
    int model = -1;   // of its last finished turn (its KV's model)
    int history = 0;  // tokens of its finished turns (prompts and outputs)
    int device = -1;  // affinity: the GPU of its last turn or prefetch
  };
  // A lease read from below the GPU: the history tokens it covers (0:
  // none), where from and the time its load adds.
  struct Lease {
    int tokens = 0;
    KvOrigin origin = KvOrigin::kRecomputed;
    double seconds = 0;
  };
  int SessionFor(const std::string& id);
  // Sends r to device d: reads a lease from the node's tiers (or its
  // affinity node's) when d keeps none of the session's KV, and queues r
  // there once the KV has loaded.
  void Arrive(SimRequest* r, int d);
  void EnqueueAt(SimRequest* r, int d, double t);
  Lease ReadLease(int session, int model, int node, int priority);
  void Advise(int i);
  // The device an Advise prefetches onto (the scheduler's rule); -1: none.
  int AdviseTarget(int session, int model) const;
  void TurnEnded(const SimRequest& r);
  void FillKvOutcome(const SimRequest& r, bench::RequestOutcome* o) const;
  void SummarizeSessions();
  int NodeOf(int d) const { return node_of_[static_cast<size_t>(d)]; }
  bool Tiers() const { return config_.policy.session_kv == SessionKv::kTiers; }

  // sim_control.cc
  void PlaceInitial();
  void Tick();
  void Activate(int m);
  void MakeRoom(int m);
  void RelieveKvPressure();
  void Drained(int d, int m);
  void Rebalance();
  void FinishMigration();
  // The cluster as heartbeats would report it; built once per instant and
  // control-plane change (a load or a drain bumps `changes_`).
  const std::vector<global_scheduler::NodeInfo>& Nodes();
  int DeviceIndex(const std::string& node_id, const std::string& device) const;
  // The policy's GPUs for a new replica of model m, on a node that holds
  // none of its replicas: one, or for tp > 1 the leader first and then the
  // other parts (Choose's rule); empty if none.
  std::vector<int> Choose(int m);
  // The policy's device for one part of model m among `nodes` less
  // `exclude`; -1 if none.
  int ChooseOne(int m, const std::vector<global_scheduler::NodeInfo>& nodes,
                const std::set<std::string>& exclude);
  // Loads (Load, or LoadShadow on the others) a replica of m on `group`;
  // true if it serves at once (a draining single-GPU replica revived).
  bool LoadGroup(int m, const std::vector<int>& group);
  // The device hooks of device d (tensor-parallel parts need the others).
  SimDevice::Hooks HooksFor(int d);
  // Replicas model m should have: its `replicas`, at most one per node.
  size_t Wanted(int m) const;
  // Whether model m should get another replica now: it has fewer than it
  // wants, and requests wait for one or (a served model) one came within
  // the last control interval.
  bool WantsReplica(int m) const;
  // The device of model m's replica on `node_id`; -1 if none.
  int ReplicaOn(int m, const std::string& node_id) const;
  const std::set<std::string>& BusyOrLeaving();
  // Model m's nominal step on one of its GPUs (SimPolicy's step budget).
  double NominalStep(int m) const { return nominal_step_[static_cast<size_t>(m)]; }
  double Demand(int m);
  double IdleSeconds(const std::string& model) const;

  const SimConfig& config_;
  const EngineModel& engine_;
  const std::vector<bench::TraceRecord>& trace_;
  const double rate_scale_;
  EventQueue events_;
  std::vector<std::unique_ptr<SimDevice>> devices_;
  std::vector<ModelState> models_;
  int node_count_ = 0;
  std::map<std::string, int> model_index_;
  std::vector<double> nominal_step_;  // per model
  // Per trace record (advisories included, unused for them).
  std::vector<std::unique_ptr<SimRequest>> requests_;
  std::vector<bench::RequestOutcome> outcomes_;
  std::vector<std::vector<int>> dependents_;
  int outstanding_ = 0;       // released or to be released, not yet ended
  int advisories_ = 0;        // advisories in the trace
  int64_t expiries_run_ = 0;  // prefetch expiries run (RunEvents)
  double last_event_ = 0;
  bool tick_scheduled_ = false;
  SimStats stats_;
  const bool record_steps_;
  std::vector<SimStepRow> steps_;               // record_steps_
  std::vector<SimArbitrationRow> arbitration_;  // record_steps_
  double last_rebalance_ = 0;
  struct Migration {
    int model = -1, from = -1, to = -1;
  };
  Migration migration_;  // the move under way (model -1: none; one at a time)
  uint64_t changes_ = 0;
  struct Cached {
    double t = -1;
    uint64_t changes = 0;
  };
  Cached nodes_at_, busy_at_;
  std::vector<global_scheduler::NodeInfo> nodes_;
  std::set<std::string> busy_;
  std::vector<int> node_of_;  // per device: its node's index
  std::vector<Session> sessions_;
  std::map<std::string, int> session_index_;
  std::vector<std::unique_ptr<SimKvTiers>> tiers_;  // per node
};

}  // namespace ballast::sim
