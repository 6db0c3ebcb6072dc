// NodeChannels: the scheduler's connections to one node. Calls are spread
// round-robin over `count` channels, each its own HTTP/2 connection (a
// channel-local subchannel pool), so that many concurrent token streams do
// not all share one connection (gRPC handles one connection's frames in
// order). On one H200 with six models, 4 connections measured no gain over
// 1 (docs/benchmarks.md): the device was the limit there.
//
// Thread-safety: all methods are thread-safe; the object is immutable after
// Create except for the round-robin counter (atomic).
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "ballast/v1/node.grpc.pb.h"

namespace ballast::global_scheduler {

class NodeChannels {
 public:
  // `count` >= 1 channels to `address`, with keepalive pings that find a
  // hung (stopped) node within about two seconds and quick reconnects that
  // find a restarted one. Connections are made lazily, on first use, with
  // `credentials` (null: plaintext; mTLS when the cluster uses TLS).
  NodeChannels(const std::string& address, int count,
               std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr);

  const std::string& address() const { return address_; }
  int size() const { return static_cast<int>(stubs_.size()); }
  // The stub for the next call (round-robin).
  std::shared_ptr<v1::Node::StubInterface> Next();
  // True if any of the channels is connected (READY).
  bool AnyReady() const;
  // Waits until every channel is connected or `deadline` passes.
  void WaitForConnected(absl::Time deadline) const;

 private:
  const std::string address_;
  std::vector<std::shared_ptr<grpc::Channel>> channels_;
  std::vector<std::shared_ptr<v1::Node::StubInterface>> stubs_;
  std::atomic<uint64_t> next_{0};
};

}  // namespace ballast::global_scheduler
