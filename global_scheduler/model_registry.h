// ModelRegistry: the scheduler's model catalogue — what should be served,
// from where, with which SLOs and how many replicas — plus what nodes have
// reported about each model (context window, weight size, last load error).
//
// Thread-safety: all methods are thread-safe.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace ballast::global_scheduler {

struct ModelSpec {
  std::string name;
  std::string path;               // directory readable by the nodes
  std::string kv_dtype = "auto";  // auto | f32 | bf16 | fp16
  // Linear-layer weights on the nodes: none | fp8 (ModelEngineOptions).
  std::string quantization = "none";
  uint32_t ttft_ms = 0;  // 0: the scheduler's default SLO
  uint32_t tpot_ms = 0;
  int replicas = 1;            // nodes that keep it resident
  int64_t kv_floor_bytes = 0;  // elastic KV floor on each node (0: none)
  int64_t kv_limit_bytes = 0;  // elastic KV limit on each node (0: none)
};

// A model's lifecycle across the cluster (ListModels' `state`, the proto's
// v1::ModelState):
//   REGISTERED ─▶ LOADING ─▶ READY ─▶ DRAINING ─▶ EVICTED ─▶ LOADING ...
// REGISTERED: in the catalogue, no replica yet. LOADING: a load is under
// way and no replica is READY. READY: at least one replica serves.
// DRAINING: the only replicas are draining (migration or eviction).
// EVICTED: idle-evicted to make room; not reloaded until a request comes,
// which activates it (the request waits, and the wait counts in its TTFT).
// FAILED: no replica, and the last load failed (retried after a back-off).

// Why a load failed, which decides what happens next:
//   kNoRoom     the node had no memory for the weights: evict an idle model
//               for it and retry at once (the control loop does both);
//   kTransient  the node died, timed out or failed in a way that may pass:
//               retry with exponential backoff (load_retry x 2^(n-1), at
//               most 32 x load_retry);
//   kPermanent  the checkpoint or shape cannot be served (bad config,
//               unsupported shape or tokenizer, missing files): the model is
//               FAILED, requests get FAILED_PRECONDITION with the reason, and
//               nothing retries until the model is registered again.
enum class LoadFailure { kNoRoom, kTransient, kPermanent };

struct ModelStatus {
  ModelSpec spec;
  std::string architecture;
  int context_window = 0;  // 0 until a node has loaded it
  int64_t weight_bytes = 0;
  int64_t kv_bytes_per_token = 0;  // 0 until a node has loaded it
  // Its decode step when it stepped alone, as a node last reported it
  // (ResidentModel.decode_step_ms); 0 until one was.
  double decode_step_ms = 0;
  std::string last_error;  // last failed load, if any
  absl::Time retry_after = absl::InfinitePast();
  int load_failures = 0;  // consecutive failed loads (backoff exponent)
  bool failed = false;    // a permanent load failure (LoadFailure)
  // The last load failed for lack of memory: evict an idle model for it.
  bool needs_room = false;
  absl::Time last_request = absl::InfinitePast();  // or registration
  absl::Time idle_evicted = absl::InfinitePast();  // last idle eviction
  // Wanted resident: not idle-evicted since its last request.
  bool wanted() const { return idle_evicted < last_request; }
};

class ModelRegistry {
 public:
  // INVALID_ARGUMENT for an invalid name (proto/model_name.h), an empty
  // path, replicas < 1 or a KV floor above the limit; ALREADY_EXISTS if the
  // name is registered with a different spec. A spec that differs only in
  // its KV floor/limit updates them and sets *kv_limits_changed.
  // Registering a FAILED model again clears the failure (it is retried).
  absl::Status Add(const ModelSpec& spec, bool* kv_limits_changed = nullptr);
  absl::Status Remove(const std::string& name);
  std::optional<ModelStatus> Get(const std::string& name) const;
  std::vector<ModelStatus> List() const;
  bool Contains(const std::string& name) const;

  void RecordLoaded(const std::string& name, const std::string& architecture, int context_window,
                    int64_t weight_bytes, int64_t kv_bytes_per_token = 0);
  // A load failed at `now`; `base_backoff` is the first transient retry
  // delay (LoadFailure says what follows).
  void RecordLoadError(const std::string& name, const std::string& error, LoadFailure failure,
                       absl::Time now, absl::Duration base_backoff);
  void ClearNeedsRoom(const std::string& name);
  // Keeps a node's latest decode_step_ms for `name` (ignored if <= 0).
  void RecordStepMs(const std::string& name, double decode_step_ms);
  // A request arrived (or the model was registered) at `now`.
  void RecordRequest(const std::string& name, absl::Time now);
  // The model's replicas were evicted for being idle at `now`.
  void RecordIdleEvicted(const std::string& name, absl::Time now);

 private:
  mutable absl::Mutex mu_;
  std::map<std::string, ModelStatus> models_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ballast::global_scheduler
