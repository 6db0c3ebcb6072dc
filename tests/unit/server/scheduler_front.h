// A real Scheduler in front of one fake node, with the Inference service
// on a loopback port: the seam of the scheduler-side server tests
// (advise_pool_test, token_relay_test). The node, "n1" at the address
// given, serves model "m" (READY on cpu:0, a 128-token context); the test
// supplies its v1::Node::Service (StartFakeNode serves it).
//
// Thread-compatible: a test's fixture owns it.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "ballast/v1/inference.grpc.pb.h"
#include "global_scheduler/scheduler.h"
#include "gtest/gtest.h"
#include "server/metrics.h"
#include "server/scheduler_service.h"

namespace ballast::server::testing {

// Serves a fake node's `service` on a loopback port (into `port`),
// allowing the scheduler's keepalive pings as a real node does
// (processes.cc).
inline std::unique_ptr<grpc::Server> StartFakeNode(grpc::Service* service, int* port) {
  grpc::ServerBuilder b;
  b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), port);
  b.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 500);
  b.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  b.RegisterService(service);
  return b.BuildAndStart();
}

struct SchedulerFront {
  // Starts the scheduler with `o` (its catalogue gets "m"; no acceptance
  // deadline; a minute's heartbeat timeout, since a fake node sends none)
  // and registers the node. ASSERTs: call through ASSERT_NO_FATAL_FAILURE.
  void Start(const std::string& node_address, global_scheduler::SchedulerOptions o = {}) {
    o.models = {{"m", "/models/m"}};
    o.node_accept_timeout = absl::ZeroDuration();
    o.heartbeat_timeout = absl::Minutes(1);
    auto created = global_scheduler::Scheduler::Create(o);
    ASSERT_TRUE(created.ok()) << created.status();
    sched = std::move(*created);
    v1::RegisterNodeRequest r;
    r.set_node_id("n1");
    r.set_address(node_address);
    r.add_devices()->set_name("cpu:0");
    r.mutable_devices(0)->set_memory_total_bytes(1000);
    v1::ResidentModel* m = r.add_models();
    m->set_name("m");
    m->set_device("cpu:0");
    m->set_state(v1::MODEL_STATE_READY);
    m->set_context_window(128);
    ASSERT_TRUE(sched->RegisterNode(r).ok());
    service = std::make_unique<InferenceService>(sched.get(), &metrics);
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    b.RegisterService(service.get());
    server = b.BuildAndStart();
    ASSERT_TRUE(server != nullptr);
    stub = v1::Inference::NewStub(
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
  }
  void Stop() {
    if (server) server->Shutdown();
    if (sched) sched->Stop();
  }

  Metrics metrics;
  std::unique_ptr<global_scheduler::Scheduler> sched;
  std::unique_ptr<InferenceService> service;
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<v1::Inference::Stub> stub;
  int port = 0;  // the Inference service's
};

}  // namespace ballast::server::testing
