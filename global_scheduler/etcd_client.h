// The scheduler's etcd v3 client (its gRPC API: proto/etcd) and the leader
// election two schedulers run on it, for a highly available pair sharing
// one etcd store (etcd_state_store.h).
//
// EtcdClient: synchronous Range/Txn calls with a deadline each; errors name
// the endpoint and the call (UNAVAILABLE when etcd cannot be reached).
//
// LeaderElection (etcd's own recipe): a candidate holds a lease of ttl
// seconds and puts `key` = its id, attached to the lease, in a transaction
// that succeeds only if the key does not exist (create_revision == 0).
// Losers watch the key and try again when it is deleted: the leader's
// lease expired (it died or lost etcd for ttl) or it resigned. A campaign
// rides out etcd being unreachable (backing off); only Cancel ends it.
// The leader renews its lease every ttl/4; once no renewal sent in the
// last 3/4 of a ttl was confirmed, or etcd reports the lease gone, it has
// lost and calls on_lost once (the scheduler process then exits: a deposed
// leader must not act), before etcd can expire the lease and a standby
// win. Every write of the etcd state store is fenced by the leader key's
// create_revision, so a leader that lost its lease cannot write even
// before it notices. on_lost must not destroy the election (its thread
// runs it).
//
// Thread-safety: EtcdClient is thread-safe. LeaderElection: Campaign and
// Resign from one thread, Cancel from any; on_lost runs on its keep-alive
// thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "etcd/etcdserverpb/rpc.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace ballast::global_scheduler {

class EtcdClient {
 public:
  // endpoints: a gRPC target ("127.0.0.1:2379", or "ipv4:a:2379,b:2379"
  // for several members, tried in turn). timeout: each call's deadline.
  static absl::StatusOr<std::shared_ptr<EtcdClient>> Create(const std::string& endpoints,
                                                            absl::Duration timeout);

  // Every key with `prefix` (a plain range when prefix_range is false: the
  // key alone), in key order.
  absl::StatusOr<std::vector<mvccpb::KeyValue>> Range(const std::string& key,
                                                      bool prefix_range) const;
  absl::StatusOr<etcdserverpb::TxnResponse> Txn(const etcdserverpb::TxnRequest& req) const;
  absl::StatusOr<int64_t> LeaseGrant(int64_t ttl_s) const;
  absl::Status LeaseRevoke(int64_t id) const;

  // The end of the range of every key starting with `prefix`.
  static std::string PrefixEnd(const std::string& prefix);

  const std::string& endpoints() const { return endpoints_; }
  etcdserverpb::Lease::Stub* lease() const { return lease_.get(); }
  etcdserverpb::Watch::Stub* watch() const { return watch_.get(); }
  absl::Duration timeout() const { return timeout_; }

 private:
  EtcdClient() = default;
  absl::Status Error(const grpc::Status& st, const std::string& call) const;

  std::string endpoints_;
  absl::Duration timeout_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<etcdserverpb::KV::Stub> kv_;
  std::unique_ptr<etcdserverpb::Lease::Stub> lease_;
  std::unique_ptr<etcdserverpb::Watch::Stub> watch_;
};

struct LeaderElectionOptions {
  std::string key;  // e.g. "/ballast/leader"
  std::string id;   // this candidate (the scheduler's address and pid)
  // Lease time-to-live in seconds: a dead leader is replaced within about
  // this long (plus one watch round trip). Default 5.
  int64_t ttl_s = 5;
};

class LeaderElection {
 public:
  LeaderElection(std::shared_ptr<EtcdClient> client, LeaderElectionOptions options);
  ~LeaderElection();  // stops the keep-alive; does not resign
  LeaderElection(const LeaderElection&) = delete;
  LeaderElection& operator=(const LeaderElection&) = delete;

  // Blocks until this candidate leads (OK), Cancel() is called
  // (CANCELLED) or etcd fails (its error). Then keeps the lease alive and
  // calls on_lost (once) if leadership is lost.
  absl::Status Campaign(std::function<void(const absl::Status&)> on_lost);
  // Ends a Campaign blocked in another thread (a standby told to stop).
  void Cancel();
  // Gives leadership up at once (revokes the lease, deleting the key). One
  // campaign per object: make a new one to stand again.
  absl::Status Resign();

  const std::string& key() const { return options_.key; }
  const std::string& id() const { return options_.id; }
  // REQUIRES: called from the campaigning thread (lease_ is not guarded).
  bool leading() const { return lease_ != 0; }
  // The leader key's create_revision since this candidate won: what the
  // state store fences its writes on (an id could be shared by two
  // processes; a revision cannot). 0 before winning.
  int64_t won_revision() const { return won_revision_; }

 private:
  // One try: OK and true if this candidate now holds the key, else the
  // revision to watch from.
  absl::StatusOr<bool> TryAcquire(int64_t* watch_from);
  // Waits until the key is deleted after `from`, or a bounded time passed
  // (OK either way: the caller looks again), Cancel() (CANCELLED), or the
  // watch broke (UNAVAILABLE: the caller backs off and tries again).
  absl::Status WaitForDelete(int64_t from);
  // Whether Cancel() was called, waiting up to `wait` for it.
  bool Cancelled(absl::Duration wait) ABSL_LOCKS_EXCLUDED(mu_);
  void KeepAlive(std::function<void(const absl::Status&)> on_lost);

  std::shared_ptr<EtcdClient> client_;
  const LeaderElectionOptions options_;
  // Written by the campaigning thread before the keep-alive thread starts
  // (which reads lease_) and after it is joined.
  int64_t lease_ = 0;
  int64_t won_revision_ = 0;
  absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  grpc::ClientContext* watching_ ABSL_GUARDED_BY(mu_) = nullptr;  // the campaign's watch
  absl::Notification stop_;
  std::thread keepalive_;
};

}  // namespace ballast::global_scheduler
