// CatalogueStore: the Admin API's changes to the model catalogue, kept in
// the scheduler's StateStore (state_store.h) so that a restarted scheduler
// serves what it acknowledged (and does not evict the replicas of models
// registered at run time as unknown).
//
// What is stored: the specs registered through Admin (RegisterModel,
// including KV floor and limit changes) and the names unregistered through
// it. At start the catalogue is the config's `models`, minus the
// unregistered names, plus (replacing a config model of the same name) the
// registered specs: the Admin's latest word wins over the config file.
//
// Thread-safety: thread-safe (one mutex); Record* calls are serialized and
// each returns once the store has committed the change.
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
#include "global_scheduler/state_store.h"

namespace ballast::global_scheduler {

class CatalogueStore {
 public:
  // Reads the catalogue's changes from `store`, which must outlive the
  // CatalogueStore.
  static absl::StatusOr<std::unique_ptr<CatalogueStore>> Create(StateStore* store);

  // The catalogue at start: `config_models` changed as described above.
  std::vector<ModelSpec> Apply(const std::vector<ModelSpec>& config_models) const;

  // Persists a registration (replacing an earlier one of that name) or an
  // unregistration. On error nothing changes, in memory or in the store.
  absl::Status RecordRegistered(const ModelSpec& spec);
  absl::Status RecordUnregistered(const std::string& name);

 private:
  explicit CatalogueStore(StateStore* store) : store_(store) {}

  StateStore* const store_;
  mutable absl::Mutex mu_;
  std::map<std::string, ModelSpec> registered_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> unregistered_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ballast::global_scheduler
