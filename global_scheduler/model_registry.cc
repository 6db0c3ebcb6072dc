#include "global_scheduler/model_registry.h"

#include "absl/strings/str_cat.h"
#include "proto/model_name.h"

namespace ballast::global_scheduler {

absl::Status ModelRegistry::Add(const ModelSpec& spec, bool* kv_limits_changed) {
  if (kv_limits_changed != nullptr) *kv_limits_changed = false;
  if (spec.kv_floor_bytes < 0 || spec.kv_limit_bytes < 0 ||
      (spec.kv_limit_bytes > 0 && spec.kv_floor_bytes > spec.kv_limit_bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model ", spec.name, ": kv floor/limit must be >= 0 and floor <= limit (0 = none)"));
  }
  if (auto st = ValidateModelName(spec.name); !st.ok()) return st;
  if (spec.path.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("model ", spec.name, ": path is empty"));
  }
  if (spec.replicas < 1) {
    return absl::InvalidArgumentError(absl::StrCat("model ", spec.name, ": replicas must be >= 1"));
  }
  if (spec.kv_dtype != "auto" && spec.kv_dtype != "f32" && spec.kv_dtype != "bf16" &&
      spec.kv_dtype != "fp16" && spec.kv_dtype != "fp8_e4m3") {
    return absl::InvalidArgumentError(
        absl::StrCat("model ", spec.name, ": kv_dtype \"", spec.kv_dtype,
                     "\" (expected auto, f32, bf16, fp16 or fp8_e4m3)"));
  }
  // The names engine::WeightQuantName gives (config and Admin normalize
  // aliases to them), so that one quantization has one spelling here.
  if (spec.quantization != "none" && spec.quantization != "fp8") {
    return absl::InvalidArgumentError(absl::StrCat("model ", spec.name, ": quantization \"",
                                                   spec.quantization,
                                                   "\" is unknown (expected none or fp8)"));
  }
  absl::MutexLock lock(&mu_);
  auto it = models_.find(spec.name);
  if (it != models_.end()) {
    const ModelSpec& old = it->second.spec;
    if (old.path != spec.path || old.kv_dtype != spec.kv_dtype ||
        old.quantization != spec.quantization || old.replicas != spec.replicas ||
        old.ttft_ms != spec.ttft_ms || old.tpot_ms != spec.tpot_ms) {
      return absl::AlreadyExistsError(
          absl::StrCat("model ", spec.name,
                       " is already registered with a different spec; unregister it first"));
    }
    if (it->second.failed) {  // registered again: try again
      it->second.failed = false;
      it->second.load_failures = 0;
      it->second.retry_after = absl::InfinitePast();
    }
    if (old.kv_floor_bytes != spec.kv_floor_bytes || old.kv_limit_bytes != spec.kv_limit_bytes) {
      it->second.spec.kv_floor_bytes = spec.kv_floor_bytes;
      it->second.spec.kv_limit_bytes = spec.kv_limit_bytes;
      if (kv_limits_changed != nullptr) *kv_limits_changed = true;
    }
    return absl::OkStatus();
  }
  models_[spec.name].spec = spec;
  return absl::OkStatus();
}

absl::Status ModelRegistry::Remove(const std::string& name) {
  absl::MutexLock lock(&mu_);
  if (models_.erase(name) == 0) {
    return absl::NotFoundError(absl::StrCat("model ", name, " is not registered"));
  }
  return absl::OkStatus();
}

std::optional<ModelStatus> ModelRegistry::Get(const std::string& name) const {
  absl::MutexLock lock(&mu_);
  auto it = models_.find(name);
  if (it == models_.end()) return std::nullopt;
  return it->second;
}

std::vector<ModelStatus> ModelRegistry::List() const {
  absl::MutexLock lock(&mu_);
  std::vector<ModelStatus> out;
  for (const auto& [n, m] : models_) out.push_back(m);
  return out;
}

bool ModelRegistry::Contains(const std::string& name) const {
  absl::MutexLock lock(&mu_);
  return models_.count(name) > 0;
}

void ModelRegistry::RecordLoaded(const std::string& name, const std::string& architecture,
                                 int context_window, int64_t weight_bytes,
                                 int64_t kv_bytes_per_token) {
  absl::MutexLock lock(&mu_);
  auto it = models_.find(name);
  if (it == models_.end()) return;
  it->second.architecture = architecture;
  it->second.context_window = context_window;
  it->second.weight_bytes = weight_bytes;
  if (kv_bytes_per_token > 0) it->second.kv_bytes_per_token = kv_bytes_per_token;
  it->second.last_error.clear();
  it->second.needs_room = false;
  it->second.failed = false;
  it->second.load_failures = 0;
}

void ModelRegistry::RecordStepMs(const std::string& name, double decode_step_ms) {
  if (!(decode_step_ms > 0)) return;
  absl::MutexLock lock(&mu_);
  auto it = models_.find(name);
  if (it != models_.end()) it->second.decode_step_ms = decode_step_ms;
}

void ModelRegistry::RecordLoadError(const std::string& name, const std::string& error,
                                    LoadFailure failure, absl::Time now,
                                    absl::Duration base_backoff) {
  absl::MutexLock lock(&mu_);
  auto it = models_.find(name);
  if (it == models_.end()) return;
  ModelStatus& m = it->second;
  m.last_error = error;
  m.needs_room = failure == LoadFailure::kNoRoom;
  m.failed = failure == LoadFailure::kPermanent;
  switch (failure) {
    case LoadFailure::kNoRoom:
      m.retry_after = now;
      break;
    case LoadFailure::kTransient:
      m.load_failures = std::min(m.load_failures + 1, 6);
      m.retry_after = now + base_backoff * (1 << (m.load_failures - 1));
      break;
    case LoadFailure::kPermanent:
      m.retry_after = absl::InfiniteFuture();
      break;
  }
}

void ModelRegistry::ClearNeedsRoom(const std::string& name) {
  absl::MutexLock lock(&mu_);
  auto it = models_.find(name);
  if (it != models_.end()) it->second.needs_room = false;
}

void ModelRegistry::RecordRequest(const std::string& name, absl::Time now) {
  absl::MutexLock lock(&mu_);
  auto it = models_.find(name);
  if (it != models_.end()) it->second.last_request = std::max(it->second.last_request, now);
}

void ModelRegistry::RecordIdleEvicted(const std::string& name, absl::Time now) {
  absl::MutexLock lock(&mu_);
  auto it = models_.find(name);
  if (it != models_.end()) it->second.idle_evicted = now;
}

}  // namespace ballast::global_scheduler
