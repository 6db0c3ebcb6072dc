// GatewayTls: the OpenAI gateway's TLS server context (HTTPS on
// scheduler.http_listen when scheduler.tls is on): the scheduler's
// certificate and key, and its cluster CA for client certificates
// (optional, or required with scheduler.tls.require_client_cert), as on the
// gRPC port. The files are re-read when they change, checked at most once
// per reload interval: new connections get the new context, open ones keep
// theirs.
// Thread-safety: Current() may be called from any thread.
#pragma once

#include <boost/asio/ssl/context.hpp>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/gateway/http_gateway.h"

namespace ballast::server::gateway {

class GatewayTls {
 public:
  // Loads the files now; errors name the file that cannot be used.
  static absl::StatusOr<std::unique_ptr<GatewayTls>> Create(const GatewayTlsOptions& options);

  // The context for a new connection (reloaded first if the files changed
  // and the interval passed; a reload that fails keeps the old context and
  // logs why).
  std::shared_ptr<boost::asio::ssl::context> Current();

 private:
  explicit GatewayTls(GatewayTlsOptions options) : options_(std::move(options)) {}
  // A context from the files as they are now.
  absl::StatusOr<std::shared_ptr<boost::asio::ssl::context>> Load() const;
  // The files' last modification times, summed into one stamp.
  int64_t Stamp() const;

  const GatewayTlsOptions options_;
  absl::Mutex mu_;
  std::shared_ptr<boost::asio::ssl::context> current_ ABSL_GUARDED_BY(mu_);
  int64_t stamp_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time checked_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ballast::server::gateway
