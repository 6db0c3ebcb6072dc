// The gateway's upstream gRPC calls in flight (CallBase), kept in a
// CallRegistry so that HttpGateway::Shutdown can cancel them and wait until
// gRPC no longer posts into its io_context.
// Thread-safety: CallRegistry is thread-safe (one mutex).
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace ballast::server::gateway {

// A gRPC call in flight; the registry cancels all of them at shutdown.
struct CallBase {
  virtual ~CallBase() = default;
  grpc::ClientContext ctx;
};

// Every upstream call in flight, so that Shutdown can cancel them and wait
// until gRPC no longer posts into the io_context.
class CallRegistry {
 public:
  bool Add(const std::shared_ptr<CallBase>& c) {
    absl::MutexLock l(&mu_);
    if (closed_) return false;
    calls_[c.get()] = c;
    return true;
  }
  void Remove(CallBase* c) {
    absl::MutexLock l(&mu_);
    calls_.erase(c);
  }
  // Refuses new calls, cancels the live ones, waits up to `limit`.
  bool CancelAllAndWait(absl::Duration limit) {
    std::vector<std::shared_ptr<CallBase>> live;
    {
      absl::MutexLock l(&mu_);
      closed_ = true;
      for (auto& [raw, weak] : calls_)
        if (auto c = weak.lock()) live.push_back(std::move(c));
    }
    for (auto& c : live) c->ctx.TryCancel();
    live.clear();
    absl::MutexLock l(&mu_);
    return mu_.AwaitWithTimeout(absl::Condition(this, &CallRegistry::Empty), limit);
  }

 private:
  bool Empty() const ABSL_SHARED_LOCKS_REQUIRED(mu_) { return calls_.empty(); }

  absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_map<CallBase*, std::weak_ptr<CallBase>> calls_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ballast::server::gateway
