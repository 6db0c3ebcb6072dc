#include "server/config.h"

#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "engine/gpu_backend.h"
#include "engine/model_config.h"
#include "node_manager/arbitration.h"
#include "server/config_engine.h"
#include "server/config_memory.h"
#include "server/yaml_section.h"
#include "yaml-cpp/yaml.h"

namespace ballast::server {
namespace {

// A model's `quantization`, checked as the engine will (WeightQuantFromConfig)
// and kept under the engine's name for it ("fp8_e4m3" reads as "fp8").
absl::Status GetQuantization(YamlSection& m, std::string* out) {
  RETURN_IF_ERROR(m.Get("quantization", out));
  auto q = engine::WeightQuantFromConfig(*out);
  if (!q.ok()) return m.Error(m.Key("quantization"), std::string(q.status().message()));
  *out = engine::WeightQuantName(*q);
  return absl::OkStatus();
}

absl::Status ParseSlo(YamlSection& parent, uint32_t* ttft, uint32_t* tpot,
                      const std::string* file) {
  YAML::Node n = parent.Child("slo");
  if (!n) return absl::OkStatus();
  YamlSection s(n, parent.Key("slo"), file);
  RETURN_IF_ERROR(s.Check());
  RETURN_IF_ERROR(s.Get("ttft_ms", ttft));
  RETURN_IF_ERROR(s.Get("tpot_ms", tpot));
  return s.Finish();
}

// scheduler.tls / node.tls (server/tls.h). Files are checked at start, once
// command-line flags have set the listen addresses (CheckTls).
absl::Status ParseTls(YamlSection& parent, bool scheduler, const std::string* file,
                      TlsSettings* t) {
  YAML::Node n = parent.Child("tls");
  if (!n) return absl::OkStatus();
  YamlSection s(n, parent.Key("tls"), file);
  RETURN_IF_ERROR(s.Check());
  RETURN_IF_ERROR(s.Get("cert_file", &t->cert_file));
  RETURN_IF_ERROR(s.Get("key_file", &t->key_file));
  RETURN_IF_ERROR(s.Get("ca_file", &t->ca_file));
  RETURN_IF_ERROR(s.Get("insecure", &t->insecure));
  RETURN_IF_ERROR(s.Get("reload_interval_s", &t->reload_interval_s));
  if (scheduler) RETURN_IF_ERROR(s.Get("require_client_cert", &t->require_client_cert));
  RETURN_IF_ERROR(s.Finish());
  if (t->reload_interval_s < 1) return s.Error(s.Key("reload_interval_s"), "must be >= 1");
  return absl::OkStatus();
}

// One set of quota limits (the defaults, or a tenant's, which start from the
// defaults).
absl::Status ParseQuotaLimits(YamlSection& s, global_scheduler::QuotaLimits* l) {
  RETURN_IF_ERROR(s.Get("requests_per_s", &l->requests_per_s));
  RETURN_IF_ERROR(s.Get("request_burst", &l->request_burst));
  RETURN_IF_ERROR(s.Get("prompt_tokens_per_s", &l->prompt_tokens_per_s));
  RETURN_IF_ERROR(s.Get("prompt_token_burst", &l->prompt_token_burst));
  RETURN_IF_ERROR(s.Get("advisories_per_s", &l->advisories_per_s));
  RETURN_IF_ERROR(s.Get("advisory_burst", &l->advisory_burst));
  RETURN_IF_ERROR(s.Get("max_sessions", &l->max_sessions));
  RETURN_IF_ERROR(s.Get("max_prompt_bytes", &l->max_prompt_bytes));
  for (const auto& [key, v] : {std::pair<const char*, double>{"requests_per_s", l->requests_per_s},
                               {"request_burst", l->request_burst},
                               {"prompt_tokens_per_s", l->prompt_tokens_per_s},
                               {"prompt_token_burst", l->prompt_token_burst},
                               {"advisories_per_s", l->advisories_per_s},
                               {"advisory_burst", l->advisory_burst},
                               {"max_sessions", static_cast<double>(l->max_sessions)},
                               {"max_prompt_bytes", static_cast<double>(l->max_prompt_bytes)}}) {
    if (!(v >= 0)) return s.Error(s.Key(key), "must be >= 0 (0: no limit)");
  }
  for (const auto& [key, v] : {std::pair<const char*, double>{"request_burst", l->request_burst},
                               {"prompt_token_burst", l->prompt_token_burst},
                               {"advisory_burst", l->advisory_burst}}) {
    if (v > 0 && v < 1) {
      return s.Error(s.Key(key), "must be 0 (the rate, at least 1) or >= 1: a call takes 1");
    }
  }
  return absl::OkStatus();
}

// scheduler.quotas: default limits, and per-tenant ones under `tenants`.
absl::Status ParseQuotas(YamlSection& parent, const std::string* file,
                         global_scheduler::QuotaOptions* q) {
  YAML::Node n = parent.Child("quotas");
  if (!n) return absl::OkStatus();
  YamlSection s(n, "scheduler.quotas", file);
  RETURN_IF_ERROR(s.Check());
  RETURN_IF_ERROR(ParseQuotaLimits(s, &q->defaults));
  RETURN_IF_ERROR(s.Get("max_tracked_tenants", &q->max_tracked_tenants));
  if (q->max_tracked_tenants < 1) return s.Error(s.Key("max_tracked_tenants"), "must be >= 1");
  if (YAML::Node t = s.Child("tenants")) {
    if (!t.IsMap()) return s.Error(s.Key("tenants"), "expected a mapping of tenant -> limits");
    for (auto it = t.begin(); it != t.end(); ++it) {
      if (!it->first.IsScalar()) return s.Error(s.Key("tenants"), "tenant names must be strings");
      const std::string name = it->first.as<std::string>();
      YamlSection ts(it->second, absl::StrCat("scheduler.quotas.tenants.", name), file);
      RETURN_IF_ERROR(ts.Check());
      global_scheduler::QuotaLimits l = q->defaults;
      RETURN_IF_ERROR(ParseQuotaLimits(ts, &l));
      RETURN_IF_ERROR(ts.Finish());
      q->tenants[name] = l;
    }
  }
  return s.Finish();
}

// scheduler.session_ttl_ms (0: sessions never expire) and max_sessions.
absl::Status ParseSessionLimits(YamlSection& s, global_scheduler::SchedulerOptions* o) {
  int64_t ttl_ms = absl::ToInt64Milliseconds(o->session_ttl);
  RETURN_IF_ERROR(s.Get("session_ttl_ms", &ttl_ms));
  if (ttl_ms < 0) return s.Error(s.Key("session_ttl_ms"), "must be >= 0 (0: never expire)");
  o->session_ttl = absl::Milliseconds(ttl_ms);
  RETURN_IF_ERROR(s.Get("max_sessions", &o->max_sessions));
  if (o->max_sessions < 1) return s.Error(s.Key("max_sessions"), "must be >= 1");
  return absl::OkStatus();
}

// scheduler.control_threads (node calls), advise_threads and advise_queue
// (admitted Advise calls).
absl::Status ParsePools(YamlSection& s, global_scheduler::SchedulerOptions* o) {
  for (const auto& [key, v] : {std::pair<const char*, int*>{"control_threads", &o->control_threads},
                               {"advise_threads", &o->advise_threads}}) {
    RETURN_IF_ERROR(s.Get(key, v));
    if (*v < 1 || *v > 1024) return s.Error(s.Key(key), "must be in [1, 1024]");
  }
  RETURN_IF_ERROR(s.Get("advise_queue", &o->advise_queue));
  if (o->advise_queue < 1 || o->advise_queue > 1000000) {
    return s.Error(s.Key("advise_queue"), "must be in [1, 1000000]");
  }
  return absl::OkStatus();
}

// scheduler.state: where the scheduler's state persists (state_store.h).
absl::Status ParseEtcd(YamlSection& parent, const std::string* file, SchedulerSection::Etcd* e) {
  YAML::Node n = parent.Child("etcd");
  if (!n) return absl::OkStatus();
  YamlSection s(n, "scheduler.state.etcd", file);
  RETURN_IF_ERROR(s.Check());
  RETURN_IF_ERROR(s.Get("endpoints", &e->endpoints));
  RETURN_IF_ERROR(s.Get("prefix", &e->prefix));
  RETURN_IF_ERROR(s.Get("lease_ttl_s", &e->lease_ttl_s));
  RETURN_IF_ERROR(s.Get("timeout_ms", &e->timeout_ms));
  RETURN_IF_ERROR(s.Finish());
  if (e->endpoints.empty()) return s.Error(s.Key("endpoints"), "missing (etcd's client address)");
  if (e->prefix.empty() || e->prefix[0] != '/' || e->prefix.back() == '/') {
    return s.Error(s.Key("prefix"), "expected /name, with no trailing slash");
  }
  if (e->lease_ttl_s < 1) return s.Error(s.Key("lease_ttl_s"), "must be >= 1");
  if (e->timeout_ms < 1) return s.Error(s.Key("timeout_ms"), "must be >= 1");
  return absl::OkStatus();
}

absl::Status ParseState(YamlSection& parent, const std::string* file, SchedulerSection* out) {
  global_scheduler::SchedulerOptions* o = &out->options;
  if (parent.Child("catalogue_file")) {
    return parent.Error(parent.Key("catalogue_file"),
                        "replaced by scheduler.state.path, a SQLite database that keeps the "
                        "Admin API's catalogue changes and the session directory (register the "
                        "models again once after the change)");
  }
  YAML::Node n = parent.Child("state");
  if (!n) return absl::OkStatus();
  YamlSection s(n, "scheduler.state", file);
  RETURN_IF_ERROR(s.Check());
  RETURN_IF_ERROR(s.Get("path", &o->state_path));
  RETURN_IF_ERROR(ParseEtcd(s, file, &out->etcd));
  if (!o->state_path.empty() && !out->etcd.endpoints.empty()) {
    return s.Error(s.Key("etcd"), "set path (SQLite) or etcd, not both");
  }
  std::string sync = "normal";
  RETURN_IF_ERROR(s.Get("sync", &sync));
  if (sync == "normal") {
    o->state.sync = global_scheduler::StateSync::kNormal;
  } else if (sync == "full") {
    o->state.sync = global_scheduler::StateSync::kFull;
  } else {
    return s.Error(s.Key("sync"), absl::StrCat("\"", sync,
                                               "\" (expected normal: survives kill -9, or full: "
                                               "also survives power loss)"));
  }
  int64_t max_mb = 0;
  RETURN_IF_ERROR(s.Get("max_mb", &max_mb));
  if (max_mb < 0 || max_mb > (int64_t{1} << 30)) {
    return s.Error(s.Key("max_mb"), "must be in [0, 2^30] (0: no cap)");
  }
  o->state.max_bytes = max_mb << 20;
  return s.Finish();
}

// scheduler.auth: the API keys file.
absl::Status ParseAuth(YamlSection& s, const std::string* file, SchedulerSection* out) {
  YAML::Node a = s.Child("auth");
  if (!a) return absl::OkStatus();
  YamlSection as(a, "scheduler.auth", file);
  RETURN_IF_ERROR(as.Check());
  RETURN_IF_ERROR(as.Get("keys_file", &out->keys_file));
  return as.Finish();
}

// A duration in ms under `key` that must be > 0.
absl::Status GetPositiveMs(YamlSection& s, const std::string& key, absl::Duration* d) {
  int64_t v = absl::ToInt64Milliseconds(*d);
  RETURN_IF_ERROR(s.Get(key, &v));
  if (v <= 0) return s.Error(s.Key(key), "must be > 0");
  *d = absl::Milliseconds(v);
  return absl::OkStatus();
}

// scheduler's heartbeats, waits and timeouts (the *_ms keys).
absl::Status ParseTimings(YamlSection& s, global_scheduler::SchedulerOptions* o) {
  RETURN_IF_ERROR(GetPositiveMs(s, "heartbeat_timeout_ms", &o->heartbeat_timeout));
  RETURN_IF_ERROR(GetPositiveMs(s, "heartbeat_interval_ms", &o->heartbeat_interval));
  {
    // Nodes re-register at their next heartbeat or registration retry.
    int64_t grace_ms = 2 * absl::ToInt64Milliseconds(o->heartbeat_timeout);
    RETURN_IF_ERROR(s.Get("startup_grace_ms", &grace_ms));
    if (grace_ms < 0) return s.Error(s.Key("startup_grace_ms"), "must be >= 0");
    o->startup_grace = absl::Milliseconds(grace_ms);
  }
  RETURN_IF_ERROR(GetPositiveMs(s, "route_wait_ms", &o->route_wait));
  RETURN_IF_ERROR(GetPositiveMs(s, "load_retry_ms", &o->load_retry));
  RETURN_IF_ERROR(GetPositiveMs(s, "load_timeout_ms", &o->load_timeout));
  RETURN_IF_ERROR(GetPositiveMs(s, "stats_window_ms", &o->stats_window));
  RETURN_IF_ERROR(GetPositiveMs(s, "drain_timeout_ms", &o->drain_timeout));
  RETURN_IF_ERROR(GetPositiveMs(s, "node_connect_wait_ms", &o->node_connect_wait));
  int64_t accept_ms = absl::ToInt64Milliseconds(o->node_accept_timeout);
  RETURN_IF_ERROR(s.Get("node_accept_timeout_ms", &accept_ms));
  if (accept_ms < 0) return s.Error(s.Key("node_accept_timeout_ms"), "must be >= 0 (0: off)");
  o->node_accept_timeout = absl::Milliseconds(accept_ms);
  return absl::OkStatus();
}

// scheduler's idle eviction, KV pressure, rebalancing and step budget.
absl::Status ParseRebalancing(YamlSection& s, global_scheduler::SchedulerOptions* o) {
  int64_t idle_ms = absl::ToInt64Milliseconds(o->idle_evict_after);
  RETURN_IF_ERROR(s.Get("idle_evict_ms", &idle_ms));
  if (idle_ms < 0)
    return s.Error(s.Key("idle_evict_ms"), "must be >= 0 (0 never evicts idle models)");
  o->idle_evict_after = absl::Milliseconds(idle_ms);
  RETURN_IF_ERROR(s.Get("kv_pressure_free_fraction", &o->kv_pressure_free_fraction));
  if (!(o->kv_pressure_free_fraction >= 0 && o->kv_pressure_free_fraction < 1)) {
    return s.Error(s.Key("kv_pressure_free_fraction"),
                   "must be in [0, 1) (0 evicts idle models only for weight room)");
  }
  int64_t rebalance_ms = absl::ToInt64Milliseconds(o->rebalance_interval);
  RETURN_IF_ERROR(s.Get("rebalance_interval_ms", &rebalance_ms));
  if (rebalance_ms < 0)
    return s.Error(s.Key("rebalance_interval_ms"), "must be >= 0 (0 never rebalances)");
  o->rebalance_interval = absl::Milliseconds(rebalance_ms);
  RETURN_IF_ERROR(s.Get("migration_threshold", &o->migration_threshold));
  if (o->migration_threshold < 0) return s.Error(s.Key("migration_threshold"), "must be >= 0");
  RETURN_IF_ERROR(s.Get("step_budget_headroom", &o->step_budget_headroom));
  if (!(o->step_budget_headroom >= 0)) {
    return s.Error(s.Key("step_budget_headroom"), "must be >= 0 (0: KVPR by memory alone)");
  }
  return absl::OkStatus();
}

// scheduler.models[i]: one catalogue entry.
absl::Status ParseModelSpec(const YAML::Node& n, size_t i, const std::string* file,
                            global_scheduler::ModelSpec* spec) {
  YamlSection m(n, absl::StrCat("scheduler.models[", i, "]"), file);
  RETURN_IF_ERROR(m.Check());
  RETURN_IF_ERROR(m.Get("name", &spec->name));
  RETURN_IF_ERROR(m.Get("path", &spec->path));
  RETURN_IF_ERROR(m.Get("kv_dtype", &spec->kv_dtype));
  RETURN_IF_ERROR(GetQuantization(m, &spec->quantization));
  RETURN_IF_ERROR(m.Get("replicas", &spec->replicas));
  int64_t floor_mib = 0, limit_mib = 0;
  RETURN_IF_ERROR(m.Get("kv_floor_mib", &floor_mib));
  RETURN_IF_ERROR(m.Get("kv_limit_mib", &limit_mib));
  RETURN_IF_ERROR(ParseSlo(m, &spec->ttft_ms, &spec->tpot_ms, file));
  RETURN_IF_ERROR(m.Finish());
  if (floor_mib < 0 || limit_mib < 0 || (limit_mib > 0 && floor_mib > limit_mib)) {
    return m.Error(m.Key("kv_floor_mib"),
                   "kv_floor_mib and kv_limit_mib must be >= 0, floor <= limit");
  }
  spec->kv_floor_bytes = floor_mib << 20;
  spec->kv_limit_bytes = limit_mib << 20;
  if (spec->name.empty()) return m.Error(m.Key("name"), "missing");
  if (spec->path.empty()) return m.Error(m.Key("path"), "missing");
  return absl::OkStatus();
}

// scheduler.placement_policy, default SLOs and the models list.
absl::Status ParseCatalogue(YamlSection& s, const std::string* file,
                            global_scheduler::SchedulerOptions* o) {
  RETURN_IF_ERROR(s.Get("placement_policy", &o->placement_policy));
  if (o->placement_policy != "most_free" && o->placement_policy != "kvpr" &&
      o->placement_policy != "mme") {
    return s.Error(s.Key("placement_policy"),
                   absl::StrCat("\"", o->placement_policy, "\" (expected most_free, kvpr or mme)"));
  }
  RETURN_IF_ERROR(ParseSlo(s, &o->default_ttft_ms, &o->default_tpot_ms, file));
  if (YAML::Node models = s.Child("models")) {
    if (!models.IsSequence()) return s.Error(s.Key("models"), "expected a list");
    for (size_t i = 0; i < models.size(); ++i) {
      global_scheduler::ModelSpec spec;
      RETURN_IF_ERROR(ParseModelSpec(models[i], i, file, &spec));
      o->models.push_back(spec);
    }
  }
  return absl::OkStatus();
}

absl::Status ParseScheduler(const YAML::Node& n, const std::string* file, SchedulerSection* out) {
  YamlSection s(n, "scheduler", file);
  RETURN_IF_ERROR(s.Check());
  RETURN_IF_ERROR(s.Get("listen", &out->listen));
  RETURN_IF_ERROR(s.Get("metrics_listen", &out->metrics_listen));
  RETURN_IF_ERROR(s.Get("http_listen", &out->http_listen));
  RETURN_IF_ERROR(ParseTls(s, /*scheduler=*/true, file, &out->tls));
  RETURN_IF_ERROR(s.Get("shutdown_grace_s", &out->shutdown_grace_s));
  if (!(out->shutdown_grace_s >= 0)) return s.Error(s.Key("shutdown_grace_s"), "must be >= 0");
  RETURN_IF_ERROR(ParseAuth(s, file, out));
  auto& o = out->options;
  RETURN_IF_ERROR(ParseState(s, file, out));
  RETURN_IF_ERROR(ParseTimings(s, &o));
  RETURN_IF_ERROR(s.Get("node_channels", &o.node_channels));
  if (o.node_channels < 1 || o.node_channels > 64) {
    return s.Error(s.Key("node_channels"), "must be in [1, 64]");
  }
  RETURN_IF_ERROR(ParsePools(s, &o));
  RETURN_IF_ERROR(ParseRebalancing(s, &o));
  RETURN_IF_ERROR(ParseSessionLimits(s, &o));
  RETURN_IF_ERROR(ParseQuotas(s, file, &o.quotas));
  RETURN_IF_ERROR(ParseCatalogue(s, file, &o));
  RETURN_IF_ERROR(s.Finish());
  RETURN_IF_ERROR(ValidateAddress(out->listen, *file + ": scheduler.listen"));
  if (!out->http_listen.empty()) {
    RETURN_IF_ERROR(ValidateAddress(out->http_listen, *file + ": scheduler.http_listen"));
  }
  if (o.heartbeat_timeout <= o.heartbeat_interval) {
    return s.Error("scheduler.heartbeat_timeout_ms", "must exceed heartbeat_interval_ms");
  }
  return absl::OkStatus();
}

// node.kv_tiers: session KV below the devices (node_manager/kv_tier_store.h).
absl::Status ParseKvTiers(YamlSection& s, const std::string* file, node_manager::NodeOptions* o) {
  YAML::Node n = s.Child("kv_tiers");
  if (!n) return absl::OkStatus();
  YamlSection ts(n, "node.kv_tiers", file);
  RETURN_IF_ERROR(ts.Check());
  auto& t = o->kv_tiers;
  int64_t dram_mib = 0, ssd_gib = 0;
  RETURN_IF_ERROR(ts.Get("dram_mib", &dram_mib));
  RETURN_IF_ERROR(ts.Get("ssd_dir", &t.ssd_dir));
  RETURN_IF_ERROR(ts.Get("ssd_gib", &ssd_gib));
  RETURN_IF_ERROR(ts.Get("chunk_tokens", &t.chunk_tokens));
  RETURN_IF_ERROR(ts.Get("io_threads", &t.io_threads));
  RETURN_IF_ERROR(ts.Get("layerwise_load", &t.layerwise_load));
  RETURN_IF_ERROR(ts.Get("ssd_direct_io", &t.ssd_direct_io));
  RETURN_IF_ERROR(ts.Finish());
  if (dram_mib < 0) return ts.Error("node.kv_tiers.dram_mib", "must be >= 0");
  if (ssd_gib < 0) return ts.Error("node.kv_tiers.ssd_gib", "must be >= 0");
  if (!t.ssd_dir.empty() && ssd_gib == 0) {
    return ts.Error("node.kv_tiers.ssd_gib", "must be > 0 when ssd_dir is set");
  }
  if (t.chunk_tokens <= 0) return ts.Error("node.kv_tiers.chunk_tokens", "must be > 0");
  if (t.io_threads < 0) return ts.Error("node.kv_tiers.io_threads", "must be >= 0 (0: auto)");
  t.dram_bytes = dram_mib << 20;
  t.ssd_bytes = ssd_gib << 30;
  return absl::OkStatus();
}

// node.devices: replaces the default devices when given.
absl::Status ParseDevices(YamlSection& s, const std::string* file, node_manager::NodeOptions* o) {
  YAML::Node devices = s.Child("devices");
  if (!devices) return absl::OkStatus();
  if (!devices.IsSequence() || devices.size() == 0) {
    return s.Error(s.Key("devices"), "expected a non-empty list");
  }
  o->devices.clear();
  for (size_t i = 0; i < devices.size(); ++i) {
    YamlSection d(devices[i], absl::StrCat("node.devices[", i, "]"), file);
    RETURN_IF_ERROR(d.Check());
    node_manager::DeviceOptions dev;
    int64_t mib = dev.memory_bytes >> 20;
    RETURN_IF_ERROR(d.Get("name", &dev.name));
    RETURN_IF_ERROR(d.Get("memory_mib", &mib));
    RETURN_IF_ERROR(d.Finish());
    if (mib <= 0) return d.Error(d.Key("memory_mib"), "must be > 0");
    dev.memory_bytes = mib << 20;
    o->devices.push_back(dev);
  }
  return absl::OkStatus();
}

// node.arbitration: the per-device policy, its queue-wait bound and its log.
absl::Status ParseArbitration(YamlSection& s, const std::string* file,
                              node_manager::NodeOptions* o) {
  YAML::Node a = s.Child("arbitration");
  if (!a) return absl::OkStatus();
  YamlSection as(a, "node.arbitration", file);
  RETURN_IF_ERROR(as.Check());
  RETURN_IF_ERROR(as.Get("policy", &o->arbitration_policy));
  RETURN_IF_ERROR(as.Get("max_queue_wait_ms", &o->max_queue_wait_ms));
  RETURN_IF_ERROR(as.Get("promote_after_slo", &o->promote_after_slo));
  RETURN_IF_ERROR(as.Get("log_decisions", &o->log_arbitration));
  RETURN_IF_ERROR(as.Finish());
  if (!(o->max_queue_wait_ms >= 0)) {
    return as.Error("node.arbitration.max_queue_wait_ms", "must be >= 0 (0 = no bound)");
  }
  if (!(o->promote_after_slo >= 0)) {
    return as.Error("node.arbitration.promote_after_slo", "must be >= 0 (0 = no aging)");
  }
  if (auto p = node_manager::ParseArbitrationPolicy(o->arbitration_policy); !p.ok()) {
    return as.Error("node.arbitration.policy", std::string(p.status().message()));
  }
  return absl::OkStatus();
}

absl::Status ParseNode(const YAML::Node& n, const std::string* file, NodeSection* out) {
  YamlSection s(n, "node", file);
  RETURN_IF_ERROR(s.Check());
  auto& o = out->options;
  RETURN_IF_ERROR(s.Get("node_id", &o.node_id));
  RETURN_IF_ERROR(s.Get("listen", &out->listen));
  RETURN_IF_ERROR(s.Get("advertise", &o.advertise_address));
  RETURN_IF_ERROR(ParseTls(s, /*scheduler=*/false, file, &out->tls));
  RETURN_IF_ERROR(s.Get("shutdown_grace_s", &out->shutdown_grace_s));
  if (!(out->shutdown_grace_s >= 0)) return s.Error(s.Key("shutdown_grace_s"), "must be >= 0");
  RETURN_IF_ERROR(s.Get("scheduler", &o.scheduler_address));
  RETURN_IF_ERROR(s.Get("metrics_listen", &out->metrics_listen));
  RETURN_IF_ERROR(s.Get("stream_threads", &out->stream_threads));
  if (out->stream_threads < 1 || out->stream_threads > 64) {
    return s.Error(s.Key("stream_threads"), "must be between 1 and 64");
  }
  RETURN_IF_ERROR(ParseDevices(s, file, &o));
  if (YAML::Node m = s.Child("memory")) RETURN_IF_ERROR(ParseNodeMemory(m, file, &o));
  RETURN_IF_ERROR(ParseKvTiers(s, file, &o));
  RETURN_IF_ERROR(ParseArbitration(s, file, &o));
  if (YAML::Node e = s.Child("engine")) RETURN_IF_ERROR(ParseNodeEngine(e, file, &o));
  RETURN_IF_ERROR(s.Finish());
  RETURN_IF_ERROR(ValidateAddress(out->listen, *file + ": node.listen"));
  return absl::OkStatus();
}

absl::Status ParseServe(const YAML::Node& n, const std::string* file, ServeSection* out) {
  YamlSection s(n, "serve", file);
  RETURN_IF_ERROR(s.Check());
  RETURN_IF_ERROR(s.Get("cache_dir", &out->cache_dir));
  if (YAML::Node models = s.Child("models")) {
    if (!models.IsSequence()) return s.Error(s.Key("models"), "expected a list");
    for (size_t i = 0; i < models.size(); ++i) {
      YamlSection m(models[i], absl::StrCat("serve.models[", i, "]"), file);
      RETURN_IF_ERROR(m.Check());
      SyntheticModelEntry e;
      auto& sp = e.spec;
      RETURN_IF_ERROR(m.Get("name", &e.name));
      RETURN_IF_ERROR(m.Get("architecture", &sp.architecture));
      RETURN_IF_ERROR(m.Get("layers", &sp.layers));
      RETURN_IF_ERROR(m.Get("hidden", &sp.hidden));
      RETURN_IF_ERROR(m.Get("heads", &sp.heads));
      RETURN_IF_ERROR(m.Get("kv_heads", &sp.kv_heads));
      RETURN_IF_ERROR(m.Get("intermediate", &sp.intermediate));
      RETURN_IF_ERROR(m.Get("vocab", &sp.vocab));
      RETURN_IF_ERROR(m.Get("max_position", &sp.max_position));
      RETURN_IF_ERROR(m.Get("dtype", &sp.dtype));
      RETURN_IF_ERROR(m.Get("seed", &sp.seed));
      RETURN_IF_ERROR(m.Get("tie_embeddings", &sp.tie_embeddings));
      RETURN_IF_ERROR(m.Get("init_std", &sp.init_std));
      RETURN_IF_ERROR(m.Get("kv_dtype", &e.kv_dtype));
      RETURN_IF_ERROR(GetQuantization(m, &e.quantization));
      RETURN_IF_ERROR(m.Get("replicas", &e.replicas));
      RETURN_IF_ERROR(m.Get("tokenizer", &e.tokenizer));
      RETURN_IF_ERROR(m.Finish());
      if (e.name.empty()) return m.Error(m.Key("name"), "missing");
      if (!(sp.init_std > 0)) return m.Error(m.Key("init_std"), "must be > 0");
      if (auto c = engine::SyntheticConfig(sp); !c.ok()) {
        return m.Error(m.Key("architecture"), std::string(c.status().message()));
      }
      out->models.push_back(e);
    }
  }
  return s.Finish();
}

}  // namespace

absl::Status ValidateAddress(const std::string& value, const std::string& what) {
  const auto colon = value.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == value.size()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": \"", value, "\" is not host:port"));
  }
  for (size_t i = colon + 1; i < value.size(); ++i) {
    if (!isdigit(static_cast<unsigned char>(value[i]))) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": \"", value, "\" has a bad port"));
    }
  }
  return absl::OkStatus();
}

namespace {

absl::StatusOr<Config> ParseRoot(const YAML::Node& root, const std::string& source) {
  Config c;
  c.source = source;
  if (!root || root.IsNull()) return c;
  YamlSection s(root, "", &c.source);
  RETURN_IF_ERROR(s.Check());
  RETURN_IF_ERROR(s.Get("log_level", &c.log_level));
  RETURN_IF_ERROR(s.Get("log_format", &c.log_format));
  if (YAML::Node n = s.Child("scheduler")) {
    c.has_scheduler = true;
    RETURN_IF_ERROR(ParseScheduler(n, &c.source, &c.scheduler));
  }
  if (YAML::Node n = s.Child("node")) {
    c.has_node = true;
    RETURN_IF_ERROR(ParseNode(n, &c.source, &c.node));
  }
  if (YAML::Node n = s.Child("serve")) {
    c.has_serve = true;
    RETURN_IF_ERROR(ParseServe(n, &c.source, &c.serve));
  }
  RETURN_IF_ERROR(s.Finish());
  static const std::set<std::string> kLevels = {"trace", "debug", "info", "warn", "error", "off"};
  if (!kLevels.count(c.log_level)) {
    return s.Error("log_level", "expected trace, debug, info, warn, error or off");
  }
  if (c.log_format != "text" && c.log_format != "json") {
    return s.Error("log_format", "expected text or json");
  }
  return c;
}

}  // namespace

absl::StatusOr<Config> ParseConfig(const std::string& text, const std::string& source) {
  // yaml-cpp throws on malformed input and on a node read as the wrong
  // kind; the sections check kinds first, and whatever slips past them is
  // still a clear error, not a crash (found by fuzz/config_fuzzer).
  try {
    return ParseRoot(YAML::Load(text), source);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": invalid YAML: ", e.what()));
  }
}

absl::StatusOr<Config> LoadConfig(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open config file ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ParseConfig(ss.str(), path);
}

}  // namespace ballast::server
