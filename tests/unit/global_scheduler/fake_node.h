// FakeNode: a node (an in-process gRPC server on loopback) that answers
// LoadModel/EvictModel as told and records the calls it gets, for tests of
// the scheduler's control loop; NodeAt: its registration.
//
// Thread-safety: thread-safe; gRPC's threads and the test share it under
// its mutex (the accessors return copies).
#pragma once

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "ballast/v1/node.grpc.pb.h"

namespace ballast::global_scheduler {

// A node that answers LoadModel/EvictModel as told and records them.
class FakeNode final : public v1::Node::Service {
 public:
  struct Evict {
    std::string model;
    bool drain = false;
    uint32_t drain_timeout_ms = 0;
    absl::Duration deadline_left;
  };

  FakeNode() {
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    b.RegisterService(this);
    server_ = b.BuildAndStart();
  }
  ~FakeNode() override {
    Open();
    server_->Shutdown();
  }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }

  // While closed, calls block until Open().
  void Close() {
    absl::MutexLock l(&mu_);
    open_ = false;
  }
  void Open() {
    absl::MutexLock l(&mu_);
    open_ = true;
  }

  // Loads fail with `st` from now on (OK: they succeed).
  void FailLoadsWith(grpc::Status st) {
    absl::MutexLock l(&mu_);
    load_status_ = std::move(st);
  }

  grpc::Status LoadModel(grpc::ServerContext*, const v1::LoadModelRequest* req,
                         v1::LoadModelResponse* resp) override {
    absl::MutexLock l(&mu_);
    loads_.push_back({req->name(), req->device()});
    load_requests_.push_back(*req);
    peak_ = std::max(peak_, ++running_);
    mu_.Await(absl::Condition(&open_));
    --running_;
    if (!load_status_.ok()) return load_status_;
    v1::ResidentModel* m = resp->mutable_model();
    m->set_name(req->name());
    m->set_device(req->device());
    m->set_state(v1::MODEL_STATE_READY);
    m->set_weight_bytes(100);
    return grpc::Status::OK;
  }
  grpc::Status EvictModel(grpc::ServerContext* ctx, const v1::EvictModelRequest* req,
                          v1::EvictModelResponse*) override {
    absl::MutexLock l(&mu_);
    evicts_.push_back({req->name(), req->drain(), req->drain_timeout_ms(),
                       absl::FromChrono(ctx->deadline()) - absl::Now()});
    mu_.Await(absl::Condition(&open_));
    return grpc::Status::OK;
  }

  std::vector<std::pair<std::string, std::string>> loads() {
    absl::MutexLock l(&mu_);
    return loads_;
  }
  // The LoadModel requests as sent (what loads() abbreviates).
  std::vector<v1::LoadModelRequest> load_requests() {
    absl::MutexLock l(&mu_);
    return load_requests_;
  }
  std::vector<Evict> evicts() {
    absl::MutexLock l(&mu_);
    return evicts_;
  }
  int peak() {
    absl::MutexLock l(&mu_);
    return peak_;
  }
  // Blocks until `n` calls are in progress at once (or 10 s pass).
  bool AwaitRunning(int n) {
    absl::MutexLock l(&mu_);
    auto reached = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return running_ >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&reached), absl::Seconds(10));
  }
  // Blocks until the node has seen `loads` loads and `evicts` evictions.
  bool AwaitCalls(size_t loads, size_t evicts, absl::Duration timeout = absl::Seconds(10)) {
    absl::MutexLock l(&mu_);
    auto reached = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return loads_.size() >= loads && evicts_.size() >= evicts;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&reached), timeout);
  }

 private:
  absl::Mutex mu_;
  bool open_ ABSL_GUARDED_BY(mu_) = true;
  grpc::Status load_status_ ABSL_GUARDED_BY(mu_);
  int running_ ABSL_GUARDED_BY(mu_) = 0;
  int peak_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::pair<std::string, std::string>> loads_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::LoadModelRequest> load_requests_ ABSL_GUARDED_BY(mu_);
  std::vector<Evict> evicts_ ABSL_GUARDED_BY(mu_);
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

inline v1::RegisterNodeRequest NodeAt(
    const std::string& id, const FakeNode& fake, std::vector<std::string> devices = {"cpu:0"},
    std::vector<std::pair<std::string, std::string>> models = {}) {
  v1::RegisterNodeRequest r;
  r.set_node_id(id);
  r.set_address(fake.address());
  for (const auto& name : devices) {
    auto* d = r.add_devices();
    d->set_name(name);
    d->set_memory_total_bytes(1000);
  }
  for (const auto& [name, device] : models) {
    auto* m = r.add_models();
    m->set_name(name);
    m->set_device(device);
    m->set_state(v1::MODEL_STATE_READY);
    m->set_weight_bytes(100);
  }
  return r;
}

}  // namespace ballast::global_scheduler
