// NodeChannels: calls to one node are spread round-robin over separate
// connections (the node sees as many client peers as channels).
#include "global_scheduler/node_channels.h"

#include <grpcpp/grpcpp.h>

#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"

namespace ballast::global_scheduler {
namespace {

// A node that records the peer (client address and port) of each call.
class PeerRecorder final : public v1::Node::Service {
 public:
  PeerRecorder() {
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    b.RegisterService(this);
    server_ = b.BuildAndStart();
  }
  ~PeerRecorder() override { server_->Shutdown(); }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }

  grpc::Status DropSession(grpc::ServerContext* ctx, const v1::DropSessionRequest*,
                           v1::DropSessionResponse*) override {
    absl::MutexLock l(&mu_);
    peers_.insert(ctx->peer());
    return grpc::Status::OK;
  }
  std::set<std::string> peers() {
    absl::MutexLock l(&mu_);
    return peers_;
  }

 private:
  absl::Mutex mu_;
  std::set<std::string> peers_ ABSL_GUARDED_BY(mu_);
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

int CallsFromPeers(int channels, int calls) {
  PeerRecorder node;
  NodeChannels pool(node.address(), channels);
  EXPECT_EQ(pool.size(), channels);
  EXPECT_FALSE(pool.AnyReady());  // connections are made on first use
  for (int i = 0; i < calls; ++i) {
    grpc::ClientContext ctx;
    v1::DropSessionRequest req;
    v1::DropSessionResponse resp;
    EXPECT_TRUE(pool.Next()->DropSession(&ctx, req, &resp).ok());
  }
  EXPECT_TRUE(pool.AnyReady());
  return static_cast<int>(node.peers().size());
}

TEST(NodeChannels, CallsAreSpreadOverSeparateConnections) {
  EXPECT_EQ(CallsFromPeers(3, 9), 3);
  EXPECT_EQ(CallsFromPeers(1, 4), 1);
}

TEST(NodeChannels, ADeadNodeHasNoReadyChannel) {
  std::string address;
  {
    PeerRecorder gone;
    address = gone.address();
  }
  NodeChannels pool(address, 2);
  pool.WaitForConnected(absl::Now() + absl::Milliseconds(200));
  EXPECT_FALSE(pool.AnyReady());
}

}  // namespace
}  // namespace ballast::global_scheduler
