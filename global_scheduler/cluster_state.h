// ClusterState: the scheduler's view of its nodes — address, liveness,
// last reported statistics, resident models — and the scheduler-side count
// of requests in flight on each node.
//
// Liveness rule: a node is alive from Register until no heartbeat has
// arrived for `heartbeat_timeout`; SweepDead() (called periodically) then
// marks it dead and forgets its replicas. A heartbeat from a dead or
// unknown node is answered with "register again".
//
// Identity: a node is its id plus an incarnation (random per process
// start). Register refuses (ALREADY_EXISTS) an id held by a live node of
// another incarnation at another address unless the caller says the old
// one is gone; a heartbeat from a replaced incarnation is answered
// "replaced" (that process must stop).
//
// Suspicion: a node whose RPC failed at the transport (MarkSuspect) is
// skipped by NodesWithModel at once, until its next heartbeat clears it or
// SweepDead declares it dead.
//
// Routing version: a counter bumped whenever what NodesWithModel answers
// may change (a node registers or dies, a replica appears, leaves or changes
// state). Requests waiting for a replica block on it (WaitForRoutingChange)
// instead of polling.
//
// Thread-safety: all methods are thread-safe (one mutex). The clock is
// injected so tests control time.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "ballast/v1/node.pb.h"

namespace ballast::global_scheduler {

using Clock = std::function<absl::Time()>;

struct NodeInfo {
  std::string node_id;
  std::string address;
  bool alive = false;
  absl::Time last_heartbeat;
  std::vector<v1::DeviceState> devices;
  std::vector<v1::ResidentModel> models;
  int inflight = 0;           // counted by the scheduler
  int reported_inflight = 0;  // from the node's heartbeat
  int64_t generation = 0;     // bumps on every (re-)registration
  std::string incarnation;    // empty: the node did not send one
  bool suspect = false;       // an RPC to it failed; skipped by routing
};

// What a heartbeat finds (ClusterState::Heartbeat).
enum class HeartbeatResult { kOk, kReregister, kReplaced };

class ClusterState {
 public:
  ClusterState(absl::Duration heartbeat_timeout, Clock clock);

  // Adds or replaces a node; it is alive from now. ALREADY_EXISTS (naming
  // the id and the live node's address) if the id is held by a live node of
  // another incarnation at another address, unless `replace_live` (the
  // caller found the old address dead).
  absl::Status Register(const v1::RegisterNodeRequest& req, bool replace_live = false);
  // kReregister if the node is unknown or dead (it must register again);
  // kReplaced if the heartbeat's incarnation is not the registered one.
  HeartbeatResult Heartbeat(const v1::HeartbeatRequest& req);
  // Routing skips the node until its next heartbeat (an RPC to it failed).
  void MarkSuspect(const std::string& node_id);
  // Bumps the routing version: something routing depends on outside this
  // class changed (a model's load failed, it was registered or removed),
  // so requests waiting for a replica look again.
  void NotifyRoutingChange();
  // Marks nodes whose last heartbeat is older than the timeout dead.
  // Returns the ids of the nodes newly marked dead.
  std::vector<std::string> SweepDead();
  // Records a model loaded by a LoadModel call (before the next heartbeat).
  void AddResident(const std::string& node_id, const v1::ResidentModel& m);
  void RemoveResident(const std::string& node_id, const std::string& model);
  // Sets a resident model's state (e.g. DRAINING as an eviction starts, so
  // routing stops before the node's next heartbeat says so).
  void SetResidentState(const std::string& node_id, const std::string& model, v1::ModelState state);

  // Live, unsuspected nodes where `model` is resident and READY.
  std::vector<std::string> NodesWithModel(const std::string& model) const;
  // Among `candidates`, the live node with the fewest requests in flight
  // (scheduler's count plus the node's reported queue); ties by id.
  std::optional<std::string> LeastLoaded(const std::vector<std::string>& candidates) const;
  std::vector<std::string> LiveNodes() const;
  bool IsAlive(const std::string& node_id) const;
  std::optional<NodeInfo> Get(const std::string& node_id) const;
  std::vector<NodeInfo> Snapshot() const;

  void AddInflight(const std::string& node_id, int delta);

  uint64_t RoutingVersion() const ABSL_LOCKS_EXCLUDED(mu_);
  // Blocks until the routing version differs from `seen` or `timeout`
  // passes (real time). Returns the version then.
  uint64_t WaitForRoutingChange(uint64_t seen, absl::Duration timeout) const
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const absl::Duration timeout_;
  Clock clock_;
  mutable absl::Mutex mu_;
  std::map<std::string, NodeInfo> nodes_ ABSL_GUARDED_BY(mu_);
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t routing_version_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ballast::global_scheduler
