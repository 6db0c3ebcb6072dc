#include "server/gateway/gateway_tls.h"

#include <openssl/ssl.h>
#include <sys/stat.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "spdlog/spdlog.h"

namespace ballast::server::gateway {

namespace ssl = boost::asio::ssl;

absl::StatusOr<std::unique_ptr<GatewayTls>> GatewayTls::Create(const GatewayTlsOptions& options) {
  std::unique_ptr<GatewayTls> tls(new GatewayTls(options));
  auto ctx = tls->Load();
  if (!ctx.ok()) return ctx.status();
  absl::MutexLock lock(&tls->mu_);
  tls->current_ = std::move(*ctx);
  tls->stamp_ = tls->Stamp();
  tls->checked_ = absl::Now();
  return tls;
}

absl::StatusOr<std::shared_ptr<ssl::context>> GatewayTls::Load() const {
  auto ctx = std::make_shared<ssl::context>(ssl::context::tls_server);
  ctx->set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 |
                   ssl::context::no_sslv3 | ssl::context::no_tlsv1 | ssl::context::no_tlsv1_1 |
                   ssl::context::single_dh_use);
  boost::system::error_code ec;
  ctx->use_certificate_chain_file(options_.cert_file, ec);
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("gateway TLS: certificate ", options_.cert_file, ": ", ec.message()));
  }
  ctx->use_private_key_file(options_.key_file, ssl::context::pem, ec);
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("gateway TLS: key ", options_.key_file, ": ", ec.message()));
  }
  if (!options_.ca_file.empty()) {
    ctx->load_verify_file(options_.ca_file, ec);
    if (ec) {
      return absl::InvalidArgumentError(
          absl::StrCat("gateway TLS: CA ", options_.ca_file, ": ", ec.message()));
    }
    // Verifying peers, OpenSSL refuses resumed sessions without an id context.
    static constexpr unsigned char kSessionContext[] = "ballast-gateway";
    SSL_CTX_set_session_id_context(ctx->native_handle(), kSessionContext,
                                   sizeof(kSessionContext) - 1);
    ctx->set_verify_mode(options_.require_client_cert
                             ? ssl::verify_peer | ssl::verify_fail_if_no_peer_cert
                             : ssl::verify_peer,
                         ec);
  }
  return ctx;
}

int64_t GatewayTls::Stamp() const {
  int64_t stamp = 0;
  for (const std::string* f : {&options_.cert_file, &options_.key_file, &options_.ca_file}) {
    struct stat st;
    if (!f->empty() && ::stat(f->c_str(), &st) == 0) {
      stamp += static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
    }
  }
  return stamp;
}

std::shared_ptr<ssl::context> GatewayTls::Current() {
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  if (now - checked_ < options_.reload_interval) return current_;
  checked_ = now;
  const int64_t stamp = Stamp();
  if (stamp == stamp_) return current_;
  auto ctx = Load();
  if (!ctx.ok()) {
    spdlog::error("{} (keeping the previous certificate)", ctx.status().ToString());
    return current_;
  }
  spdlog::info("gateway TLS: reloaded {}", options_.cert_file);
  current_ = std::move(*ctx);
  stamp_ = stamp;
  return current_;
}

}  // namespace ballast::server::gateway
