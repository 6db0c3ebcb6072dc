#include "server/tls.h"

#include <cstdlib>
#include <fstream>

#include <openssl/pem.h>
#include <openssl/x509v3.h>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/security/auth_context.h"
#include "grpcpp/security/auth_metadata_processor.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_credentials_options.h"

namespace ballast::server {
namespace {

using grpc::experimental::FileWatcherCertificateProvider;

bool IsLoopback(const std::string& address) {
  std::string host = address.substr(0, address.rfind(':'));
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return host == "localhost" || host == "::1" || absl::StartsWith(host, "127.");
}

absl::Status Readable(const std::string& path, const std::string& key) {
  if (path.empty()) return absl::InvalidArgumentError(absl::StrCat(key, ": missing"));
  std::ifstream in(path);
  if (!in.good()) {
    return absl::InvalidArgumentError(absl::StrCat(key, ": cannot read \"", path, "\""));
  }
  return absl::OkStatus();
}

std::shared_ptr<FileWatcherCertificateProvider> Provider(const TlsSettings& tls) {
  const unsigned interval = static_cast<unsigned>(std::max(1, tls.reload_interval_s));
  return std::make_shared<FileWatcherCertificateProvider>(tls.key_file, tls.cert_file, tls.ca_file,
                                                          interval);
}

}  // namespace

absl::Status CheckTls(const TlsSettings& tls, const std::vector<std::string>& listen,
                      const std::string& where) {
  if (tls.enabled() || !tls.key_file.empty() || !tls.ca_file.empty()) {
    if (tls.insecure) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ".insecure: true together with certificates; choose one"));
    }
    if (absl::Status st = Readable(tls.cert_file, where + ".cert_file"); !st.ok()) return st;
    if (absl::Status st = Readable(tls.key_file, where + ".key_file"); !st.ok()) return st;
    return Readable(tls.ca_file, where + ".ca_file");
  }
  if (tls.insecure) return absl::OkStatus();
  for (const auto& address : listen) {
    if (!address.empty() && !IsLoopback(address)) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": ", address,
          " is not loopback, so its gRPC traffic needs TLS: set cert_file, key_file and "
          "ca_file (deploy/tls/make-test-ca.sh makes a test CA), or insecure: true"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentialsFor(
    const TlsSettings& tls, ClientCerts client_certs) {
  if (!tls.enabled()) return grpc::InsecureServerCredentials();
  grpc::experimental::TlsServerCredentialsOptions options(Provider(tls));
  options.watch_identity_key_cert_pairs();
  options.watch_root_certs();
  options.set_cert_request_type(client_certs == ClientCerts::kRequired
                                    ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                                    : GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY);
  auto creds = grpc::experimental::TlsServerCredentials(options);
  if (!creds) return absl::InvalidArgumentError("gRPC refused the TLS server settings");
  return creds;
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentialsFor(
    const TlsSettings& tls) {
  if (!tls.enabled()) return grpc::InsecureChannelCredentials();
  grpc::experimental::TlsChannelCredentialsOptions options;
  options.set_certificate_provider(Provider(tls));
  options.watch_identity_key_cert_pairs();
  options.watch_root_certs();
  auto creds = grpc::experimental::TlsCredentials(options);
  if (!creds) return absl::InvalidArgumentError("gRPC refused the TLS client settings");
  return creds;
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ClientCredentialsFromEnv() {
  const char* ca = std::getenv("BALLAST_TLS_CA");
  if (ca == nullptr || *ca == '\0') return grpc::InsecureChannelCredentials();
  const char* cert = std::getenv("BALLAST_TLS_CERT");
  const char* key = std::getenv("BALLAST_TLS_KEY");
  if (absl::Status st = Readable(ca, "BALLAST_TLS_CA"); !st.ok()) return st;
  grpc::experimental::TlsChannelCredentialsOptions options;
  if (cert != nullptr && *cert != '\0') {
    if (absl::Status st = Readable(cert, "BALLAST_TLS_CERT"); !st.ok()) return st;
    if (absl::Status st = Readable(key ? key : "", "BALLAST_TLS_KEY"); !st.ok()) return st;
    options.set_certificate_provider(
        std::make_shared<FileWatcherCertificateProvider>(key, cert, ca, 60));
    options.watch_identity_key_cert_pairs();
  } else {
    options.set_certificate_provider(std::make_shared<FileWatcherCertificateProvider>(ca, 60));
  }
  options.watch_root_certs();
  auto creds = grpc::experimental::TlsCredentials(options);
  if (!creds) return absl::InvalidArgumentError("gRPC refused the TLS client settings");
  return creds;
}

std::vector<std::string> PeerUris(const grpc::AuthContext& auth) {
  std::vector<std::string> out;
  if (!auth.IsPeerAuthenticated()) return out;
  const auto pems = auth.FindPropertyValues("x509_pem_cert");
  if (pems.empty()) return out;
  BIO* bio = BIO_new_mem_buf(pems.front().data(), static_cast<int>(pems.front().size()));
  X509* cert = bio ? PEM_read_bio_X509(bio, nullptr, nullptr, nullptr) : nullptr;
  if (cert != nullptr) {
    auto* names =
        static_cast<GENERAL_NAMES*>(X509_get_ext_d2i(cert, NID_subject_alt_name, nullptr, nullptr));
    for (int i = 0; names != nullptr && i < sk_GENERAL_NAME_num(names); ++i) {
      const GENERAL_NAME* n = sk_GENERAL_NAME_value(names, i);
      if (n->type != GEN_URI) continue;
      const ASN1_IA5STRING* uri = n->d.uniformResourceIdentifier;
      out.emplace_back(reinterpret_cast<const char*>(ASN1_STRING_get0_data(uri)),
                       static_cast<size_t>(ASN1_STRING_length(uri)));
    }
    if (names != nullptr) GENERAL_NAMES_free(names);
    X509_free(cert);
  }
  if (bio != nullptr) BIO_free(bio);
  return out;
}

absl::Status CheckNodeIdentity(const grpc::AuthContext& auth, const std::string& node_id) {
  const std::vector<std::string> uris = PeerUris(auth);
  for (const auto& u : uris) {
    if (u == absl::StrCat(kNodeUriPrefix, node_id) || u == absl::StrCat(kNodeUriPrefix, "*")) {
      return absl::OkStatus();
    }
  }
  return absl::UnauthenticatedError(absl::StrCat(
      "node \"", node_id, "\" must register with a certificate of the cluster CA whose URI SAN is ",
      kNodeUriPrefix, node_id,
      uris.empty() ? " (this one names none)"
                   : absl::StrCat(" (this one names ", absl::StrJoin(uris, ", "), ")")));
}

namespace {

// The node port's gate: the scheduler and the nodes only. It runs on every
// call, so the verdict is kept per peer certificate (the PEM bytes gRPC
// hands over, compared whole): the certificate is parsed once, not on every
// Generate. Only certificates the cluster CA verified reach it, so the
// cache holds the daemons' few; it is capped all the same.
class DaemonPeersOnly final : public grpc::AuthMetadataProcessor {
 public:
  bool IsBlocking() const override { return false; }
  grpc::Status Process(const InputMetadata&, grpc::AuthContext* context, OutputMetadata*,
                       OutputMetadata*) override {
    const auto pems = context->FindPropertyValues("x509_pem_cert");
    const std::string pem =
        pems.empty() ? std::string() : std::string(pems.front().data(), pems.front().size());
    if (Allowed(pem, *context)) return grpc::Status::OK;
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        absl::StrCat("a node's port serves only the scheduler and other nodes (a "
                                     "certificate with URI SAN ",
                                     kSchedulerUri, " or ", kNodeUriPrefix, "<id>)"));
  }

 private:
  static constexpr size_t kMaxCached = 1024;
  bool Allowed(const std::string& pem, const grpc::AuthContext& context) {
    if (!pem.empty() && context.IsPeerAuthenticated()) {
      absl::MutexLock lock(&mu_);
      if (auto it = verdicts_.find(pem); it != verdicts_.end()) return it->second;
    }
    bool allowed = false;
    for (const auto& u : PeerUris(context)) {
      if (u == kSchedulerUri || absl::StartsWith(u, kNodeUriPrefix)) allowed = true;
    }
    if (!pem.empty() && context.IsPeerAuthenticated()) {
      absl::MutexLock lock(&mu_);
      if (verdicts_.size() < kMaxCached) verdicts_.emplace(pem, allowed);
    }
    return allowed;
  }

  absl::Mutex mu_;
  absl::flat_hash_map<std::string, bool> verdicts_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> NodeServerCredentials(
    const TlsSettings& tls) {
  auto creds = ServerCredentialsFor(tls, ClientCerts::kRequired);
  if (!creds.ok() || !tls.enabled()) return creds;
  (*creds)->SetAuthMetadataProcessor(std::make_shared<DaemonPeersOnly>());
  return creds;
}

bool PeerHasVerifiedCert(const grpc::AuthContext& auth) {
  if (!auth.IsPeerAuthenticated()) return false;
  return !auth.FindPropertyValues("x509_pem_cert").empty();
}

}  // namespace ballast::server
