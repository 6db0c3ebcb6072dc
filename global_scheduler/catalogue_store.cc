#include "global_scheduler/catalogue_store.h"

namespace ballast::global_scheduler {

absl::StatusOr<std::unique_ptr<CatalogueStore>> CatalogueStore::Create(StateStore* store) {
  auto stored = store->LoadCatalogue();
  if (!stored.ok()) return stored.status();
  std::unique_ptr<CatalogueStore> c(new CatalogueStore(store));
  absl::MutexLock lock(&c->mu_);
  for (ModelSpec& spec : stored->registered) c->registered_[spec.name] = std::move(spec);
  c->unregistered_.insert(stored->unregistered.begin(), stored->unregistered.end());
  return c;
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
  if (auto st = store_->PutRegistered(spec); !st.ok()) return st;
  registered_[spec.name] = spec;
  unregistered_.erase(spec.name);
  return absl::OkStatus();
}

absl::Status CatalogueStore::RecordUnregistered(const std::string& name) {
  absl::MutexLock lock(&mu_);
  if (auto st = store_->PutUnregistered(name); !st.ok()) return st;
  registered_.erase(name);
  unregistered_.insert(name);
  return absl::OkStatus();
}

}  // namespace ballast::global_scheduler
