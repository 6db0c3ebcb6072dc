// CatalogueStore: the Admin API's changes to the model catalogue, kept in a
// file so that a restarted scheduler serves what it acknowledged (and does
// not evict the replicas of models registered at run time as unknown).
//
// What is stored: the specs registered through Admin (RegisterModel,
// including KV limit changes) and the names unregistered through it. At
// start the catalogue is the config's `models`, minus the unregistered
// names, plus (replacing a config model of the same name) the registered
// specs: the Admin's latest word wins over the config file.
//
// File: JSON, {"version": 1, "registered": [spec...], "unregistered":
// [name...]}, written whole to a temporary in the same directory, fsynced,
// renamed into place and the directory fsynced: a crash leaves the old file
// or the new one. Errors name the file and the offending key.
//
// Thread-safety: thread-safe (one mutex); Record* calls are serialized and
// each returns once the file is durable.
#pragma once

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "global_scheduler/model_registry.h"

namespace ballast::global_scheduler {

class CatalogueStore {
 public:
  // Opens `path`: reads it if it exists (a missing file is an empty store;
  // its directory must exist). INVALID_ARGUMENT / DATA_LOSS naming the
  // file and key for a file that cannot be parsed.
  static absl::StatusOr<std::unique_ptr<CatalogueStore>> Open(const std::string& path);

  // The catalogue at start: `config_models` changed as described above.
  std::vector<ModelSpec> Apply(const std::vector<ModelSpec>& config_models) const;

  // Persists a registration (replacing an earlier one of that name) or an
  // unregistration. On error nothing changes, in memory or on disk.
  absl::Status RecordRegistered(const ModelSpec& spec);
  absl::Status RecordUnregistered(const std::string& name);

  const std::string& path() const { return path_; }

 private:
  explicit CatalogueStore(std::string path) : path_(std::move(path)) {}
  // Writes `registered` and `unregistered` durably. REQUIRES: mu_ held.
  absl::Status Save(const std::map<std::string, ModelSpec>& registered,
                    const std::set<std::string>& unregistered) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string path_;
  mutable absl::Mutex mu_;
  std::map<std::string, ModelSpec> registered_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> unregistered_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ballast::global_scheduler
