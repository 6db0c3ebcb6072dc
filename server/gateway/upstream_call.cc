#include "server/gateway/upstream_call.h"

#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/string_view.h"

namespace ballast::server::gateway {

void GenerateCall::OnReadDone(bool ok) {
  if (!ok) return;  // OnDone follows
  session_->PostEvent(std::move(resp_));
  resp_.Clear();
  StartRead(&resp_);
}

void GenerateCall::OnDone(const grpc::Status& st) {
  std::shared_ptr<SessionBase> s = std::move(session_);
  int64_t retry_after_ms = -1;
  const auto& trailers = ctx.GetServerTrailingMetadata();
  if (auto it = trailers.find("retry-after-ms"); it != trailers.end()) {
    if (!absl::SimpleAtoi(absl::string_view(it->second.data(), it->second.size()), &retry_after_ms))
      retry_after_ms = -1;
  }
  s->PostDone(
      st, retry_after_ms);  // before Remove: Shutdown waits for Remove, then stops the io_context
  registry_->Remove(this);
  auto self = std::move(self_);  // may be the last reference: `this` dies at scope end
}

}  // namespace ballast::server::gateway
