// Ballast's YAML configuration, parsed once at start into plain structs.
//
// One file may hold any of the sections `scheduler`, `node` and `serve`
// (plus `log_level`); each subcommand requires the sections it runs.
// Unknown keys are errors naming the file and the key path (for example
// "configs/node.yaml: node.engine.kv_cache_mb: unknown key"), as are values
// of the wrong type. Nothing below server/ reads YAML.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/synthetic_model.h"
#include "global_scheduler/scheduler.h"
#include "node_manager/node_manager.h"
#include "server/tls.h"

namespace ballast::server {

struct SchedulerSection {
  std::string listen = "127.0.0.1:50051";
  // Prometheus /metrics; empty disables it.
  std::string metrics_listen = "127.0.0.1:9400";
  // OpenAI-compatible HTTP/SSE gateway (server/gateway/); empty disables it.
  std::string http_listen;
  // TLS on the public port and mTLS to the nodes (server/tls.h).
  TlsSettings tls;
  // SIGTERM: readiness goes NOT_SERVING, new calls are refused and the
  // streams in flight get this long to finish (default 30 s).
  double shutdown_grace_s = 30;
  // scheduler.auth.keys_file: API keys, tenants and roles (server/auth.h).
  // Empty (the default): no authentication.
  std::string keys_file;
  // scheduler.state.etcd: the state in etcd, with leader election between
  // the schedulers that share it (global_scheduler/etcd_client.h). Empty
  // endpoints (the default): SQLite at scheduler.state.path, or nothing.
  struct Etcd {
    std::string endpoints;  // a gRPC target: "10.0.0.5:2379" or "ipv4:a:2379,b:2379"
    std::string prefix = "/ballast";
    int lease_ttl_s = 5;    // a dead leader is replaced within about this
    int timeout_ms = 5000;  // each etcd call's deadline
  } etcd;
  global_scheduler::SchedulerOptions options;
};

struct NodeSection {
  std::string listen = "127.0.0.1:50061";
  std::string metrics_listen = "127.0.0.1:9401";
  // Threads that build and write the Generate streams' messages, off the
  // engines' step threads (server/delivery_queue.h), whatever the number of
  // streams. Default 2 (2, 4 and 8 measured the same on an H200 with six
  // models: docs/benchmarks.md).
  int stream_threads = 2;
  // mTLS on the Node port and to the scheduler and peers (server/tls.h).
  TlsSettings tls;
  // SIGTERM: the node takes no new calls (the scheduler retries them on
  // other replicas) and lets its streams finish for this long (default 30 s).
  double shutdown_grace_s = 30;
  node_manager::NodeOptions options;  // advertise defaults to listen
};

struct SyntheticModelEntry {
  std::string name;
  engine::SyntheticModelSpec spec;
  std::string kv_dtype = "auto";
  // Linear-layer weights: "none" or "fp8" (engine::WeightQuant).
  std::string quantization = "none";
  int replicas = 1;
  // A Hugging Face tokenizer directory (tokenizer.json and
  // tokenizer_config.json; "~" expands) the model is served with: its chat
  // template, special tokens and EOS; the vocabulary grows to fit it.
  // Empty: the byte tokenizer.
  std::string tokenizer;
};

struct ServeSection {
  // Where generated models are cached; "~" expands to $HOME.
  std::string cache_dir = "~/.cache/ballast/models";
  std::vector<SyntheticModelEntry> models;
};

struct Config {
  std::string source;  // file the config came from ("<defaults>" if none)
  std::string log_level = "info";
  std::string log_format = "text";  // text or json (server/log_format.h)
  bool has_scheduler = false, has_node = false, has_serve = false;
  SchedulerSection scheduler;
  NodeSection node;
  ServeSection serve;
};

absl::StatusOr<Config> LoadConfig(const std::string& path);
absl::StatusOr<Config> ParseConfig(const std::string& yaml_text, const std::string& source);

// "host:port" check for listen/advertise addresses.
absl::Status ValidateAddress(const std::string& value, const std::string& what);

}  // namespace ballast::server
