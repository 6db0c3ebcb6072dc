#include "server/config_engine.h"

#include "absl/strings/str_cat.h"
#include "engine/gpu_backend.h"
#include "node_manager/arbitration.h"
#include "server/yaml_section.h"

namespace ballast::server {

absl::Status ParseNodeEngine(const YAML::Node& e, const std::string* file,
                             node_manager::NodeOptions* po) {
  node_manager::NodeOptions& o = *po;
  YamlSection es(e, "node.engine", file);
  RETURN_IF_ERROR(es.Check());
  auto& eo = o.engine;
  int64_t kv_mib = eo.kv_cache_bytes >> 20;
  RETURN_IF_ERROR(es.Get("backend", &eo.backend));
  RETURN_IF_ERROR(es.Get("block_tokens", &eo.block_tokens));
  RETURN_IF_ERROR(es.Get("kv_cache_mib", &kv_mib));
  RETURN_IF_ERROR(es.Get("max_batch_tokens", &eo.max_batch_tokens));
  RETURN_IF_ERROR(es.Get("max_seqs", &eo.max_seqs));
  RETURN_IF_ERROR(es.Get("max_context", &eo.max_context));
  RETURN_IF_ERROR(es.Get("cuda_graphs", &eo.cuda_graphs));
  RETURN_IF_ERROR(es.Get("deterministic", &eo.deterministic));
  RETURN_IF_ERROR(es.Get("gemm_tune_candidates", &eo.gemm_tune_candidates));
  RETURN_IF_ERROR(es.Get("warm_products", &eo.warm_products));
  RETURN_IF_ERROR(es.Get("slow_step_warn_ms", &eo.slow_step_warn_ms));
  RETURN_IF_ERROR(es.Get("overlap_steps", &o.overlap_steps));
  RETURN_IF_ERROR(es.Get("rolling_steps", &o.rolling_steps));
  RETURN_IF_ERROR(es.Get("ahead_steps", &o.ahead_steps));
  std::string priority_streams = "none", step_done = "spinning_thread";
  RETURN_IF_ERROR(es.Get("priority_streams", &priority_streams));
  RETURN_IF_ERROR(es.Get("step_done", &step_done));
  RETURN_IF_ERROR(es.Get("sm_reserve", &eo.sm_reserve));
  RETURN_IF_ERROR(es.Get("sm_reserve_models", &eo.sm_reserve_models));
  RETURN_IF_ERROR(es.Finish());
  if (eo.backend != "cpu" && eo.backend != "cuda") {
    return es.Error("node.engine.backend",
                    absl::StrCat("\"", eo.backend, "\" is unknown (expected cpu or cuda)"));
  }
  if (eo.backend == "cuda" && !engine::GpuBackendBuilt()) {
    return es.Error("node.engine.backend",
                    "cuda: this ballast was built without CUDA (no nvcc at configure time)");
  }
  if (auto p = node_manager::ParseStreamPriorityPolicy(priority_streams); p.ok()) {
    o.priority_streams = *p;
  } else {
    return es.Error("node.engine.priority_streams", std::string(p.status().message()));
  }
  if (auto p = engine::ParseStepDoneSignal(step_done); p.ok()) {
    eo.step_done = *p;
  } else {
    return es.Error("node.engine.step_done", std::string(p.status().message()));
  }
  if (eo.sm_reserve < 0) return es.Error("node.engine.sm_reserve", "must be >= 0 (0 = off)");
  if (eo.sm_reserve > 0 && eo.backend != "cuda") {
    return es.Error("node.engine.sm_reserve", "needs backend cuda (SM partitions)");
  }
  if (eo.sm_reserve == 0 && !eo.sm_reserve_models.empty()) {
    return es.Error("node.engine.sm_reserve_models",
                    "set, but node.engine.sm_reserve is 0 (off): give the reserved SMs");
  }
  if (eo.sm_reserve > 0 && eo.sm_reserve_models.empty()) {
    return es.Error("node.engine.sm_reserve_models",
                    "names no model: list the models that get the reserved SMs");
  }
  if (eo.gemm_tune_candidates < 0 || eo.gemm_tune_candidates > 64) {
    return es.Error("node.engine.gemm_tune_candidates", "must be in [0, 64] (0 = untimed)");
  }
  if (eo.block_tokens <= 0) return es.Error("node.engine.block_tokens", "must be > 0");
  if (kv_mib <= 0) return es.Error("node.engine.kv_cache_mib", "must be > 0");
  if (eo.max_batch_tokens <= 0) return es.Error("node.engine.max_batch_tokens", "must be > 0");
  if (eo.max_seqs <= 0) return es.Error("node.engine.max_seqs", "must be > 0");
  if (!(eo.slow_step_warn_ms >= 0)) {
    return es.Error("node.engine.slow_step_warn_ms", "must be >= 0 (0 = off)");
  }
  eo.kv_cache_bytes = kv_mib << 20;
  return absl::OkStatus();
}

}  // namespace ballast::server
