// The OpenAI-compatible HTTP/SSE gateway of the scheduler process
// (`scheduler.http_listen`; HTTPS when the scheduler has TLS): GET /v1/models, POST /v1/completions
// (plain and `stream: true` server-sent events) and POST /v1/chat/completions (HTTP 501 until
// GenerateRequest carries chat messages). It is a pure frontend of the public gRPC API: every
// request becomes an Inference.Generate / ListModels call to the scheduler over loopback, made with
// gRPC's callback client, so a stream costs no thread.
//
// Threads: a fixed pool of `io_threads` Asio threads serves every HTTP
// connection (Boost.Beast, asynchronous); gRPC delivers stream events on
// its own bounded callback threads, which post them to the connection's
// strand. Nothing blocks per request or per connection.
//
// Limits: request header 16 KiB, body `max_body_bytes` (413 beyond it),
// 30 s to send a request. A client that disconnects cancels its upstream
// Generate call (the scheduler then cancels the node's).
//
// Thread-safety: Create/Shutdown from one thread; the gateway's internals
// are synchronised by strands and a mutex.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/security/credentials.h"

namespace ballast::server::gateway {

// HTTPS: the scheduler's certificate and key, and its cluster CA for
// client certificates (optional, or required), as on its gRPC port.
struct GatewayTlsOptions {
  std::string cert_file, key_file;  // PEM chain and key
  std::string ca_file;              // PEM CA bundle for client certificates ("": none asked)
  bool require_client_cert = false;
  // The files are re-read when they changed, checked at most this often.
  absl::Duration reload_interval = absl::Seconds(60);
};

struct GatewayOptions {
  std::string listen;    // host:port; port 0 picks a free one
  std::string upstream;  // the scheduler's gRPC address (loopback)
  // Credentials for `upstream` (TLS when the scheduler's port has it).
  // Default null: plaintext.
  std::shared_ptr<grpc::ChannelCredentials> upstream_credentials;
  int io_threads = 2;
  size_t max_body_bytes = 1 << 20;
  // HTTPS with these files. Default none: plain HTTP.
  std::optional<GatewayTlsOptions> tls;
};

class HttpGateway {
 public:
  // Binds `listen`, connects to `upstream` lazily and starts serving.
  // Errors name the address (in use, invalid).
  static absl::StatusOr<std::unique_ptr<HttpGateway>> Create(const GatewayOptions& options);
  ~HttpGateway();

  // host:port actually bound (the port resolved when 0 was asked).
  const std::string& address() const;

  // Stops accepting, cancels in-flight upstream calls, waits (up to 5 s)
  // for them to end, then stops the io threads. Idempotent.
  void Shutdown();

  struct Impl;

 private:
  explicit HttpGateway(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The gRPC address for dialling a server bound to `bound` on this machine
// (0.0.0.0 / [::] become loopback).
std::string LoopbackTarget(const std::string& bound);

}  // namespace ballast::server::gateway
