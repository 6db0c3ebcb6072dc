// Upstream (scheduler_upstream.h): one attempt of the scheduler's Generate
// on a node, reported to its owner.
#include "server/scheduler_upstream.h"

#include <utility>

#include "server/request_id.h"

namespace ballast::server {

Upstream::Upstream(UpstreamOwner* owner, global_scheduler::Route route,
                   v1::NodeGenerateRequest nreq, const std::string& request_id)
    : owner_(owner), route_(std::move(route)), nreq_(std::move(nreq)) {
  ctx_.AddMetadata(kRequestIdKey, request_id);  // the node logs it
}

void Upstream::ArmAcceptAlarm(absl::Duration timeout) {
  alarm_.Set(absl::ToChronoTime(absl::Now() + timeout),
             [this](bool fired) { owner_->OnAcceptAlarm(this, fired); });
}

void Upstream::Start() {
  route_.stub->async()->Generate(&ctx_, &nreq_, this);
  AddHold();
  StartRead(&resp_);
  StartCall();
}

void Upstream::OnReadInitialMetadataDone(bool ok) {
  if (ok) owner_->NodeAccepted(this);
  alarm_.Cancel();
}

void Upstream::OnReadDone(bool ok) {
  if (ok) {
    owner_->OnNodeMessage(this);
  } else {
    RemoveHold();  // the end of the node's stream: OnDone follows
  }
}

void Upstream::OnDone(const grpc::Status& st) {
  alarm_.Cancel();  // in case the initial metadata never came
  owner_->OnNodeDone(this, st);
}

}  // namespace ballast::server
