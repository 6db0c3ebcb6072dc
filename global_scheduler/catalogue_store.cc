#include "global_scheduler/catalogue_store.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace ballast::global_scheduler {
namespace {

using json = nlohmann::json;

json ToJson(const ModelSpec& s) {
  return {{"name", s.name},
          {"path", s.path},
          {"kv_dtype", s.kv_dtype},
          {"ttft_ms", s.ttft_ms},
          {"tpot_ms", s.tpot_ms},
          {"replicas", s.replicas},
          {"kv_floor_bytes", s.kv_floor_bytes},
          {"kv_limit_bytes", s.kv_limit_bytes}};
}

// Reads key `k` of `j` into `out` if present; errors name file and key.
template <typename T>
absl::Status Field(const json& j, const char* k, const std::string& where, T* out) {
  if (!j.contains(k)) return absl::OkStatus();
  try {
    *out = j.at(k).get<T>();
  } catch (const json::exception&) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ".", k, ": wrong type (got ", j.at(k).dump(), ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<ModelSpec> FromJson(const json& j, const std::string& where) {
  if (!j.is_object())
    return absl::InvalidArgumentError(absl::StrCat(where, ": expected an object"));
  ModelSpec s;
  for (auto st : {Field(j, "name", where, &s.name), Field(j, "path", where, &s.path),
                  Field(j, "kv_dtype", where, &s.kv_dtype), Field(j, "ttft_ms", where, &s.ttft_ms),
                  Field(j, "tpot_ms", where, &s.tpot_ms), Field(j, "replicas", where, &s.replicas),
                  Field(j, "kv_floor_bytes", where, &s.kv_floor_bytes),
                  Field(j, "kv_limit_bytes", where, &s.kv_limit_bytes)}) {
    if (!st.ok()) return st;
  }
  if (s.name.empty()) return absl::InvalidArgumentError(absl::StrCat(where, ".name: missing"));
  return s;
}

absl::Status Errno(const std::string& what, const std::string& path) {
  return absl::UnavailableError(absl::StrCat("cannot ", what, " ", path, ": ", strerror(errno)));
}

// Writes `text` to `path` durably: temporary, fsync, rename, fsync of the
// directory.
absl::Status WriteDurably(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("create", tmp);
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      absl::Status st = Errno("write", tmp);
      ::close(fd);
      ::unlink(tmp.c_str());
      return st;
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    absl::Status st = Errno("fsync", tmp);
    ::close(fd);
    ::unlink(tmp.c_str());
    return st;
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    absl::Status st = Errno("rename into", path);
    ::unlink(tmp.c_str());
    return st;
  }
  const std::string dir = std::filesystem::path(path).parent_path().string();
  const int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<CatalogueStore>> CatalogueStore::Open(const std::string& path) {
  std::unique_ptr<CatalogueStore> store(new CatalogueStore(path));
  std::ifstream in(path);
  if (!in) {
    if (std::filesystem::exists(path)) return Errno("read", path);
    const auto dir = std::filesystem::path(path).parent_path();
    if (!dir.empty() && !std::filesystem::is_directory(dir)) {
      return absl::InvalidArgumentError(
          absl::StrCat("catalogue file ", path, ": directory ", dir.string(), " does not exist"));
    }
    return store;  // nothing persisted yet
  }
  std::stringstream text;
  text << in.rdbuf();
  json j;
  try {
    j = json::parse(text.str());
  } catch (const json::exception& e) {
    return absl::DataLossError(absl::StrCat(path, ": not valid JSON: ", e.what()));
  }
  if (!j.is_object() || !j.contains("version") || j["version"] != 1) {
    return absl::DataLossError(absl::StrCat(path, ": version: expected 1"));
  }
  for (const char* list : {"registered", "unregistered"}) {
    if (j.contains(list) && !j[list].is_array()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": ", list, ": expected a list"));
    }
  }
  absl::MutexLock lock(&store->mu_);
  const json registered = j.value("registered", json::array());
  for (size_t i = 0; i < registered.size(); ++i) {
    auto spec = FromJson(registered[i], absl::StrCat(path, ": registered[", i, "]"));
    if (!spec.ok()) return spec.status();
    store->registered_[spec->name] = *spec;
  }
  const json unregistered = j.value("unregistered", json::array());
  for (size_t i = 0; i < unregistered.size(); ++i) {
    if (!unregistered[i].is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": unregistered[", i, "]: expected a model name"));
    }
    store->unregistered_.insert(unregistered[i].get<std::string>());
  }
  return store;
}

std::vector<ModelSpec> CatalogueStore::Apply(const std::vector<ModelSpec>& config_models) const {
  absl::MutexLock lock(&mu_);
  std::vector<ModelSpec> out;
  for (const ModelSpec& m : config_models) {
    if (unregistered_.count(m.name) || registered_.count(m.name)) continue;
    out.push_back(m);
  }
  for (const auto& [name, spec] : registered_) out.push_back(spec);
  return out;
}

absl::Status CatalogueStore::RecordRegistered(const ModelSpec& spec) {
  absl::MutexLock lock(&mu_);
  auto registered = registered_;
  auto unregistered = unregistered_;
  registered[spec.name] = spec;
  unregistered.erase(spec.name);
  if (auto st = Save(registered, unregistered); !st.ok()) return st;
  registered_ = std::move(registered);
  unregistered_ = std::move(unregistered);
  return absl::OkStatus();
}

absl::Status CatalogueStore::RecordUnregistered(const std::string& name) {
  absl::MutexLock lock(&mu_);
  auto registered = registered_;
  auto unregistered = unregistered_;
  registered.erase(name);
  unregistered.insert(name);
  if (auto st = Save(registered, unregistered); !st.ok()) return st;
  registered_ = std::move(registered);
  unregistered_ = std::move(unregistered);
  return absl::OkStatus();
}

absl::Status CatalogueStore::Save(const std::map<std::string, ModelSpec>& registered,
                                  const std::set<std::string>& unregistered) const {
  json j = {{"version", 1}, {"registered", json::array()}, {"unregistered", json::array()}};
  for (const auto& [name, spec] : registered) j["registered"].push_back(ToJson(spec));
  for (const auto& name : unregistered) j["unregistered"].push_back(name);
  return WriteDurably(path_, j.dump(2) + "\n");
}

}  // namespace ballast::global_scheduler
