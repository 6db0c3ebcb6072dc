// YamlSection: reads the keys of one YAML mapping of a config file,
// remembering which were read, so that Finish() rejects the rest by name;
// every error names the file and the key ("f.yaml: node.memory.mode: ...").
// Used by every config parser in server/ (nothing below server/ reads
// YAML). Thread-compatible.
#pragma once

#include <set>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "yaml-cpp/yaml.h"

namespace ballast::server {

// Reads the keys of one YAML mapping, remembering which were read, so that
// Finish() can reject the rest by name.
class YamlSection {
 public:
  YamlSection(const YAML::Node& node, std::string path, const std::string* file)
      : node_(node), path_(std::move(path)), file_(file) {}

  absl::Status Check() const {
    if (!node_.IsMap()) return Error(path_.empty() ? "(top level)" : path_, "expected a mapping");
    return absl::OkStatus();
  }

  template <typename T>
  absl::Status Get(const std::string& key, T* out) {
    seen_.insert(key);
    const YAML::Node v = node_[key];
    if (!v) return absl::OkStatus();
    try {
      *out = v.as<T>();
    } catch (const YAML::Exception&) {
      return Error(Key(key), absl::StrCat("wrong type (got \"", YAML::Dump(v), "\")"));
    }
    return absl::OkStatus();
  }

  // A nested mapping (absent -> a null node).
  YAML::Node Child(const std::string& key) {
    seen_.insert(key);
    return node_[key];
  }

  absl::Status Finish() const {
    for (auto it = node_.begin(); it != node_.end(); ++it) {
      if (!it->first.IsScalar()) {
        return Error(path_.empty() ? "(top level)" : path_,
                     absl::StrCat("keys must be plain names, not \"", YAML::Dump(it->first), "\""));
      }
      const std::string k = it->first.as<std::string>();
      if (!seen_.count(k)) return Error(Key(k), "unknown key");
    }
    return absl::OkStatus();
  }

  std::string Key(const std::string& k) const { return path_.empty() ? k : path_ + "." + k; }
  absl::Status Error(const std::string& key, const std::string& what) const {
    return absl::InvalidArgumentError(absl::StrCat(*file_, ": ", key, ": ", what));
  }

 private:
  YAML::Node node_;
  std::string path_;
  const std::string* file_;
  std::set<std::string> seen_;
};

#define RETURN_IF_ERROR(expr)  \
  do {                         \
    absl::Status _st = (expr); \
    if (!_st.ok()) return _st; \
  } while (0)

}  // namespace ballast::server
