// Upstream: one attempt of the scheduler's Generate on a node (server/
// scheduler_generate.h), the node's stream read with gRPC's callback
// client one message at a time, with an optional acceptance deadline (the
// node's initial metadata). It reports every event to its UpstreamOwner
// (the client's stream) and decides nothing itself: flow control, retries
// and the client's end are the owner's.
//
// Lifetime: the owner holds the Upstream until the owner is deleted, and
// must not delete it before OnNodeDone has returned and, where an alarm was
// armed, OnAcceptAlarm has returned (the alarm may call back after
// OnNodeDone), so that a Cancel never races its deletion.
//
// Thread-safety: gRPC's reactions and the alarm call the owner on gRPC's
// threads, possibly concurrently with each other and with the owner's own
// calls into the Upstream; the owner serializes its state itself. Cancel
// and MarkUnaccepted may be called from any thread at any time; ReadNext
// only once the previous message has been reported (one read outstanding
// at a time), and resp() is the owner's from OnNodeMessage until then.
#pragma once

#include <grpcpp/alarm.h>
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <string>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "ballast/v1/node.grpc.pb.h"
#include "global_scheduler/scheduler.h"

namespace ballast::server {

class Upstream;

// What an Upstream reports to the stream that owns it (see above for the
// threads these come on).
class UpstreamOwner {
 public:
  // The node sent the attempt's initial metadata (it accepted the call).
  virtual void NodeAccepted(Upstream* u) = 0;
  // The node's next message, in u->resp().
  virtual void OnNodeMessage(Upstream* u) = 0;
  // The node's call ended with `status` (no further message follows).
  virtual void OnNodeDone(Upstream* u, const grpc::Status& status) = 0;
  // The acceptance deadline armed by ArmAcceptAlarm passed (`fired`) or
  // was cancelled (the node accepted, or its call ended). Called once.
  virtual void OnAcceptAlarm(Upstream* u, bool fired) = 0;

 protected:
  ~UpstreamOwner() = default;  // not deleted through this interface
};

class Upstream final : public grpc::ClientReadReactor<v1::NodeGenerateResponse> {
 public:
  // The attempt along `route` with `nreq`, carrying `request_id` to the
  // node (server/request_id.h: the node logs it).
  Upstream(UpstreamOwner* owner, global_scheduler::Route route, v1::NodeGenerateRequest nreq,
           const std::string& request_id);

  // Arms the acceptance deadline (before Start): `fired` tells the owner
  // whether the node's initial metadata was late.
  void ArmAcceptAlarm(absl::Duration timeout);
  // Starts the call and its first read. The hold keeps OnDone from running
  // while this side may still start a read: reads go on (token by token)
  // until one fails, which drops it.
  void Start();
  void ReadNext() { StartRead(&resp_); }
  void Cancel() { ctx_.TryCancel(); }
  // Cancelled because the node did not accept in time (then retried).
  void MarkUnaccepted() { unaccepted_ = true; }
  bool unaccepted() const { return unaccepted_; }

  const global_scheduler::Route& route() const { return route_; }
  const v1::NodeGenerateResponse& resp() const { return resp_; }

  // grpc::ClientReadReactor.
  void OnReadInitialMetadataDone(bool ok) override;
  void OnReadDone(bool ok) override;
  void OnDone(const grpc::Status& st) override;

 private:
  UpstreamOwner* const owner_;
  const global_scheduler::Route route_;
  const v1::NodeGenerateRequest nreq_;
  grpc::ClientContext ctx_;
  v1::NodeGenerateResponse resp_;
  grpc::Alarm alarm_;
  std::atomic<bool> unaccepted_{false};
};

}  // namespace ballast::server
