#include "server/sim_config.h"

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "server/yaml_section.h"

namespace ballast::server {
namespace {

// policy.remap (the daemon's node.memory.remap, its checks): fields absent
// keep `r`'s values (a variant's start from `policy`'s).
absl::Status ParseRemap(const YAML::Node& node, const std::string& key, const std::string* file,
                        sim::SimRemap* r) {
  YamlSection s(node, key, file);
  RETURN_IF_ERROR(s.Check());
  RETURN_IF_ERROR(s.Get("enabled", &r->enabled));
  RETURN_IF_ERROR(s.Get("max_fraction", &r->max_fraction));
  RETURN_IF_ERROR(s.Get("respect_timing", &r->respect_timing));
  RETURN_IF_ERROR(s.Get("revert_after_s", &r->revert_after_s));
  RETURN_IF_ERROR(s.Finish());
  if (!(r->max_fraction > 0 && r->max_fraction < 1)) {
    return s.Error(s.Key("max_fraction"), "must be in (0, 1)");
  }
  if (!(r->revert_after_s >= 0)) return s.Error(s.Key("revert_after_s"), "must be >= 0");
  return absl::OkStatus();
}

// Sets *out to the value `text` names in `table` (the YAML's `name` key);
// empty `text` (the key was not given) leaves it; a name not in the table
// is an error naming the key.
template <typename E, size_t N>
absl::Status SetNamed(const YamlSection& s, const char* name, const std::string& text,
                      const sim::NamedValue<E> (&table)[N], const char* expected, E* out) {
  if (text.empty()) return absl::OkStatus();
  const std::optional<E> v = sim::ParseNamed(text, table);
  if (!v) return s.Error(s.Key(name), expected);
  *out = *v;
  return absl::OkStatus();
}

// The policy's numeric keys within their ranges; errors name the key.
absl::Status CheckPolicyRanges(const YamlSection& s, const sim::SimPolicy& policy) {
  const sim::SimPolicy* p = &policy;
  if (p->max_batch_tokens <= 0) return s.Error(s.Key("max_batch_tokens"), "must be > 0");
  if (p->kv_block_tokens <= 0) return s.Error(s.Key("kv_block_tokens"), "must be > 0");
  if (p->max_context < 0) return s.Error(s.Key("max_context"), "must be >= 0 (0: not charged)");
  if (p->gpu_sms <= 0) return s.Error(s.Key("gpu_sms"), "must be > 0");
  if (p->page_mib < 0 || p->page_mib > 4096) {
    return s.Error(s.Key("page_mib"), "must be in [0, 4096] (0: bytes exact)");
  }
  if (p->control_interval_s <= 0) return s.Error(s.Key("control_interval_s"), "must be > 0");
  if (p->demand_window_s <= 0) return s.Error(s.Key("demand_window_s"), "must be > 0");
  if (p->kv_pressure_free_fraction < 0 || p->kv_pressure_free_fraction >= 1) {
    return s.Error(s.Key("kv_pressure_free_fraction"), "must be in [0, 1)");
  }
  if (p->migration_threshold < 0) return s.Error(s.Key("migration_threshold"), "must be >= 0");
  if (!(p->step_host_s >= 0)) return s.Error(s.Key("step_host_s"), "must be >= 0");
  if (!(p->promote_after_slo >= 0)) {
    return s.Error(s.Key("promote_after_slo"), "must be >= 0 (0: no aging)");
  }
  if (!(p->request_path_s >= 0 && p->request_path_s < 60)) {
    return s.Error(s.Key("request_path_s"), "must be in [0, 60) seconds");
  }
  if (!(p->rolling_share_exponent >= 0 && p->rolling_share_exponent <= 4)) {
    return s.Error(s.Key("rolling_share_exponent"), "must be in [0, 4]");
  }
  if (p->rolling_skinny_rows < 0) return s.Error(s.Key("rolling_skinny_rows"), "must be >= 0");
  if (!(p->rolling_skinny_weight > 0 && p->rolling_skinny_weight <= 100)) {
    return s.Error(s.Key("rolling_skinny_weight"), "must be in (0, 100]");
  }
  if (!(p->rolling_cross_weight >= 0 && p->rolling_cross_weight <= 1)) {
    return s.Error(s.Key("rolling_cross_weight"), "must be in [0, 1]");
  }
  if (!(p->rolling_overlap_share >= 0 && p->rolling_overlap_share <= 1)) {
    return s.Error(s.Key("rolling_overlap_share"), "must be in [0, 1]");
  }
  if (!(p->lockstep_overlap_share >= 0 && p->lockstep_overlap_share <= 1)) {
    return s.Error(s.Key("lockstep_overlap_share"), "must be in [0, 1]");
  }
  if (!(p->step_budget_headroom >= 0)) {
    return s.Error(s.Key("step_budget_headroom"), "must be >= 0 (0: off)");
  }
  if (!(p->tp_allreduce_latency_s >= 0)) {
    return s.Error(s.Key("tp_allreduce_latency_s"), "must be >= 0");
  }
  if (!(p->tp_allreduce_bus_bytes_per_s > 0)) {
    return s.Error(s.Key("tp_allreduce_bus_bytes_per_s"), "must be > 0");
  }
  if (p->min_kv_fraction < 0 || p->min_kv_fraction >= 1) {
    return s.Error(s.Key("min_kv_fraction"), "must be in [0, 1)");
  }
  return absl::OkStatus();
}

absl::Status ParsePolicy(const YAML::Node& node, const std::string& key, const std::string* file,
                         sim::SimPolicy* p) {
  YamlSection s(node, key, file);
  RETURN_IF_ERROR(s.Check());
  std::string arbitration, session_kv, memory_mode, placement, activation;
  RETURN_IF_ERROR(s.Get("memory_mode", &memory_mode));
  RETURN_IF_ERROR(s.Get("placement", &placement));
  RETURN_IF_ERROR(s.Get("activation", &activation));
  RETURN_IF_ERROR(s.Get("arbitration", &arbitration));
  RETURN_IF_ERROR(s.Get("promote_after_slo", &p->promote_after_slo));
  RETURN_IF_ERROR(s.Get("idle_evict_after_s", &p->idle_evict_after_s));
  RETURN_IF_ERROR(s.Get("kv_pressure_free_fraction", &p->kv_pressure_free_fraction));
  RETURN_IF_ERROR(s.Get("min_kv_fraction", &p->min_kv_fraction));
  RETURN_IF_ERROR(s.Get("max_batch_tokens", &p->max_batch_tokens));
  RETURN_IF_ERROR(s.Get("overlap_steps", &p->overlap_steps));
  RETURN_IF_ERROR(s.Get("rolling_steps", &p->rolling_steps));
  RETURN_IF_ERROR(s.Get("rolling_share_exponent", &p->rolling_share_exponent));
  RETURN_IF_ERROR(s.Get("rolling_overlap_share", &p->rolling_overlap_share));
  RETURN_IF_ERROR(s.Get("rolling_skinny_rows", &p->rolling_skinny_rows));
  RETURN_IF_ERROR(s.Get("rolling_skinny_weight", &p->rolling_skinny_weight));
  RETURN_IF_ERROR(s.Get("rolling_cross_weight", &p->rolling_cross_weight));
  RETURN_IF_ERROR(s.Get("lockstep_overlap_share", &p->lockstep_overlap_share));
  RETURN_IF_ERROR(s.Get("ahead_steps", &p->ahead_steps));
  RETURN_IF_ERROR(s.Get("ahead_admissions_lend", &p->ahead_admissions_lend));
  RETURN_IF_ERROR(s.Get("growth_waits_for_victims", &p->growth_waits_for_victims));
  RETURN_IF_ERROR(s.Get("ahead_growth_asks_nobody", &p->ahead_growth_asks_nobody));
  RETURN_IF_ERROR(s.Get("step_host_s", &p->step_host_s));
  RETURN_IF_ERROR(s.Get("request_path_s", &p->request_path_s));
  RETURN_IF_ERROR(s.Get("control_interval_s", &p->control_interval_s));
  RETURN_IF_ERROR(s.Get("demand_window_s", &p->demand_window_s));
  RETURN_IF_ERROR(s.Get("rebalance_interval_s", &p->rebalance_interval_s));
  RETURN_IF_ERROR(s.Get("migration_threshold", &p->migration_threshold));
  RETURN_IF_ERROR(s.Get("migrate_within_node", &p->migrate_within_node));
  RETURN_IF_ERROR(s.Get("tp_allreduce_latency_s", &p->tp_allreduce_latency_s));
  RETURN_IF_ERROR(s.Get("step_budget_headroom", &p->step_budget_headroom));
  RETURN_IF_ERROR(s.Get("tp_allreduce_bus_bytes_per_s", &p->tp_allreduce_bus_bytes_per_s));
  RETURN_IF_ERROR(s.Get("session_kv", &session_kv));
  RETURN_IF_ERROR(s.Get("kv_paged", &p->kv_paged));
  RETURN_IF_ERROR(s.Get("kv_block_tokens", &p->kv_block_tokens));
  RETURN_IF_ERROR(s.Get("charge_workspace", &p->charge_workspace));
  RETURN_IF_ERROR(s.Get("page_mib", &p->page_mib));
  RETURN_IF_ERROR(s.Get("max_context", &p->max_context));
  RETURN_IF_ERROR(s.Get("gpu_sms", &p->gpu_sms));
  const YAML::Node remap = s.Child("remap");
  RETURN_IF_ERROR(s.Finish());
  if (remap) RETURN_IF_ERROR(ParseRemap(remap, s.Key("remap"), file, &p->remap));
  RETURN_IF_ERROR(SetNamed(s, "memory_mode", memory_mode, sim::kMemoryModeNames,
                           "expected elastic or static", &p->memory_mode));
  RETURN_IF_ERROR(SetNamed(s, "placement", placement, sim::kPlacementNames,
                           "expected most_free, kvpr or mme", &p->placement));
  RETURN_IF_ERROR(SetNamed(s, "activation", activation, sim::kActivationNames,
                           "expected on_demand or fixed", &p->activation));
  if (!arbitration.empty()) {
    auto a = node_manager::ParseArbitrationPolicy(arbitration);
    if (!a.ok()) return s.Error(s.Key("arbitration"), std::string(a.status().message()));
    p->arbitration = *a;
  }
  RETURN_IF_ERROR(CheckPolicyRanges(s, *p));
  if (!session_kv.empty()) {
    const std::optional<sim::SessionKv> kv = sim::ParseSessionKv(session_kv);
    if (!kv) {
      return s.Error(s.Key("session_kv"),
                     absl::StrCat("\"", session_kv, "\": expected tiers, device or recompute"));
    }
    p->session_kv = *kv;
  }
  return absl::OkStatus();
}

absl::StatusOr<int> DtypeBytes(const YamlSection& s, const std::string& key,
                               const std::string& value) {
  if (value == "bf16" || value == "fp16") return 2;
  if (value == "fp8") return 1;
  return s.Error(s.Key(key), absl::StrCat("\"", value, "\": expected bf16, fp16 or fp8"));
}

absl::Status ParseShape(const YAML::Node& node, const std::string& key, const std::string* file,
                        sim::ModelShape* shape) {
  if (node.IsScalar()) {
    auto named = sim::NamedShape(node.as<std::string>());
    if (!named.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(*file, ": ", key, ": ", named.status().message()));
    }
    *shape = *named;
    return absl::OkStatus();
  }
  YamlSection s(node, key, file);
  RETURN_IF_ERROR(s.Check());
  RETURN_IF_ERROR(s.Get("layers", &shape->layers));
  RETURN_IF_ERROR(s.Get("hidden", &shape->hidden));
  RETURN_IF_ERROR(s.Get("heads", &shape->heads));
  RETURN_IF_ERROR(s.Get("kv_heads", &shape->kv_heads));
  RETURN_IF_ERROR(s.Get("head_dim", &shape->head_dim));
  RETURN_IF_ERROR(s.Get("intermediate", &shape->intermediate));
  RETURN_IF_ERROR(s.Get("vocab", &shape->vocab));
  RETURN_IF_ERROR(s.Get("tied_embeddings", &shape->tied_embeddings));
  RETURN_IF_ERROR(s.Finish());
  if (shape->head_dim == 0 && shape->heads > 0) shape->head_dim = shape->hidden / shape->heads;
  if (shape->layers <= 0 || shape->hidden <= 0 || shape->heads <= 0 || shape->kv_heads <= 0 ||
      shape->intermediate <= 0 || shape->vocab <= 0 || shape->head_dim <= 0) {
    return s.Error(key, "needs layers, hidden, heads, kv_heads, intermediate and vocab > 0");
  }
  return absl::OkStatus();
}

absl::Status ParseModel(const YAML::Node& node, const std::string& key, const std::string* file,
                        std::vector<sim::SimModel>* out) {
  YamlSection s(node, key, file);
  RETURN_IF_ERROR(s.Check());
  sim::SimModel m;
  std::string weight_dtype = "bf16", kv_dtype = "bf16";
  int copies = 1;
  RETURN_IF_ERROR(s.Get("name", &m.name));
  RETURN_IF_ERROR(s.Get("weight_dtype", &weight_dtype));
  RETURN_IF_ERROR(s.Get("kv_dtype", &kv_dtype));
  RETURN_IF_ERROR(s.Get("ttft_ms", &m.ttft_ms));
  RETURN_IF_ERROR(s.Get("tpot_ms", &m.tpot_ms));
  RETURN_IF_ERROR(s.Get("max_seqs", &m.max_seqs));
  RETURN_IF_ERROR(s.Get("replicas", &m.replicas));
  RETURN_IF_ERROR(s.Get("tp", &m.tp));
  RETURN_IF_ERROR(s.Get("copies", &copies));
  const YAML::Node shape = s.Child("shape");
  RETURN_IF_ERROR(s.Finish());
  if (m.name.empty()) return s.Error(s.Key("name"), "required");
  if (!shape) return s.Error(s.Key("shape"), "required (a name such as llama-8b, or a mapping)");
  RETURN_IF_ERROR(ParseShape(shape, s.Key("shape"), file, &m.shape));
  m.shape_name = shape.IsScalar() ? shape.as<std::string>() : "custom";
  auto wb = DtypeBytes(s, "weight_dtype", weight_dtype);
  auto kb = DtypeBytes(s, "kv_dtype", kv_dtype);
  if (!wb.ok()) return wb.status();
  if (!kb.ok()) return kb.status();
  m.shape.weight_dtype_bytes = *wb;
  m.shape.kv_dtype_bytes = *kb;
  if (m.ttft_ms == 0 || m.tpot_ms == 0) return s.Error(key, "ttft_ms and tpot_ms must be > 0");
  if (m.max_seqs <= 0) return s.Error(s.Key("max_seqs"), "must be > 0");
  if (m.replicas < 1) return s.Error(s.Key("replicas"), "must be >= 1");
  if (m.tp < 1 || m.shape.heads % m.tp != 0) {
    return s.Error(s.Key("tp"), absl::StrCat("must be >= 1 and divide the shape's ", m.shape.heads,
                                             " attention heads"));
  }
  if (copies <= 0) return s.Error(s.Key("copies"), "must be > 0");
  if (copies == 1) {
    out->push_back(m);
    return absl::OkStatus();
  }
  for (int i = 0; i < copies; ++i) {
    sim::SimModel c = m;
    c.name = absl::StrCat(m.name, "-", i);
    out->push_back(std::move(c));
  }
  return absl::OkStatus();
}

absl::Status ParseTop(const YAML::Node& root, const std::string* file, SimFile* f) {
  YamlSection top(root, "", file);
  RETURN_IF_ERROR(top.Check());
  std::string calibration;
  RETURN_IF_ERROR(top.Get("calibration", &calibration));
  RETURN_IF_ERROR(top.Get("drain_s", &f->config.drain_s));
  const YAML::Node cluster = top.Child("cluster"), policy = top.Child("policy");
  const YAML::Node policies = top.Child("policies"), models = top.Child("models");
  RETURN_IF_ERROR(top.Finish());
  if (calibration.empty()) return top.Error("calibration", "required (a calibration JSON file)");
  f->calibration_path =
      (std::filesystem::path(*file).parent_path() / calibration).lexically_normal().string();
  YamlSection c(cluster, "cluster", file);
  if (cluster) RETURN_IF_ERROR(c.Check());
  sim::SimCluster& cl = f->config.cluster;
  double memory_gib = 0;
  double dram_gib = static_cast<double>(cl.dram_bytes) / (1LL << 30);
  double ssd_gib = static_cast<double>(cl.ssd_bytes) / (1LL << 30);
  RETURN_IF_ERROR(c.Get("nodes", &cl.nodes));
  RETURN_IF_ERROR(c.Get("gpus_per_node", &cl.gpus_per_node));
  RETURN_IF_ERROR(c.Get("gpus", &cl.gpus));
  RETURN_IF_ERROR(c.Get("gpu_memory_gib", &memory_gib));
  RETURN_IF_ERROR(c.Get("dram_gib", &dram_gib));
  RETURN_IF_ERROR(c.Get("ssd_gib", &ssd_gib));
  if (cluster) RETURN_IF_ERROR(c.Finish());
  if (cl.nodes <= 0 || cl.gpus_per_node <= 0 || cl.gpus < 0 || memory_gib < 0) {
    return c.Error("cluster", "nodes and gpus_per_node must be > 0, gpus and gpu_memory_gib >= 0");
  }
  if (!(dram_gib >= 0)) return c.Error(c.Key("dram_gib"), "must be >= 0 (0: no DRAM tier)");
  if (!(ssd_gib >= 0)) return c.Error(c.Key("ssd_gib"), "must be >= 0 (0: no SSD tier)");
  cl.dram_bytes = static_cast<int64_t>(dram_gib * (1LL << 30));
  cl.ssd_bytes = static_cast<int64_t>(ssd_gib * (1LL << 30));
  // gpus: that many in all, on as many nodes as it takes.
  if (cl.gpus > 0) cl.nodes = (cl.gpus + cl.gpus_per_node - 1) / cl.gpus_per_node;
  if (f->config.drain_s < 0) return top.Error("drain_s", "must be >= 0");
  f->config.cluster.gpu_memory_bytes = static_cast<int64_t>(memory_gib * (1LL << 30));
  if (policy) RETURN_IF_ERROR(ParsePolicy(policy, "policy", file, &f->config.policy));
  if (policies) {
    if (!policies.IsMap()) return top.Error("policies", "expected a mapping of name: policy");
    for (auto it = policies.begin(); it != policies.end(); ++it) {
      if (!it->first.IsScalar()) return top.Error("policies", "names must be plain strings");
      const std::string name = it->first.as<std::string>();
      sim::SimPolicy p = f->config.policy;
      RETURN_IF_ERROR(ParsePolicy(it->second, absl::StrCat("policies.", name), file, &p));
      f->variants[name] = p;
    }
  }
  if (!models || !models.IsSequence() || models.size() == 0) {
    return top.Error("models", "a non-empty list of models");
  }
  for (size_t i = 0; i < models.size(); ++i) {
    RETURN_IF_ERROR(
        ParseModel(models[i], absl::StrCat("models[", i, "]"), file, &f->config.models));
  }
  std::set<std::string> names;
  for (const auto& m : f->config.models) {
    if (!names.insert(m.name).second) {
      return top.Error("models", absl::StrCat("model \"", m.name, "\" appears twice"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SimFile> ParseSimConfig(const std::string& yaml, const std::string& path) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not valid YAML: ", e.what()));
  }
  SimFile f;
  RETURN_IF_ERROR(ParseTop(root, &path, &f));
  return f;
}

absl::StatusOr<SimFile> ReadSimConfig(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open the config file"));
  std::stringstream ss;
  ss << in.rdbuf();
  return ParseSimConfig(ss.str(), path);
}

}  // namespace ballast::server
