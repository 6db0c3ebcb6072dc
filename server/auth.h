// API keys, tenants and roles (issue 19, item 2). With `scheduler.auth.
// keys_file` set, every Inference and Admin call carries
// `authorization: Bearer <key>` (gRPC metadata; the gateway forwards the HTTP
// header), and the key's entry decides:
//   - the tenant: a request's `tenant` is the key's (an empty one is filled
//     in; another is PERMISSION_DENIED unless the key is an admin's), so KV
//     and sessions are isolated per key holder;
//   - the role: `admin` may call the Admin API, `user` may not;
//   - the models: an allow-list (absent: every model); ListModels shows only
//     those.
// The file stores SHA-256 hashes of keys, never keys:
//   keys:
//     - {sha256: 9f86d0..., tenant: acme, role: user, models: [llama-small]}
//     - {sha256: 2c26b4..., tenant: ops, role: admin}
// `ballast keys add` makes a key, prints it once and appends its hash. The
// file is re-read when it changes (checked at most once a second), so keys
// are added and revoked without a restart; an unreadable or invalid new
// version is logged and the previous one kept.
//
// Thread-safety: KeyStore is thread-safe.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/server_context.h"

namespace ballast::server {

// The metadata key the bearer token travels in (HTTP's Authorization).
inline constexpr char kAuthorizationKey[] = "authorization";

enum class Role { kUser, kAdmin };

struct Principal {
  std::string tenant;
  Role role = Role::kUser;
  std::vector<std::string> models;  // empty: every model

  bool AllowsModel(const std::string& model) const;
  // OK if AllowsModel(model), else PERMISSION_DENIED naming the tenant and
  // the model.
  absl::Status CheckModel(const std::string& model) const;
  // The tenant a request acts as: its own `requested` tenant, or this
  // key's. PERMISSION_DENIED if a user key names another tenant.
  absl::StatusOr<std::string> TenantFor(const std::string& requested) const;
};

// Lowercase hex SHA-256 of `text`.
std::string Sha256Hex(absl::string_view text);

// A new random key ("bk_" and 43 base64url characters: 256 bits).
std::string NewApiKey();

class KeyStore {
 public:
  // Loads `path`; errors name the file and the entry.
  static absl::StatusOr<std::unique_ptr<KeyStore>> Load(const std::string& path);

  // The principal of an `authorization` header value ("Bearer <key>").
  // UNAUTHENTICATED, with a message saying what is wrong, if it is missing
  // or malformed or the key is unknown.
  absl::StatusOr<Principal> Authenticate(absl::string_view authorization) ABSL_LOCKS_EXCLUDED(mu_);

  int size() const ABSL_LOCKS_EXCLUDED(mu_);
  // Whether some key acts as `tenant` (the metrics' tenant label values).
  bool KnowsTenant(const std::string& tenant) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  explicit KeyStore(std::string path) : path_(std::move(path)) {}
  // Re-reads the file if it changed (inode, size or modification time;
  // checked at most once a second), reading and parsing outside mu_.
  void MaybeReload() ABSL_LOCKS_EXCLUDED(mu_);

  const std::string path_;
  mutable absl::Mutex mu_;
  std::map<std::string, Principal> by_hash_ ABSL_GUARDED_BY(mu_);
  std::string signature_ ABSL_GUARDED_BY(mu_);  // of the file last read
  bool reloading_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time checked_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

// The principal of a call when `keys` is set (its `authorization`
// metadata); nullopt when `keys` is null (authentication off).
absl::StatusOr<std::optional<Principal>> CallerOf(KeyStore* keys,
                                                  const grpc::ServerContextBase& ctx);

// `ballast keys add`: makes a key for `who`, appends its hash to `path`
// (created, mode 0600, if missing; replaced atomically) and returns the key,
// which is stored nowhere.
absl::StatusOr<std::string> AddKey(const std::string& path, const Principal& who);

// Parses a key file's text (for Load and tests); errors name `source`.
absl::StatusOr<std::map<std::string, Principal>> ParseKeyFile(const std::string& text,
                                                              const std::string& source);

}  // namespace ballast::server
