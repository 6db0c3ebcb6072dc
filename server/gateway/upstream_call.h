// The gateway's upstream gRPC calls to the scheduler's Inference API, and
// what a call needs of the HTTP connection it answers (SessionBase, plain
// or TLS). Calls register in a CallRegistry (call_registry.h) so that
// HttpGateway::Shutdown can cancel them.
//
// Thread-safety: a GenerateCall's reactor methods run on gRPC threads; it
// hands every event to its session through PostEvent/PostDone, which post
// to the session's strand.
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>

#include "ballast/v1/inference.grpc.pb.h"
#include "server/gateway/call_registry.h"

namespace ballast::server::gateway {

// What an upstream call needs of its HTTP connection (plain or TLS).
class SessionBase : public std::enable_shared_from_this<SessionBase> {
 public:
  virtual ~SessionBase() = default;
  // From gRPC threads: hand an event or the call's end to the connection.
  virtual void PostEvent(v1::GenerateResponse r) = 0;
  virtual void PostDone(grpc::Status st, int64_t retry_after_ms) = 0;
};

// One upstream Inference.Generate stream (gRPC callback API): events are
// posted to the session's strand; the call keeps itself alive until OnDone.
class GenerateCall final : public CallBase, public grpc::ClientReadReactor<v1::GenerateResponse> {
 public:
  GenerateCall(std::shared_ptr<SessionBase> session, CallRegistry* registry)
      : session_(std::move(session)), registry_(registry) {}
  void Start(v1::Inference::Stub* stub, v1::GenerateRequest req,
             std::shared_ptr<GenerateCall> self) {
    self_ = std::move(self);
    req_ = std::move(req);
    stub->async()->Generate(&ctx, &req_, this);
    StartRead(&resp_);
    StartCall();
  }
  void OnReadDone(bool ok) override;
  void OnDone(const grpc::Status& st) override;

 private:
  std::shared_ptr<SessionBase> session_;
  CallRegistry* registry_;
  std::shared_ptr<GenerateCall> self_;
  v1::GenerateRequest req_;
  v1::GenerateResponse resp_;
};

struct ModelsCall final : CallBase {
  v1::ListModelsRequest req;
  v1::ListModelsResponse resp;
};

}  // namespace ballast::server::gateway
