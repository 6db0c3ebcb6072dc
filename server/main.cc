// The `ballast` binary: daemons (serve, scheduler, node), client commands
// (generate, models, cluster, demo) and tools (make-model).
#include <signal.h>
#include <unistd.h>

#include <iostream>
#include <optional>

#include "CLI/CLI.hpp"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "engine/synthetic_model.h"
#include "server/auth.h"
#include "server/bench_cli.h"
#include "server/chat_command.h"
#include "server/client_commands.h"
#include "server/config.h"
#include "server/engine_bench_cli.h"
#include "server/log_format.h"
#include "server/processes.h"
#include "server/remap_bench_cli.h"
#include "server/sim_cli.h"
#include "server/tier_bench_cli.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"

namespace {

using ballast::server::Config;

// Daemons wait for SIGINT/SIGTERM with sigwait(): block them in every
// thread, before any is started. Client commands keep the default action.
void BlockShutdownSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

// Daemon flags that override the config file.
struct DaemonFlags {
  std::string config;
  std::string log_level;
  std::string log_format;
  std::string listen;
  std::optional<std::string> metrics_listen;  // set and empty: disabled
  std::optional<std::string> http_listen;     // scheduler/serve: OpenAI gateway ('' = off)
  std::string scheduler, node_id, advertise;
  std::string kv_ssd_dir;  // node: overrides node.kv_tiers.ssd_dir
  int64_t heartbeat_timeout_ms = 0;
  std::string cache_dir;
  std::string node_listen;  // serve only
};

void AddDaemonFlags(CLI::App* cmd, DaemonFlags* f, bool node, bool scheduler) {
  cmd->add_option("--config,-c", f->config, "YAML config file");
  cmd->add_option("--log-level", f->log_level, "trace|debug|info|warn|error|off");
  cmd->add_option("--log-format", f->log_format, "text|json (one JSON object per line)");
  cmd->add_option("--listen", f->listen, "gRPC listen address host:port");
  cmd->add_option("--metrics-listen", f->metrics_listen, "Prometheus /metrics address ('' = off)");
  if (node) {
    cmd->add_option("--scheduler", f->scheduler, "scheduler address host:port");
    cmd->add_option("--node-id", f->node_id, "this node's id");
    cmd->add_option("--advertise", f->advertise, "address the scheduler uses to reach this node");
    cmd->add_option("--kv-ssd-dir", f->kv_ssd_dir,
                    "session KV SSD tier directory (overrides node.kv_tiers.ssd_dir; the "
                    "budget is node.kv_tiers.ssd_gib)");
  }
  if (!node) {
    cmd->add_option("--http-listen", f->http_listen,
                    "OpenAI-compatible HTTP gateway host:port ('' = off, port 0 = any)");
  }
  if (scheduler) {
    cmd->add_option("--heartbeat-timeout-ms", f->heartbeat_timeout_ms,
                    "declare a node dead after this long without heartbeats");
  }
}

// Loads the config (or defaults), checks the needed sections, applies flags.
int PrepareConfig(const DaemonFlags& f, const std::string& default_path, bool need_scheduler,
                  bool need_node, bool serve, Config* out) {
  const std::string path = f.config.empty() ? default_path : f.config;
  absl::StatusOr<Config> c = path.empty() ? ballast::server::ParseConfig("", "<defaults>")
                                          : ballast::server::LoadConfig(path);
  if (!c.ok()) {
    std::cerr << "error: " << c.status().message() << "\n";
    return 2;
  }
  if (need_scheduler && !c->has_scheduler && !path.empty()) {
    std::cerr << "error: " << path << ": section \"scheduler\" is missing\n";
    return 2;
  }
  if (need_node && !c->has_node && !path.empty()) {
    std::cerr << "error: " << path << ": section \"node\" is missing\n";
    return 2;
  }
  if (!f.log_level.empty()) c->log_level = f.log_level;
  if (!f.log_format.empty()) c->log_format = f.log_format;
  if (!f.listen.empty())
    (serve || need_scheduler ? c->scheduler.listen : c->node.listen) = f.listen;
  if (f.metrics_listen) {
    (serve || need_scheduler ? c->scheduler.metrics_listen : c->node.metrics_listen) =
        *f.metrics_listen;
  }
  if (f.http_listen) c->scheduler.http_listen = *f.http_listen;
  if (!f.scheduler.empty()) c->node.options.scheduler_address = f.scheduler;
  if (!f.node_id.empty()) c->node.options.node_id = f.node_id;
  if (!f.advertise.empty()) c->node.options.advertise_address = f.advertise;
  if (!f.kv_ssd_dir.empty()) c->node.options.kv_tiers.ssd_dir = f.kv_ssd_dir;
  if (f.heartbeat_timeout_ms > 0) {
    auto& o = c->scheduler.options;
    // The grace follows the timeout unless the config set its own.
    if (o.startup_grace == 2 * o.heartbeat_timeout) {
      o.startup_grace = 2 * absl::Milliseconds(f.heartbeat_timeout_ms);
    }
    c->scheduler.options.heartbeat_timeout = absl::Milliseconds(f.heartbeat_timeout_ms);
    if (c->scheduler.options.heartbeat_interval >= c->scheduler.options.heartbeat_timeout) {
      c->scheduler.options.heartbeat_interval = c->scheduler.options.heartbeat_timeout / 3;
    }
  }
  // serve: the embedded node is the cluster; no other node holds replicas
  // to wait for (unless the config sets its own grace).
  if (serve && c->scheduler.options.startup_grace == 2 * c->scheduler.options.heartbeat_timeout) {
    c->scheduler.options.startup_grace = absl::ZeroDuration();
  }
  if (!f.cache_dir.empty()) c->serve.cache_dir = f.cache_dir;
  if (!f.node_listen.empty()) c->node.listen = f.node_listen;
  for (const auto& [what, addr] :
       {std::pair{"--listen", c->scheduler.listen}, std::pair{"--listen", c->node.listen}}) {
    if (auto st = ballast::server::ValidateAddress(addr, what); !st.ok()) {
      std::cerr << "error: " << st.message() << "\n";
      return 2;
    }
  }
  spdlog::set_level(spdlog::level::from_str(c->log_level));
  if (auto st = ballast::server::SetLogFormat(c->log_format); !st.ok()) {
    std::cerr << "error: " << st.message() << "\n";
    return 2;
  }
  *out = std::move(*c);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  signal(SIGPIPE, SIG_IGN);
  // Debian's Abseil is built with Mutex deadlock detection on: a lock-order
  // graph updated on every acquisition (GraphCycles showed up in perf of a
  // node streaming 64 requests). The daemon turns it off; in-process tests
  // keep it, and the TSan runs check lock order.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  spdlog::set_default_logger(spdlog::stderr_color_mt("ballast"));

  CLI::App app{"Ballast: multi-model LLM serving with elastic GPU memory"};
  app.set_version_flag("--version", std::string("ballast ") + BALLAST_VERSION);
  app.require_subcommand(1);

  DaemonFlags serve_f, sched_f, node_f;
  auto* serve = app.add_subcommand("serve",
                                   "embedded default: scheduler + one CPU node + "
                                   "synthetic models, on localhost");
  AddDaemonFlags(serve, &serve_f, false, false);
  serve->add_option("--cache-dir", serve_f.cache_dir, "where generated models are kept");
  serve->add_option("--node-listen", serve_f.node_listen, "the embedded node's listen address");
  auto* sched = app.add_subcommand("scheduler", "run the global scheduler");
  AddDaemonFlags(sched, &sched_f, false, true);
  auto* node = app.add_subcommand("node", "run a node manager");
  AddDaemonFlags(node, &node_f, true, false);

  ballast::server::GenerateFlags gen;
  uint64_t seed = 0;
  auto* generate = app.add_subcommand("generate", "stream one completion to stdout");
  generate->add_option("--target", gen.target, "scheduler address")->capture_default_str();
  generate->add_option("--model,-m", gen.model, "model name")->required();
  generate->add_option("--prompt,-p", gen.prompt, "prompt text ('-' reads stdin)")->required();
  generate->add_option("--session,-s", gen.session, "multi-turn session id");
  generate->add_option("--max-tokens,-n", gen.max_tokens, "tokens to generate")
      ->capture_default_str();
  generate->add_option("--temperature", gen.temperature, "0 = greedy")->capture_default_str();
  generate->add_option("--top-p", gen.top_p, "nucleus threshold")->capture_default_str();
  generate->add_option("--top-k", gen.top_k, "keep the k most likely (0 = off)");
  auto* seed_opt = generate->add_option("--seed", seed, "sampling seed");
  generate->add_option("--stop", gen.stop, "stop string (repeatable)");
  generate->add_flag("--ignore-eos", gen.ignore_eos, "keep going past end-of-sequence");
  generate->add_option("--ttft-ms", gen.ttft_ms, "TTFT SLO in ms");
  generate->add_option("--tpot-ms", gen.tpot_ms, "TPOT SLO in ms");
  generate->add_option("--priority", gen.priority, "request priority");
  generate->add_flag("--stats", gen.stats, "print usage and timings to stderr");

  ballast::server::ChatFlags chat_f;
  uint64_t chat_seed = 0;
  auto* chat = app.add_subcommand(
      "chat", "interactive chat with a model (its chat template; streams replies)");
  chat->add_option("--target", chat_f.target, "scheduler address")->capture_default_str();
  chat->add_option("--model,-m", chat_f.model, "model name")->required();
  chat->add_option("--system", chat_f.system, "system prompt of each conversation");
  chat->add_option("--max-tokens,-n", chat_f.max_tokens, "most tokens per reply (0 = no limit)")
      ->capture_default_str();
  chat->add_option("--temperature", chat_f.temperature, "0 = greedy")->capture_default_str();
  chat->add_option("--top-p", chat_f.top_p, "nucleus threshold")->capture_default_str();
  chat->add_option("--top-k", chat_f.top_k, "keep the k most likely (0 = off)");
  chat->add_option("--min-p", chat_f.min_p, "keep tokens with p >= min_p * p_max (0 = off)");
  chat->add_option("--presence-penalty", chat_f.presence_penalty, "OpenAI presence penalty");
  chat->add_option("--frequency-penalty", chat_f.frequency_penalty, "OpenAI frequency penalty");
  chat->add_option("--repetition-penalty", chat_f.repetition_penalty, "HF repetition penalty");
  auto* chat_seed_opt = chat->add_option("--seed", chat_seed, "sampling seed");
  chat->add_flag("--ignore-eos", chat_f.ignore_eos, "keep going past end-of-sequence");
  chat->add_flag("--stats", chat_f.stats, "print usage and timings of each reply to stderr");

  std::string target = "127.0.0.1:50051";
  auto* models = app.add_subcommand("models", "list models and where they are resident");
  models->add_option("--target", target, "scheduler address")->capture_default_str();
  auto* cluster = app.add_subcommand("cluster", "show nodes, devices and memory");
  cluster->add_option("--target", target, "scheduler address")->capture_default_str();
  std::string health_service, health_metrics_url;
  auto* health = app.add_subcommand(
      "health", "grpc.health.v1 check (exit 0 if SERVING), or GET of a metrics endpoint");
  auto* health_target =
      health->add_option("--target", target, "server address")->capture_default_str();
  auto* health_service_opt =
      health->add_option("--service", health_service, "service name ('' = the whole server)");
  health
      ->add_option("--metrics-url", health_metrics_url,
                   "instead of gRPC: GET this URL, exit 0 on HTTP 200 (liveness of a standby "
                   "scheduler, whose gRPC port stays closed), e.g. http://localhost:9400/metrics")
      ->excludes(health_target)
      ->excludes(health_service_opt);
  std::string demo_prompt = "Once upon a time";
  int demo_tokens = 48;
  auto* demo = app.add_subcommand("demo", "stream from every model at once");
  demo->add_option("--target", target, "scheduler address")->capture_default_str();
  demo->add_option("--prompt", demo_prompt, "prompt for every model");
  demo->add_option("--max-tokens", demo_tokens, "tokens per model");

  std::string drain_node;
  bool drain_undo = false;
  int drain_wait_s = 0;
  auto* drain = app.add_subcommand(
      "drain", "cordon a node and move its models away (Admin.DrainNode), before maintenance");
  drain->add_option("--target", target, "scheduler address")->capture_default_str();
  drain->add_option("--node", drain_node, "node id")->required();
  drain->add_flag("--undo", drain_undo, "lift the cordon");
  drain
      ->add_option("--wait", drain_wait_s,
                   "wait up to this many seconds until the node holds "
                   "no models (exit 1 if it still does)")
      ->capture_default_str();

  std::string keys_file, key_tenant, key_role = "user", key_models;
  auto* keys = app.add_subcommand("keys", "API keys for scheduler.auth.keys_file");
  keys->require_subcommand(1);
  auto* keys_add = keys->add_subcommand(
      "add", "make a key, append its SHA-256 to the key file, print the key (shown only once)");
  keys_add->add_option("--file", keys_file, "the key file (created if missing)")->required();
  keys_add->add_option("--tenant", key_tenant, "the tenant the key acts as")->required();
  keys_add->add_option("--role", key_role, "user | admin")->capture_default_str();
  keys_add->add_option("--models", key_models, "comma-separated allow-list (default: every model)");

  ballast::engine::SyntheticModelSpec spec;
  std::string out_dir;
  auto* mk =
      app.add_subcommand("make-model", "write a synthetic model (safetensors + config.json)");
  mk->add_option("--out", out_dir, "output directory")->required();
  mk->add_option("--architecture", spec.architecture, "llama | qwen2 | mistral | qwen3")
      ->capture_default_str();
  mk->add_option("--layers", spec.layers)->capture_default_str();
  mk->add_option("--hidden", spec.hidden)->capture_default_str();
  mk->add_option("--heads", spec.heads)->capture_default_str();
  mk->add_option("--head-dim", spec.head_dim, "0: hidden / heads")->capture_default_str();
  mk->add_option("--kv-heads", spec.kv_heads)->capture_default_str();
  mk->add_option("--intermediate", spec.intermediate)->capture_default_str();
  mk->add_option("--vocab", spec.vocab)->capture_default_str();
  mk->add_option("--max-position", spec.max_position)->capture_default_str();
  mk->add_option("--dtype", spec.dtype, "bf16 | fp16 | f32")->capture_default_str();
  mk->add_option("--seed", spec.seed)->capture_default_str();
  mk->add_flag("--tie-embeddings", spec.tie_embeddings);
  mk->add_flag("--llama3-rope-scaling", spec.llama3_rope_scaling);
  mk->add_option("--init-std", spec.init_std)->capture_default_str();
  int make_threads = 0;
  mk->add_option("--threads", make_threads, "threads drawing weights (0: one per core)")
      ->capture_default_str();

  ballast::server::BenchCli bench_cli(&app);
  ballast::server::EngineBenchCli engine_bench_cli(&app);
  ballast::server::TierBenchCli tier_bench_cli(&app);
  ballast::server::RemapBenchCli remap_bench_cli(&app);
  ballast::server::SimCli sim_cli(&app);

  CLI11_PARSE(app, argc, argv);
  if (int rc = 0; bench_cli.RunParsed(&rc)) return rc;
  if (int rc = 0; engine_bench_cli.RunParsed(&rc)) return rc;
  if (int rc = 0; tier_bench_cli.RunParsed(&rc)) return rc;
  if (int rc = 0; remap_bench_cli.RunParsed(&rc)) return rc;
  if (int rc = 0; sim_cli.RunParsed(&rc)) return rc;

  Config config;
  if (serve->parsed()) {
    if (int rc = PrepareConfig(serve_f, "", true, true, true, &config)) return rc;
    if (!config.has_serve && serve_f.config.empty()) {
      std::cerr << "error: ballast serve needs a config with a serve section "
                   "(try --config configs/ballast.yaml)\n";
      return 2;
    }
    BlockShutdownSignals();
    return ballast::server::RunServe(config);
  }
  if (sched->parsed()) {
    if (int rc = PrepareConfig(sched_f, "", true, false, false, &config)) return rc;
    BlockShutdownSignals();
    return ballast::server::RunScheduler(config);
  }
  if (node->parsed()) {
    if (int rc = PrepareConfig(node_f, "", false, true, false, &config)) return rc;
    BlockShutdownSignals();
    return ballast::server::RunNode(config);
  }
  if (generate->parsed()) {
    if (*seed_opt) gen.seed = seed;
    if (gen.prompt == "-") {
      gen.prompt.assign(std::istreambuf_iterator<char>(std::cin), {});
    }
    return ballast::server::RunGenerate(gen);
  }
  if (chat->parsed()) {
    if (*chat_seed_opt) chat_f.seed = chat_seed;
    return ballast::server::RunChat(chat_f, std::cin, std::cout, std::cerr, isatty(0) != 0);
  }
  if (models->parsed()) return ballast::server::RunModels(target);
  if (cluster->parsed()) return ballast::server::RunCluster(target);
  if (health->parsed()) {
    if (!health_metrics_url.empty()) return ballast::server::RunMetricsHealth(health_metrics_url);
    return ballast::server::RunHealth(target, health_service);
  }
  if (drain->parsed()) {
    return ballast::server::RunDrain(target, drain_node, drain_undo, drain_wait_s);
  }
  if (demo->parsed()) return ballast::server::RunDemo(target, demo_prompt, demo_tokens);
  if (keys_add->parsed()) {
    ballast::server::Principal who;
    who.tenant = key_tenant;
    if (key_role != "user" && key_role != "admin") {
      std::cerr << "error: --role " << key_role << ": expected user or admin\n";
      return 2;
    }
    who.role = key_role == "admin" ? ballast::server::Role::kAdmin : ballast::server::Role::kUser;
    if (!key_models.empty()) who.models = absl::StrSplit(key_models, ',', absl::SkipEmpty());
    auto key = ballast::server::AddKey(keys_file, who);
    if (!key.ok()) {
      std::cerr << "error: " << key.status().message() << "\n";
      return 2;
    }
    std::cout << *key << "\n";
    std::cerr << "added a " << key_role << " key for tenant " << key_tenant << " to " << keys_file
              << " (only its SHA-256 is stored; keep the key above)\n";
    return 0;
  }
  if (mk->parsed()) {
    if (auto st = ballast::engine::WriteSyntheticModel(
            spec, out_dir, ballast::engine::SyntheticWriteOptions{.threads = make_threads});
        !st.ok()) {
      std::cerr << "error: " << st.message() << "\n";
      return 2;
    }
    std::cout << "wrote " << out_dir << "/config.json and model.safetensors\n";
    return 0;
  }
  return 1;
}
