#include "server/auth.h"

#include <openssl/evp.h>
#include <openssl/rand.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "spdlog/spdlog.h"
#include "yaml-cpp/yaml.h"

namespace ballast::server {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in.good()) return absl::InvalidArgumentError(absl::StrCat(path, ": cannot read"));
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Inode, size and modification time: file systems stamp times coarsely
// (writes milliseconds apart can share one), and a replaced file (written
// then renamed into place) has a new inode.
std::string FileSignature(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return "missing";
  return absl::StrCat(st.st_ino, ":", st.st_size, ":", st.st_mtim.tv_sec, ".", st.st_mtim.tv_nsec);
}

bool IsLowerHex(absl::string_view s) {
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

absl::StatusOr<Principal> ParseEntry(const YAML::Node& e, const std::string& where,
                                     std::string* hash) {
  if (!e.IsMap()) return absl::InvalidArgumentError(absl::StrCat(where, ": expected a mapping"));
  Principal p;
  std::string role = "user";
  try {
    for (auto it = e.begin(); it != e.end(); ++it) {
      const std::string k = it->first.as<std::string>();
      if (k == "sha256") {
        *hash = absl::AsciiStrToLower(it->second.as<std::string>());
      } else if (k == "tenant") {
        p.tenant = it->second.as<std::string>();
      } else if (k == "role") {
        role = it->second.as<std::string>();
      } else if (k == "models") {
        p.models = it->second.as<std::vector<std::string>>();
      } else {
        return absl::InvalidArgumentError(absl::StrCat(where, ".", k, ": unknown key"));
      }
    }
  } catch (const YAML::Exception& ex) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": wrong type (", ex.what(), ")"));
  }
  if (hash->size() != 64 || !IsLowerHex(*hash)) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ".sha256: expected 64 hex digits (the SHA-256 of the key)"));
  }
  if (p.tenant.empty() || p.tenant.size() > 128) {
    return absl::InvalidArgumentError(absl::StrCat(where, ".tenant: 1 to 128 bytes"));
  }
  if (role != "user" && role != "admin") {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ".role: \"", role, "\" (expected user or admin)"));
  }
  p.role = role == "admin" ? Role::kAdmin : Role::kUser;
  return p;
}

}  // namespace

bool Principal::AllowsModel(const std::string& model) const {
  return models.empty() || std::find(models.begin(), models.end(), model) != models.end();
}

absl::Status Principal::CheckModel(const std::string& model) const {
  if (AllowsModel(model)) return absl::OkStatus();
  return absl::PermissionDeniedError(
      absl::StrCat("this API key (tenant \"", tenant, "\") may not use model \"", model, "\""));
}

absl::StatusOr<std::string> Principal::TenantFor(const std::string& requested) const {
  if (requested.empty() || requested == tenant) return tenant;
  if (role == Role::kAdmin) return requested;
  return absl::PermissionDeniedError(
      absl::StrCat("this API key acts as tenant \"", tenant, "\", not \"", requested, "\""));
}

std::string Sha256Hex(absl::string_view text) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(text.data(), text.size(), digest, &len, EVP_sha256(), nullptr);
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(digest), static_cast<size_t>(len)));
}

std::string NewApiKey() {
  unsigned char bytes[32];
  if (RAND_bytes(bytes, sizeof(bytes)) != 1) {
    spdlog::critical("the system random number generator failed");
    std::abort();
  }
  std::string out;
  absl::WebSafeBase64Escape(absl::string_view(reinterpret_cast<const char*>(bytes), sizeof(bytes)),
                            &out);
  return "bk_" + out;
}

absl::StatusOr<std::map<std::string, Principal>> ParseKeyFile(const std::string& text,
                                                              const std::string& source) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& ex) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not YAML (", ex.what(), ")"));
  }
  std::map<std::string, Principal> out;
  if (!root || root.IsNull()) return out;  // an empty file: no keys (every call refused)
  if (!root.IsMap() || !root["keys"] || !root["keys"].IsSequence() || root.size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": expected one key, keys: [...]"));
  }
  const YAML::Node keys = root["keys"];
  for (size_t i = 0; i < keys.size(); ++i) {
    const std::string where = absl::StrCat(source, ": keys[", i, "]");
    std::string hash;
    auto p = ParseEntry(keys[i], where, &hash);
    if (!p.ok()) return p.status();
    if (!out.emplace(hash, *p).second) {
      return absl::InvalidArgumentError(absl::StrCat(where, ".sha256: listed twice"));
    }
  }
  return out;
}

namespace {

// The key file's text with `entry` added. The entry is appended as one
// flow-style line after the last one, so the operator's comments and layout
// stay; when the file's layout does not allow that (a flow-style list, keys
// not last), the file is written anew by yaml-cpp, which drops comments.
std::string WithKeyAppended(const std::string& text, const YAML::Node& entry, size_t had,
                            const std::string& path) {
  YAML::Emitter line;
  line << YAML::Flow << entry;
  if (text.empty() || YAML::Load(text).IsNull()) {
    return absl::StrCat(
        "# API keys (scheduler.auth.keys_file): SHA-256 hashes only; `ballast keys add`\n",
        "keys:\n  - ", line.c_str(), "\n");
  }
  std::string indent = "  ";
  if (const auto dash = text.find("- "); dash != std::string::npos) {
    const auto bol = text.rfind('\n', dash);
    const std::string lead = text.substr(bol == std::string::npos ? 0 : bol + 1,
                                         dash - (bol == std::string::npos ? 0 : bol + 1));
    if (lead.find_first_not_of(' ') == std::string::npos) indent = lead;
  }
  std::string appended = text;
  if (appended.back() != '\n') appended += '\n';
  appended += absl::StrCat(indent, "- ", line.c_str(), "\n");
  if (auto parsed = ParseKeyFile(appended, path); parsed.ok() && parsed->size() == had + 1) {
    return appended;
  }
  YAML::Node root = YAML::Load(text);
  root["keys"].push_back(entry);
  YAML::Emitter out;
  out << root;
  return absl::StrCat(
      "# API keys (scheduler.auth.keys_file): SHA-256 hashes only; `ballast keys add`\n",
      out.c_str(), "\n");
}

}  // namespace

absl::StatusOr<std::string> AddKey(const std::string& path, const Principal& who) {
  std::string text;
  if (std::filesystem::exists(path)) {
    auto t = ReadFile(path);
    if (!t.ok()) return t.status();
    text = *t;
  }
  auto keys = ParseKeyFile(text, path);  // refuse to append to a broken file
  if (!keys.ok()) return keys.status();
  const std::string key = NewApiKey();
  YAML::Node entry;
  entry["sha256"] = Sha256Hex(key);
  entry["tenant"] = who.tenant;
  entry["role"] = who.role == Role::kAdmin ? "admin" : "user";
  if (!who.models.empty()) entry["models"] = who.models;
  std::string where;
  if (auto p = ParseEntry(entry, "the new key", &where); !p.ok()) return p.status();
  const std::string out = WithKeyAppended(text, entry, keys->size(), path);
  const std::string tmp = absl::StrCat(path, ".tmp.", getpid(), ".", Sha256Hex(key).substr(0, 8));
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << out;
    f.close();
    if (!f) return absl::PermissionDeniedError(absl::StrCat("cannot write ", tmp));
  }
  std::error_code ec;
  std::filesystem::permissions(
      tmp, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write, ec);
  std::filesystem::rename(tmp, path, ec);
  if (ec)
    return absl::PermissionDeniedError(absl::StrCat("cannot replace ", path, ": ", ec.message()));
  return key;
}

absl::StatusOr<std::unique_ptr<KeyStore>> KeyStore::Load(const std::string& path) {
  auto text = ReadFile(path);
  if (!text.ok()) return text.status();
  auto keys = ParseKeyFile(*text, path);
  if (!keys.ok()) return keys.status();
  std::unique_ptr<KeyStore> s(new KeyStore(path));
  absl::MutexLock lock(&s->mu_);
  s->by_hash_ = std::move(*keys);
  s->signature_ = FileSignature(path);
  s->checked_ = absl::Now();
  return s;
}

void KeyStore::MaybeReload() {
  const absl::Time now = absl::Now();
  std::string known;
  {
    absl::MutexLock lock(&mu_);
    if (reloading_ || now - checked_ < absl::Seconds(1)) return;
    checked_ = now;
    reloading_ = true;  // one caller reads the file; the others use the keys they have
    known = signature_;
  }
  // The file is read and parsed outside the lock: calls keep authenticating.
  const std::string signature = FileSignature(path_);
  std::optional<absl::StatusOr<std::map<std::string, Principal>>> keys;
  if (signature != known) {
    auto text = ReadFile(path_);
    keys = text.ok() ? ParseKeyFile(*text, path_) : text.status();
  }
  absl::MutexLock lock(&mu_);
  reloading_ = false;
  if (!keys) return;
  signature_ = signature;
  if (!keys->ok()) {
    spdlog::error("API keys not reloaded, keeping the previous {}: {}", by_hash_.size(),
                  std::string(keys->status().message()));
    return;
  }
  by_hash_ = std::move(**keys);
  spdlog::info("API keys reloaded from {}: {}", path_, by_hash_.size());
}

absl::StatusOr<Principal> KeyStore::Authenticate(absl::string_view authorization) {
  if (authorization.empty()) {
    return absl::UnauthenticatedError(
        "this server needs an API key: send \"authorization: Bearer <key>\" (gRPC metadata) or "
        "the HTTP Authorization header");
  }
  absl::string_view key = authorization;
  if (key.size() < 7 || !absl::EqualsIgnoreCase(key.substr(0, 7), "bearer ")) {
    return absl::UnauthenticatedError("the authorization value must be \"Bearer <key>\"");
  }
  key = absl::StripAsciiWhitespace(key.substr(7));
  const std::string hash = Sha256Hex(key);
  MaybeReload();
  absl::MutexLock lock(&mu_);
  auto it = by_hash_.find(hash);
  if (it == by_hash_.end()) return absl::UnauthenticatedError("unknown or revoked API key");
  return it->second;
}

absl::StatusOr<std::optional<Principal>> CallerOf(KeyStore* keys,
                                                  const grpc::ServerContextBase& ctx) {
  if (keys == nullptr) return std::nullopt;
  const auto& md = ctx.client_metadata();
  const auto it = md.find(kAuthorizationKey);
  const absl::string_view value = it == md.end()
                                      ? absl::string_view()
                                      : absl::string_view(it->second.data(), it->second.size());
  auto p = keys->Authenticate(value);
  if (!p.ok()) return p.status();
  return std::optional<Principal>(std::move(*p));
}

bool KeyStore::KnowsTenant(const std::string& tenant) const {
  absl::MutexLock lock(&mu_);
  for (const auto& [hash, p] : by_hash_)
    if (p.tenant == tenant) return true;
  return false;
}

int KeyStore::size() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(by_hash_.size());
}

}  // namespace ballast::server
