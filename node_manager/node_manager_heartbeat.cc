// NodeManager's registration and heartbeats with the scheduler (split from
// node_manager.cc): registering with back-off, the heartbeat loop, and
// what a refused or replaced registration does to the process.
#include <grpcpp/grpcpp.h>

#include <algorithm>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "node_manager/node_manager.h"
#include "spdlog/spdlog.h"
#include "transfer/thread_name.h"

namespace ballast::node_manager {

void NodeManager::StartHeartbeats(const std::string& address,
                                  std::function<void(const absl::Status&)> on_refused) {
  if (options_.scheduler_address.empty() || heartbeat_.joinable()) return;
  advertise_ = address;
  on_refused_ = std::move(on_refused);
  heartbeat_ = std::thread([this] {
    transfer::NameThisThread("node-heartbeat");
    HeartbeatLoop();
  });
}

absl::Status NodeManager::RegisterOnce(v1::NodeRegistry::Stub* stub, absl::Duration* interval) {
  v1::RegisterNodeRequest req;
  req.set_node_id(options_.node_id);
  req.set_address(advertise_);
  req.set_incarnation(incarnation_);
  for (auto& d : DeviceStates()) *req.add_devices() = d;
  for (auto& m : ResidentModels()) *req.add_models() = m;
  v1::RegisterNodeResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  grpc::Status st = stub->Register(&ctx, req, &resp);
  if (st.error_code() == grpc::StatusCode::ALREADY_EXISTS) {
    return absl::AlreadyExistsError(absl::StrCat("scheduler ", options_.scheduler_address,
                                                 " refused this node: ", st.error_message()));
  }
  if (!st.ok()) {
    spdlog::warn("registering with scheduler {} failed: {}", options_.scheduler_address,
                 st.error_message());
    return absl::UnavailableError(st.error_message());
  }
  if (resp.heartbeat_interval_ms() > 0)
    *interval = absl::Milliseconds(resp.heartbeat_interval_ms());
  spdlog::info("registered with scheduler {} as {} (incarnation {})", options_.scheduler_address,
               options_.node_id, incarnation_);
  return absl::OkStatus();
}

void NodeManager::HeartbeatLoop() {
  // Reconnect quickly when the scheduler (re)starts: heartbeats are due every
  // interval, so gRPC's default 1 s+ exponential backoff would cost liveness.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  auto channel = grpc::CreateCustomChannel(
      options_.scheduler_address,
      options_.credentials ? options_.credentials : grpc::InsecureChannelCredentials(), args);
  auto stub = v1::NodeRegistry::NewStub(channel);
  bool registered = false;
  absl::Status refused;
  absl::Duration interval = absl::Seconds(1);
  // While unregistered, attempts (each logging its failure) back off from
  // 500 ms, doubling up to kMaxRegisterBackoff.
  absl::Duration backoff = absl::Milliseconds(500);
  absl::Time last_reached = absl::InfinitePast();
  while (!stop_.HasBeenNotified() && refused.ok()) {
    absl::Status st;
    bool reached = true;
    if (!registered) {
      st = RegisterOnce(stub.get(), &interval);
    } else {
      v1::HeartbeatRequest req;
      req.set_node_id(options_.node_id);
      req.set_incarnation(incarnation_);
      for (auto& d : DeviceStates()) *req.add_devices() = d;
      for (auto& m : ResidentModels()) *req.add_models() = m;
      req.set_inflight_requests(inflight());
      v1::HeartbeatResponse resp;
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + interval));
      grpc::Status hb = stub->Heartbeat(&ctx, req, &resp);
      if (hb.ok() && resp.replaced()) {
        st = absl::AlreadyExistsError(absl::StrCat("another process registered as node ",
                                                   options_.node_id, " with scheduler ",
                                                   options_.scheduler_address, ": this one stops"));
      } else if (hb.ok() && resp.reregister()) {
        spdlog::warn("scheduler asked node {} to register again", options_.node_id);
        registered = false;
        st = RegisterOnce(stub.get(), &interval);
      } else if (!hb.ok()) {
        spdlog::debug("heartbeat failed: {}", hb.error_message());
        reached = false;
      }
    }
    if (absl::IsAlreadyExists(st)) {
      refused = st;
      break;
    }
    if (st.ok()) registered = true;
    // Serving (grpc health) only while registered and heard from lately.
    if (registered && reached && st.ok()) last_reached = absl::Now();
    connected_.store(registered && absl::Now() - last_reached <= 3 * interval);
    stop_.WaitForNotificationWithTimeout(registered ? interval : backoff);
    backoff = registered ? absl::Milliseconds(500) : std::min(2 * backoff, kMaxRegisterBackoff);
  }
  if (!refused.ok()) {
    spdlog::error("{}", std::string(refused.message()));
    if (on_refused_) on_refused_(refused);
  }
}

}  // namespace ballast::node_manager
