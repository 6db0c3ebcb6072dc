#include "global_scheduler/node_channels.h"

#include <algorithm>

namespace ballast::global_scheduler {

NodeChannels::NodeChannels(const std::string& address, int count,
                           std::shared_ptr<grpc::ChannelCredentials> credentials)
    : address_(address) {
  if (!credentials) credentials = grpc::InsecureChannelCredentials();
  count = std::max(count, 1);
  for (int i = 0; i < count; ++i) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 1000);
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 1000);
    args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
    args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 1000);  // also the connect timeout
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    // Its own subchannel (connection), not the process-wide shared one.
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    channels_.push_back(grpc::CreateCustomChannel(address, credentials, args));
    stubs_.push_back(std::shared_ptr<v1::Node::StubInterface>(v1::Node::NewStub(channels_.back())));
  }
}

std::shared_ptr<v1::Node::StubInterface> NodeChannels::Next() {
  return stubs_[next_.fetch_add(1, std::memory_order_relaxed) % stubs_.size()];
}

void NodeChannels::WaitForConnected(absl::Time deadline) const {
  for (const auto& c : channels_) c->WaitForConnected(absl::ToChronoTime(deadline));
}

bool NodeChannels::AnyReady() const {
  for (const auto& c : channels_) {
    if (c->GetState(false) == GRPC_CHANNEL_READY) return true;
  }
  return false;
}

}  // namespace ballast::global_scheduler
