// YAML config parsing: shipped files parse, unknown keys and bad values are
// rejected naming the file and the key.
#include "server/config.h"

#include "absl/strings/str_cat.h"
#include "engine/gpu_backend.h"
#include "gtest/gtest.h"

namespace ballast::server {
namespace {

std::string Msg(const std::string& yaml) {
  auto c = ParseConfig(yaml, "test.yaml");
  EXPECT_FALSE(c.ok()) << yaml;
  return c.ok() ? "" : std::string(c.status().message());
}

TEST(Config, ShippedConfigsParse) {
  // gpu.yaml needs a CUDA build (Config.CudaBackendIsAcceptedOnlyWhereBuilt).
  for (const char* f : {"ballast.yaml", "scheduler.yaml", "node.yaml", "real-model.yaml"}) {
    auto c = LoadConfig(std::string(BALLAST_SOURCE_DIR) + "/configs/" + f);
    EXPECT_TRUE(c.ok()) << f << ": " << c.status();
  }
  auto c = LoadConfig(std::string(BALLAST_SOURCE_DIR) + "/configs/ballast.yaml");
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->has_scheduler && c->has_node && c->has_serve);
  EXPECT_EQ(c->serve.models.size(), 3u);
  EXPECT_EQ(c->node.options.engine.kv_cache_bytes, 32ll << 20);
  EXPECT_EQ(c->scheduler.options.heartbeat_timeout, absl::Seconds(3));
}

TEST(Config, OverloadAndSlowStepKnobsParseAndBadValuesNameTheirKey) {
  auto c = ParseConfig(
      "node: {arbitration: {policy: edf, max_queue_wait_ms: 1500, log_decisions: true, "
      "promote_after_slo: 4}, "
      "engine: {slow_step_warn_ms: 50, overlap_steps: false, deterministic: true, "
      "priority_streams: decode, rolling_steps: false, ahead_steps: false, "
      "step_done: host_function, gemm_tune_candidates: 8, warm_products: false}}",
      "t.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->node.options.overlap_steps);
  EXPECT_EQ(c->node.options.engine.gemm_tune_candidates, 8);
  EXPECT_FALSE(c->node.options.engine.warm_products);
  EXPECT_EQ(c->node.options.priority_streams, node_manager::StreamPriorityPolicy::kDecode);
  EXPECT_FALSE(c->node.options.rolling_steps);
  EXPECT_FALSE(c->node.options.ahead_steps);
  EXPECT_EQ(c->node.options.engine.step_done, engine::StepDoneSignal::kHostFunction);
  EXPECT_EQ(ParseConfig("node: {}", "t.yaml")->node.options.engine.step_done,
            engine::StepDoneSignal::kSpinningThread);  // the default
  EXPECT_EQ(
      ParseConfig("node: {engine: {step_done: thread}}", "t.yaml")->node.options.engine.step_done,
      engine::StepDoneSignal::kThread);
  EXPECT_EQ(
      ParseConfig("node: {engine: {step_done: poll}}", "t.yaml")->node.options.engine.step_done,
      engine::StepDoneSignal::kWorkerPoll);
  const auto bad_done = ParseConfig("node: {engine: {step_done: callback}}", "t.yaml");
  ASSERT_FALSE(bad_done.ok());
  EXPECT_NE(bad_done.status().message().find("node.engine.step_done"), std::string::npos)
      << bad_done.status();
  EXPECT_NE(bad_done.status().message().find("\"callback\" is unknown"), std::string::npos)
      << bad_done.status();
  EXPECT_TRUE(ParseConfig("node: {}", "t.yaml")->node.options.rolling_steps);         // the default
  EXPECT_TRUE(ParseConfig("node: {}", "t.yaml")->node.options.ahead_steps);           // the default
  EXPECT_TRUE(ParseConfig("node: {}", "t.yaml")->node.options.engine.warm_products);  // the default
  EXPECT_EQ(ParseConfig("node: {}", "t.yaml")->node.options.priority_streams,
            node_manager::StreamPriorityPolicy::kNone);  // the default
  const auto bad_prio = ParseConfig("node: {engine: {priority_streams: true}}", "t.yaml");
  ASSERT_FALSE(bad_prio.ok());
  EXPECT_NE(bad_prio.status().message().find("node.engine.priority_streams"), std::string::npos)
      << bad_prio.status();
  EXPECT_NE(bad_prio.status().message().find("expected none, first or decode"), std::string::npos)
      << bad_prio.status();
  EXPECT_TRUE(c->node.options.engine.deterministic);
  EXPECT_FALSE(ParseConfig("node: {}", "t.yaml")->node.options.engine.deterministic);
  EXPECT_EQ(ParseConfig("node: {}", "t.yaml")->node.options.engine.sm_reserve, 0);  // off
  const auto cpu_reserve =
      ParseConfig("node: {engine: {sm_reserve: 64, sm_reserve_models: [chat]}}", "t.yaml");
  ASSERT_FALSE(cpu_reserve.ok());  // the default backend is cpu
  EXPECT_NE(cpu_reserve.status().message().find("node.engine.sm_reserve: needs backend cuda"),
            std::string::npos)
      << cpu_reserve.status();
  const auto unreserved = ParseConfig("node: {engine: {sm_reserve_models: [chat]}}", "t.yaml");
  ASSERT_FALSE(unreserved.ok());
  EXPECT_NE(unreserved.status().message().find("node.engine.sm_reserve_models: set, but"),
            std::string::npos)
      << unreserved.status();
  const auto negative = ParseConfig("node: {engine: {sm_reserve: -1}}", "t.yaml");
  ASSERT_FALSE(negative.ok());
  EXPECT_NE(negative.status().message().find("node.engine.sm_reserve: must be >= 0"),
            std::string::npos)
      << negative.status();
  EXPECT_TRUE(ParseConfig("node: {}", "t.yaml")->node.options.overlap_steps);  // the default
  EXPECT_EQ(ParseConfig("node: {stream_threads: 6}", "t.yaml")->node.stream_threads, 6);
  EXPECT_EQ(ParseConfig("node: {}", "t.yaml")->node.stream_threads, 2);
  EXPECT_EQ(ParseConfig("scheduler: {node_channels: 4}", "t.yaml")->scheduler.options.node_channels,
            4);
  EXPECT_EQ(ParseConfig("scheduler: {}", "t.yaml")->scheduler.options.node_channels, 1);
  auto bad_channels = ParseConfig("scheduler: {node_channels: 0}", "t.yaml");
  ASSERT_FALSE(bad_channels.ok());
  EXPECT_NE(bad_channels.status().message().find("scheduler.node_channels"), std::string::npos)
      << bad_channels.status();
  auto bad = ParseConfig("node: {stream_threads: 0}", "t.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("node.stream_threads"), std::string::npos) << bad.status();
  EXPECT_EQ(c->node.options.max_queue_wait_ms, 1500);
  EXPECT_EQ(c->node.options.promote_after_slo, 4);
  EXPECT_NE(Msg("node: {arbitration: {promote_after_slo: -1}}")
                .find("node.arbitration.promote_after_slo"),
            std::string::npos);
  EXPECT_TRUE(c->node.options.log_arbitration);
  EXPECT_NE(
      Msg("node: {arbitration: {log_decisions: often}}").find("node.arbitration.log_decisions"),
      std::string::npos);
  EXPECT_EQ(c->node.options.engine.slow_step_warn_ms, 50);
  EXPECT_NE(Msg("node: {arbitration: {max_queue_wait_ms: -1}}")
                .find("node.arbitration.max_queue_wait_ms"),
            std::string::npos);
  EXPECT_NE(Msg("node: {engine: {slow_step_warn_ms: -5}}").find("node.engine.slow_step_warn_ms"),
            std::string::npos);
  EXPECT_NE(
      Msg("node: {engine: {gemm_tune_candidates: 65}}").find("node.engine.gemm_tune_candidates"),
      std::string::npos);
}

TEST(Config, TlsBlocksParseAndBadValuesNameTheirKey) {
  auto c = ParseConfig(
      "scheduler: {tls: {cert_file: s.pem, key_file: s.key, ca_file: ca.pem, "
      "require_client_cert: true, reload_interval_s: 5}}\n"
      "node: {tls: {cert_file: n.pem, key_file: n.key, ca_file: ca.pem}}",
      "t.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->scheduler.tls.cert_file, "s.pem");
  EXPECT_TRUE(c->scheduler.tls.require_client_cert);
  EXPECT_EQ(c->scheduler.tls.reload_interval_s, 5);
  EXPECT_TRUE(c->node.tls.enabled());
  EXPECT_EQ(c->node.tls.ca_file, "ca.pem");
  EXPECT_FALSE(ParseConfig("node: {}", "t.yaml")->node.tls.enabled());  // the default
  // A node always requires client certificates: the key is the scheduler's.
  EXPECT_NE(Msg("node: {tls: {require_client_cert: true}}").find("node.tls.require_client_cert"),
            std::string::npos);
  EXPECT_NE(Msg("scheduler: {tls: {reload_interval_s: 0}}").find("scheduler.tls.reload_interval_s"),
            std::string::npos);
  EXPECT_NE(Msg("scheduler: {tls: {insecure: maybe}}").find("scheduler.tls.insecure"),
            std::string::npos);
  auto q = ParseConfig(
      "scheduler: {quotas: {requests_per_s: 5, max_prompt_bytes: 100, "
      "tenants: {acme: {requests_per_s: 50}}}}",
      "t.yaml");
  ASSERT_TRUE(q.ok()) << q.status();
  const auto& quotas = q->scheduler.options.quotas;
  EXPECT_EQ(quotas.defaults.requests_per_s, 5);
  EXPECT_EQ(quotas.tenants.at("acme").requests_per_s, 50);
  EXPECT_EQ(quotas.tenants.at("acme").max_prompt_bytes, 100);  // inherited from the defaults
  EXPECT_NE(Msg("scheduler: {quotas: {tenants: {acme: {requests_per_s: -1}}}}")
                .find("scheduler.quotas.tenants.acme.requests_per_s"),
            std::string::npos);
  EXPECT_NE(Msg("scheduler: {quotas: {request_per_s: 1}}").find("scheduler.quotas.request_per_s"),
            std::string::npos);
  EXPECT_NE(
      Msg("scheduler: {quotas: {advisory_burst: 0.5}}").find("scheduler.quotas.advisory_burst"),
      std::string::npos);
  EXPECT_EQ(ParseConfig("scheduler: {auth: {keys_file: /k.yaml}}", "t.yaml")->scheduler.keys_file,
            "/k.yaml");
  EXPECT_NE(Msg("scheduler: {auth: {key_file: /k.yaml}}").find("scheduler.auth.key_file"),
            std::string::npos);
}

TEST(Config, KvTiersParseAndBadValuesNameTheirKey) {
  auto c = ParseConfig(
      "node: {kv_tiers: {dram_mib: 64, ssd_dir: /tmp/kv, ssd_gib: 2, chunk_tokens: 32, "
      "io_threads: 4, ssd_direct_io: false, layerwise_load: false}}",
      "t.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  const auto& t = c->node.options.kv_tiers;
  EXPECT_EQ(t.dram_bytes, 64ll << 20);
  EXPECT_EQ(t.ssd_dir, "/tmp/kv");
  EXPECT_EQ(t.ssd_bytes, 2ll << 30);
  EXPECT_EQ(t.chunk_tokens, 32);
  EXPECT_EQ(t.io_threads, 4);
  EXPECT_FALSE(t.ssd_direct_io);
  EXPECT_FALSE(t.layerwise_load);
  EXPECT_TRUE(c->node.options.kv_tiers_enabled());
  EXPECT_NE(
      Msg("node: {kv_tiers: {layerwise_load: sometimes}}").find("node.kv_tiers.layerwise_load"),
      std::string::npos);
  EXPECT_NE(Msg("node: {kv_tiers: {ssd_dir: /tmp/kv}}").find("node.kv_tiers.ssd_gib"),
            std::string::npos);
  EXPECT_NE(Msg("node: {kv_tiers: {dram_mib: -1}}").find("node.kv_tiers.dram_mib"),
            std::string::npos);
  EXPECT_NE(Msg("node: {kv_tiers: {chunk_tokens: 0}}").find("node.kv_tiers.chunk_tokens"),
            std::string::npos);
  EXPECT_NE(Msg("node: {kv_tiers: {dram_gib: 1}}").find("unknown key"), std::string::npos);
}

TEST(Config, UnknownKeysAreNamed) {
  EXPECT_EQ(Msg("schedulr: {}"), "test.yaml: schedulr: unknown key");
  EXPECT_EQ(Msg("node: {engine: {kv_cache_mb: 3}}"),
            "test.yaml: node.engine.kv_cache_mb: unknown key");
  EXPECT_EQ(Msg("scheduler: {models: [{name: a, path: /p, replica: 2}]}"),
            "test.yaml: scheduler.models[0].replica: unknown key");
}

TEST(Config, CudaBackendIsAcceptedOnlyWhereBuilt) {
  auto c = ParseConfig(
      "node: {devices: [{name: 'cuda:0', memory_mib: 1024}], "
      "engine: {backend: cuda, cuda_graphs: false}}",
      "test.yaml");
  if (engine::GpuBackendBuilt()) {
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->node.options.engine.backend, "cuda");
    EXPECT_FALSE(c->node.options.engine.cuda_graphs);
  } else {
    ASSERT_FALSE(c.ok());
    EXPECT_NE(c.status().message().find("built without CUDA"), std::string::npos);
  }
}

TEST(Config, BadValuesAreNamed) {
  EXPECT_NE(Msg("scheduler: {heartbeat_timeout_ms: soon}").find("scheduler.heartbeat_timeout_ms"),
            std::string::npos);
  EXPECT_NE(
      Msg("node: {devices: [{name: cpu:0, memory_mib: 0}]}").find("node.devices[0].memory_mib"),
      std::string::npos);
  EXPECT_NE(Msg("node: {engine: {backend: tpu}}").find("node.engine.backend"), std::string::npos);
  EXPECT_NE(Msg("node: {listen: nowhere}").find("node.listen"), std::string::npos);
  EXPECT_NE(Msg("scheduler: {heartbeat_timeout_ms: 100, heartbeat_interval_ms: 500}")
                .find("heartbeat_timeout_ms"),
            std::string::npos);
  EXPECT_NE(Msg("serve: {models: [{name: x, architecture: gpt2}]}").find("serve.models[0]"),
            std::string::npos);
  EXPECT_NE(Msg("log_level: loud").find("log_level"), std::string::npos);
  EXPECT_NE(Msg("scheduler: {placement_policy: random}").find("scheduler.placement_policy"),
            std::string::npos);
  EXPECT_NE(Msg("node: {memory: {mode: balloon}}").find("node.memory.mode"), std::string::npos);
  EXPECT_NE(Msg("node: {memory: {slab_mib: 3}}").find("node.memory.slab_mib"), std::string::npos);
  EXPECT_NE(
      Msg("node: {memory: {remap: {max_fraction: 1}}}").find("node.memory.remap.max_fraction"),
      std::string::npos);
  EXPECT_NE(Msg("node: {memory: {remap: {enabled: maybe}}}").find("node.memory.remap.enabled"),
            std::string::npos);
  EXPECT_NE(Msg("node: {memory: {remap: {alpha: 3}}}").find("node.memory.remap.alpha: unknown key"),
            std::string::npos);
  EXPECT_NE(Msg("node: {memory: {remap: {revert_after_ms: -1}}}")
                .find("node.memory.remap.revert_after_ms"),
            std::string::npos);
  EXPECT_NE(Msg("node: {memory: {remap: {layer_transfer_ms: -2}}}")
                .find("node.memory.remap.layer_transfer_ms"),
            std::string::npos);
  {
    auto c = ParseConfig(
        "node: {memory: {remap: {enabled: true, max_fraction: 0.25, revert_after_ms: 200, "
        "layer_transfer_ms: 8.5}}}",
        "t.yaml");
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_TRUE(c->node.options.remap.enabled);
    EXPECT_DOUBLE_EQ(c->node.options.remap.max_fraction, 0.25);
    EXPECT_EQ(c->node.options.remap.revert_after, absl::Milliseconds(200));
    EXPECT_EQ(c->node.options.remap.layer_transfer, absl::Microseconds(8500));
    auto d = ParseConfig("node: {}", "t.yaml");
    EXPECT_FALSE(d->node.options.remap.enabled);
    EXPECT_EQ(d->node.options.remap.layer_transfer, absl::ZeroDuration());  // measured
  }
  EXPECT_NE(Msg("scheduler: [1, 2]").find("scheduler: expected a mapping"), std::string::npos);
  EXPECT_NE(Msg("a: [").find("invalid YAML"), std::string::npos);
  EXPECT_NE(
      Msg("scheduler: {kv_pressure_free_fraction: 1}").find("scheduler.kv_pressure_free_fraction"),
      std::string::npos);
  EXPECT_NE(Msg("scheduler: {kv_pressure_free_fraction: -0.1}")
                .find("scheduler.kv_pressure_free_fraction"),
            std::string::npos);
  EXPECT_NE(Msg("scheduler: {step_budget_headroom: -1}").find("scheduler.step_budget_headroom"),
            std::string::npos);
  EXPECT_DOUBLE_EQ(ParseConfig("scheduler: {step_budget_headroom: 0.8}", "t.yaml")
                       ->scheduler.options.step_budget_headroom,
                   0.8);
  EXPECT_DOUBLE_EQ(ParseConfig("scheduler: {kv_pressure_free_fraction: 0.2}", "t.yaml")
                       ->scheduler.options.kv_pressure_free_fraction,
                   0.2);
  EXPECT_DOUBLE_EQ(
      ParseConfig("scheduler: {}", "t.yaml")->scheduler.options.kv_pressure_free_fraction, 0.05);
  // A key that is not a plain name is an error, not a yaml-cpp exception
  // (fuzz/config_fuzzer).
  EXPECT_NE(Msg("? [a, b]\n: 1\n").find("(top level): keys must be plain names"),
            std::string::npos);
  EXPECT_NE(Msg("scheduler: {? {x: 1} : 2}").find("scheduler: keys must be plain names"),
            std::string::npos);
  EXPECT_NE(
      Msg("scheduler: {quotas: {tenants: {? [t] : {}}}}").find("tenant names must be strings"),
      std::string::npos);
}

// A model's quantization, in both model lists: "none" by default, "fp8"
// (its alias fp8_e4m3 kept as fp8), anything else refused naming the key.
TEST(Config, ModelQuantizationParsesAndBadValuesNameTheirKey) {
  auto c = ParseConfig(
      "scheduler: {models: [{name: a, path: /a, kv_dtype: fp8_e4m3, quantization: fp8}, "
      "{name: b, path: /b}, {name: c, path: /c, quantization: fp8_e4m3}]}\n"
      "serve: {models: [{name: s, kv_dtype: bf16, quantization: fp8}, {name: t}]}",
      "t.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  const auto& m = c->scheduler.options.models;
  ASSERT_EQ(m.size(), 3u);
  EXPECT_EQ(m[0].kv_dtype, "fp8_e4m3");
  EXPECT_EQ(m[0].quantization, "fp8");
  EXPECT_EQ(m[1].quantization, "none");
  EXPECT_EQ(m[2].quantization, "fp8");
  ASSERT_EQ(c->serve.models.size(), 2u);
  EXPECT_EQ(c->serve.models[0].quantization, "fp8");
  EXPECT_EQ(c->serve.models[1].quantization, "none");
  EXPECT_EQ(Msg("scheduler: {models: [{name: a, path: /a, quantization: int4}]}"),
            "test.yaml: scheduler.models[0].quantization: quantization \"int4\" is unknown "
            "(expected none or fp8)");
  EXPECT_NE(Msg("serve: {models: [{name: t}, {name: s, quantization: fp4}]}")
                .find("test.yaml: serve.models[1].quantization: quantization \"fp4\" is unknown"),
            std::string::npos);
  EXPECT_NE(Msg("scheduler: {models: [{name: a, path: /a, quantization: [fp8]}]}")
                .find("scheduler.models[0].quantization: wrong type"),
            std::string::npos);
}

TEST(Config, SessionLimits) {
  auto c = ParseConfig("scheduler: {session_ttl_ms: 60000, max_sessions: 7}", "test.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->scheduler.options.session_ttl, absl::Minutes(1));
  EXPECT_EQ(c->scheduler.options.max_sessions, 7);
  auto d = ParseConfig("scheduler: {}", "test.yaml");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->scheduler.options.session_ttl, absl::Minutes(30));
  EXPECT_EQ(d->scheduler.options.max_sessions, 100000);
  EXPECT_NE(Msg("scheduler: {session_ttl_ms: -1}").find("test.yaml: scheduler.session_ttl_ms"),
            std::string::npos);
  EXPECT_NE(Msg("scheduler: {max_sessions: 0}").find("test.yaml: scheduler.max_sessions"),
            std::string::npos);
}

TEST(Config, AdvisePoolBounds) {
  auto c = ParseConfig("scheduler: {advise_threads: 2, advise_queue: 16, control_threads: 3}",
                       "test.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->scheduler.options.advise_threads, 2);
  EXPECT_EQ(c->scheduler.options.advise_queue, 16);
  EXPECT_EQ(c->scheduler.options.control_threads, 3);
  auto d = ParseConfig("scheduler: {}", "test.yaml");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->scheduler.options.advise_threads, 4);
  EXPECT_EQ(d->scheduler.options.advise_queue, 256);
  for (const char* bad : {"advise_threads: 0", "advise_queue: 0", "control_threads: 2000"}) {
    const std::string key = std::string(bad).substr(0, std::string(bad).find(':'));
    EXPECT_NE(Msg(absl::StrCat("scheduler: {", bad, "}")).find("test.yaml: scheduler." + key),
              std::string::npos)
        << bad;
  }
}

TEST(Config, NodeFailureBounds) {
  auto c = ParseConfig("scheduler: {node_connect_wait_ms: 1500, node_accept_timeout_ms: 0}",
                       "test.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->scheduler.options.node_connect_wait, absl::Milliseconds(1500));
  EXPECT_EQ(c->scheduler.options.node_accept_timeout, absl::ZeroDuration());  // off
  auto d = ParseConfig("scheduler: {}", "test.yaml");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->scheduler.options.state_path, "");  // not persisted
  auto e = ParseConfig(
      "scheduler: {state: {path: /var/lib/ballast/state.db, sync: full, max_mb: 64}}", "test.yaml");
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->scheduler.options.state_path, "/var/lib/ballast/state.db");
  EXPECT_EQ(e->scheduler.options.state.sync, global_scheduler::StateSync::kFull);
  EXPECT_EQ(e->scheduler.options.state.max_bytes, int64_t{64} << 20);
  EXPECT_EQ(d->scheduler.options.state.sync, global_scheduler::StateSync::kNormal);
  EXPECT_NE(Msg("scheduler: {state: {sync: sometimes}}").find("test.yaml: scheduler.state.sync"),
            std::string::npos);
  EXPECT_NE(Msg("scheduler: {state: {max_mb: -1}}").find("test.yaml: scheduler.state.max_mb"),
            std::string::npos);
  EXPECT_NE(Msg("scheduler: {state: {file: x}}").find("test.yaml: scheduler.state.file: unknown"),
            std::string::npos);
  // etcd instead of SQLite: every field, and the errors naming the key.
  auto h = ParseConfig(
      "scheduler: {state: {etcd: {endpoints: \"ipv4:10.0.0.5:2379,10.0.0.6:2379\", prefix: /prod, "
      "lease_ttl_s: 3, timeout_ms: 800}}}",
      "test.yaml");
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->scheduler.etcd.endpoints, "ipv4:10.0.0.5:2379,10.0.0.6:2379");
  EXPECT_EQ(h->scheduler.etcd.prefix, "/prod");
  EXPECT_EQ(h->scheduler.etcd.lease_ttl_s, 3);
  EXPECT_EQ(h->scheduler.etcd.timeout_ms, 800);
  EXPECT_TRUE(d->scheduler.etcd.endpoints.empty());
  EXPECT_NE(Msg("scheduler: {state: {path: /x.db, etcd: {endpoints: a:1}}}")
                .find("test.yaml: scheduler.state.etcd: set path (SQLite) or etcd, not both"),
            std::string::npos);
  EXPECT_NE(Msg("scheduler: {state: {etcd: {prefix: /p}}}")
                .find("test.yaml: scheduler.state.etcd.endpoints: missing"),
            std::string::npos);
  EXPECT_NE(Msg("scheduler: {state: {etcd: {endpoints: a:1, prefix: p/}}}")
                .find("test.yaml: scheduler.state.etcd.prefix: expected /name"),
            std::string::npos);
  EXPECT_NE(Msg("scheduler: {state: {etcd: {endpoints: a:1, lease_ttl_s: 0}}}")
                .find("test.yaml: scheduler.state.etcd.lease_ttl_s: must be >= 1"),
            std::string::npos);
  EXPECT_NE(Msg("scheduler: {state: {etcd: {endpoints: a:1, ttl: 3}}}")
                .find("test.yaml: scheduler.state.etcd.ttl: unknown"),
            std::string::npos);
  // The old key says what replaced it.
  EXPECT_NE(Msg("scheduler: {catalogue_file: /var/lib/ballast/catalogue.json}")
                .find("scheduler.catalogue_file: replaced by scheduler.state.path"),
            std::string::npos);
  EXPECT_EQ(d->scheduler.options.node_connect_wait, absl::Seconds(3));
  EXPECT_EQ(d->scheduler.options.startup_grace, absl::Seconds(6));  // 2 x the heartbeat timeout
  auto g = ParseConfig("scheduler: {heartbeat_timeout_ms: 5000, startup_grace_ms: 0}", "test.yaml");
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->scheduler.options.startup_grace, absl::ZeroDuration());
  EXPECT_EQ(d->scheduler.options.node_accept_timeout, absl::Milliseconds(400));
  EXPECT_NE(Msg("scheduler: {node_connect_wait_ms: 0}")
                .find("test.yaml: scheduler.node_connect_wait_ms: must be > 0"),
            std::string::npos);
  EXPECT_NE(Msg("scheduler: {node_accept_timeout_ms: -5}")
                .find("test.yaml: scheduler.node_accept_timeout_ms"),
            std::string::npos);
}

TEST(Config, MissingFileIsNamed) {
  auto c = LoadConfig("/nonexistent/ballast.yaml");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("/nonexistent/ballast.yaml"), std::string::npos);
}

}  // namespace
}  // namespace ballast::server
