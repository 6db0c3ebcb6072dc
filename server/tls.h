// Transport security for Ballast's gRPC ports (issue 19, item 1): TLS on
// the scheduler's public port, mutual TLS between the scheduler and the
// nodes and between nodes (peer KV), all from PEM files named in the
// config. gRPC's file watcher re-reads the files every
// `reload_interval_s`, so rotated certificates take effect without a
// restart and without dropping the streams in flight (a connection keeps
// the session it was opened with).
//
// Plaintext is allowed only where the config says `insecure: true` (the
// log warns) or, with no `tls` block at all, when every address the
// process listens on is loopback (tests, `ballast serve` on one machine).
//
// Roles come from the certificates, not from the CA alone (a public
// client's certificate may come from the same CA): a URI SAN
// `ballast://scheduler` marks the scheduler, `ballast://node/<id>` the node
// with that id (`ballast://node/*`: any node id, for a certificate shared
// by all nodes in a trial). Only those may call a node's port, and a node
// registers only with a certificate naming its id.
//
// Thread-safety: pure functions; the credentials they return are
// thread-safe gRPC objects.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"

namespace ballast::server {

// `scheduler.tls` / `node.tls`. All paths are PEM files.
struct TlsSettings {
  // This process's certificate chain and private key: served on its port
  // and presented as the client certificate on the connections it opens
  // (scheduler -> node, node -> scheduler, node -> peer node).
  std::string cert_file, key_file;
  // The cluster CA (a bundle of several is fine): verifies the
  // certificates of the other daemons in both directions (mTLS inside the
  // cluster), and on the scheduler's port those of public clients that
  // present one.
  std::string ca_file;
  // Scheduler only: refuse public clients without a valid certificate
  // (default false: client certificates are optional, verified if sent).
  // Nodes always require one (the scheduler's or a peer's).
  bool require_client_cert = false;
  // Plaintext on purpose (logged as a warning). Default false.
  bool insecure = false;
  // How often the files are re-read (default 60 s).
  int reload_interval_s = 60;

  bool enabled() const { return !cert_file.empty(); }
};

// Checks a section's settings: cert, key and CA together (and readable), or
// `insecure`, or nothing at all while every one of `listen` is loopback.
// `where` names the section in errors ("configs/node.yaml: node.tls").
absl::Status CheckTls(const TlsSettings& tls, const std::vector<std::string>& listen,
                      const std::string& where);

enum class ClientCerts {
  kOptional,  // verified against the CA when sent
  kRequired,  // the handshake fails without one
};

// Credentials for a port: TLS when `tls.enabled()`, else plaintext.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentialsFor(
    const TlsSettings& tls, ClientCerts client_certs);

// Credentials for connections to the other daemons: mTLS with this
// process's certificate and the cluster CA when `tls.enabled()`, else
// plaintext.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentialsFor(
    const TlsSettings& tls);

// For the command-line clients (`ballast generate`, `models`, `bench`, ...):
// TLS when BALLAST_TLS_CA names the CA that signed the scheduler's
// certificate, with a client certificate when BALLAST_TLS_CERT and
// BALLAST_TLS_KEY are set too; plaintext when BALLAST_TLS_CA is unset.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ClientCredentialsFromEnv();

// Whether the peer of a call presented a certificate the port verified
// (false on plaintext ports).
bool PeerHasVerifiedCert(const grpc::AuthContext& auth);

// The URI SANs of the peer's verified certificate (empty if none).
std::vector<std::string> PeerUris(const grpc::AuthContext& auth);

inline constexpr char kSchedulerUri[] = "ballast://scheduler";
inline constexpr char kNodeUriPrefix[] = "ballast://node/";

// OK if the peer's certificate names node `node_id` (or any node).
absl::Status CheckNodeIdentity(const grpc::AuthContext& auth, const std::string& node_id);

// Server credentials for a node's port: mTLS, and only the scheduler's and
// the nodes' certificates (by URI SAN) may call; plaintext if disabled.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> NodeServerCredentials(
    const TlsSettings& tls);

}  // namespace ballast::server
