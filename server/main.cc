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

// Applies the daemon flags set over the loaded config `c`.
void ApplyDaemonFlags(const DaemonFlags& f, bool need_scheduler, bool serve, Config* c) {
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
  ApplyDaemonFlags(f, need_scheduler, serve, &*c);
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

// The daemons' subcommands: serve, scheduler, node.
struct DaemonCommands {
  DaemonFlags serve_f, sched_f, node_f;
  CLI::App *serve = nullptr, *sched = nullptr, *node = nullptr;
};

// Registers `serve`, `scheduler` and `node`.
void AddDaemons(CLI::App* app, DaemonCommands* d) {
  d->serve = app->add_subcommand("serve",
                                 "embedded default: scheduler + one CPU node + "
                                 "synthetic models, on localhost");
  AddDaemonFlags(d->serve, &d->serve_f, false, false);
  d->serve->add_option("--cache-dir", d->serve_f.cache_dir, "where generated models are kept");
  d->serve->add_option("--node-listen", d->serve_f.node_listen,
                       "the embedded node's listen address");
  d->sched = app->add_subcommand("scheduler", "run the global scheduler");
  AddDaemonFlags(d->sched, &d->sched_f, false, true);
  d->node = app->add_subcommand("node", "run a node manager");
  AddDaemonFlags(d->node, &d->node_f, true, false);
}

// Runs the daemon parsed, if any: true and *rc then.
bool RunDaemon(const DaemonCommands& d, int* rc) {
  Config config;
  if (d.serve->parsed()) {
    if ((*rc = PrepareConfig(d.serve_f, "", true, true, true, &config))) return true;
    if (!config.has_serve && d.serve_f.config.empty()) {
      std::cerr << "error: ballast serve needs a config with a serve section "
                   "(try --config configs/ballast.yaml)\n";
      *rc = 2;
      return true;
    }
    BlockShutdownSignals();
    *rc = ballast::server::RunServe(config);
    return true;
  }
  if (d.sched->parsed()) {
    if ((*rc = PrepareConfig(d.sched_f, "", true, false, false, &config))) return true;
    BlockShutdownSignals();
    *rc = ballast::server::RunScheduler(config);
    return true;
  }
  if (d.node->parsed()) {
    if ((*rc = PrepareConfig(d.node_f, "", false, true, false, &config))) return true;
    BlockShutdownSignals();
    *rc = ballast::server::RunNode(config);
    return true;
  }
  return false;
}

// `generate`'s flags.
struct GenerateCommand {
  ballast::server::GenerateFlags gen;
  uint64_t seed = 0;
  CLI::Option* seed_opt = nullptr;
  CLI::App* cmd = nullptr;
};

// Registers `generate`.
void AddGenerate(CLI::App* app, GenerateCommand* g) {
  auto& gen = g->gen;
  auto* generate = g->cmd = app->add_subcommand("generate", "stream one completion to stdout");
  generate->add_option("--target", gen.target, "scheduler address")->capture_default_str();
  generate->add_option("--model,-m", gen.model, "model name")->required();
  generate->add_option("--prompt,-p", gen.prompt, "prompt text ('-' reads stdin)")->required();
  generate->add_option("--session,-s", gen.session, "multi-turn session id");
  generate->add_option("--max-tokens,-n", gen.max_tokens, "tokens to generate")
      ->capture_default_str();
  generate->add_option("--temperature", gen.temperature, "0 = greedy")->capture_default_str();
  generate->add_option("--top-p", gen.top_p, "nucleus threshold")->capture_default_str();
  generate->add_option("--top-k", gen.top_k, "keep the k most likely (0 = off)");
  g->seed_opt = generate->add_option("--seed", g->seed, "sampling seed");
  generate->add_option("--stop", gen.stop, "stop string (repeatable)");
  generate->add_flag("--ignore-eos", gen.ignore_eos, "keep going past end-of-sequence");
  generate->add_option("--ttft-ms", gen.ttft_ms, "TTFT SLO in ms");
  generate->add_option("--tpot-ms", gen.tpot_ms, "TPOT SLO in ms");
  generate->add_option("--priority", gen.priority, "request priority");
  generate->add_flag("--stats", gen.stats, "print usage and timings to stderr");
}

// Runs `generate` (its prompt from stdin for '-').
int RunGenerateCommand(GenerateCommand* g) {
  if (*g->seed_opt) g->gen.seed = g->seed;
  if (g->gen.prompt == "-") {
    g->gen.prompt.assign(std::istreambuf_iterator<char>(std::cin), {});
  }
  return ballast::server::RunGenerate(g->gen);
}

// `chat`'s flags.
struct ChatCommand {
  ballast::server::ChatFlags chat_f;
  uint64_t seed = 0;
  CLI::Option* seed_opt = nullptr;
  CLI::App* cmd = nullptr;
};

// Registers `chat`.
void AddChat(CLI::App* app, ChatCommand* c) {
  auto& chat_f = c->chat_f;
  auto* chat = c->cmd = app->add_subcommand(
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
  c->seed_opt = chat->add_option("--seed", c->seed, "sampling seed");
  chat->add_flag("--ignore-eos", chat_f.ignore_eos, "keep going past end-of-sequence");
  chat->add_flag("--stats", chat_f.stats, "print usage and timings of each reply to stderr");
}

// The cluster client commands (models, cluster, health, demo, drain) and
// their flags; they share --target.
struct ClusterCommands {
  std::string target = "127.0.0.1:50051";
  CLI::App *models = nullptr, *cluster = nullptr, *health = nullptr, *demo = nullptr,
           *drain = nullptr;
  std::string health_service, health_metrics_url;
  std::string demo_prompt = "Once upon a time";
  int demo_tokens = 48;
  std::string drain_node;
  bool drain_undo = false;
  int drain_wait_s = 0;
};

// Registers `models`, `cluster`, `health` and `demo`.
void AddClusterViews(CLI::App* app, ClusterCommands* c) {
  std::string& target = c->target;
  c->models = app->add_subcommand("models", "list models and where they are resident");
  c->models->add_option("--target", target, "scheduler address")->capture_default_str();
  c->cluster = app->add_subcommand("cluster", "show nodes, devices and memory");
  c->cluster->add_option("--target", target, "scheduler address")->capture_default_str();
  auto* health = c->health = app->add_subcommand(
      "health", "grpc.health.v1 check (exit 0 if SERVING), or GET of a metrics endpoint");
  auto* health_target =
      health->add_option("--target", target, "server address")->capture_default_str();
  auto* health_service_opt =
      health->add_option("--service", c->health_service, "service name ('' = the whole server)");
  health
      ->add_option("--metrics-url", c->health_metrics_url,
                   "instead of gRPC: GET this URL, exit 0 on HTTP 200 (liveness of a standby "
                   "scheduler, whose gRPC port stays closed), e.g. http://localhost:9400/metrics")
      ->excludes(health_target)
      ->excludes(health_service_opt);
  c->demo = app->add_subcommand("demo", "stream from every model at once");
  c->demo->add_option("--target", target, "scheduler address")->capture_default_str();
  c->demo->add_option("--prompt", c->demo_prompt, "prompt for every model");
  c->demo->add_option("--max-tokens", c->demo_tokens, "tokens per model");
}

// Registers `drain`.
void AddDrain(CLI::App* app, ClusterCommands* c) {
  auto* drain = c->drain = app->add_subcommand(
      "drain", "cordon a node and move its models away (Admin.DrainNode), before maintenance");
  drain->add_option("--target", c->target, "scheduler address")->capture_default_str();
  drain->add_option("--node", c->drain_node, "node id")->required();
  drain->add_flag("--undo", c->drain_undo, "lift the cordon");
  drain
      ->add_option("--wait", c->drain_wait_s,
                   "wait up to this many seconds until the node holds "
                   "no models (exit 1 if it still does)")
      ->capture_default_str();
}

// Runs the cluster client command parsed, if any: true and *rc then.
bool RunClusterCommand(const ClusterCommands& c, int* rc) {
  if (c.models->parsed()) {
    *rc = ballast::server::RunModels(c.target);
  } else if (c.cluster->parsed()) {
    *rc = ballast::server::RunCluster(c.target);
  } else if (c.health->parsed()) {
    *rc = !c.health_metrics_url.empty() ? ballast::server::RunMetricsHealth(c.health_metrics_url)
                                        : ballast::server::RunHealth(c.target, c.health_service);
  } else if (c.drain->parsed()) {
    *rc = ballast::server::RunDrain(c.target, c.drain_node, c.drain_undo, c.drain_wait_s);
  } else if (c.demo->parsed()) {
    *rc = ballast::server::RunDemo(c.target, c.demo_prompt, c.demo_tokens);
  } else {
    return false;
  }
  return true;
}

// `keys add`'s flags.
struct KeysCommand {
  std::string keys_file, key_tenant, key_role = "user", key_models;
  CLI::App* add = nullptr;
};

// Registers `keys` and its `add`.
void AddKeys(CLI::App* app, KeysCommand* k) {
  auto* keys = app->add_subcommand("keys", "API keys for scheduler.auth.keys_file");
  keys->require_subcommand(1);
  auto* keys_add = k->add = keys->add_subcommand(
      "add", "make a key, append its SHA-256 to the key file, print the key (shown only once)");
  keys_add->add_option("--file", k->keys_file, "the key file (created if missing)")->required();
  keys_add->add_option("--tenant", k->key_tenant, "the tenant the key acts as")->required();
  keys_add->add_option("--role", k->key_role, "user | admin")->capture_default_str();
  keys_add->add_option("--models", k->key_models,
                       "comma-separated allow-list (default: every model)");
}

// Runs `keys add`: appends the key's hash, prints the key.
int RunKeysAdd(const KeysCommand& k) {
  ballast::server::Principal who;
  who.tenant = k.key_tenant;
  if (k.key_role != "user" && k.key_role != "admin") {
    std::cerr << "error: --role " << k.key_role << ": expected user or admin\n";
    return 2;
  }
  who.role = k.key_role == "admin" ? ballast::server::Role::kAdmin : ballast::server::Role::kUser;
  if (!k.key_models.empty()) who.models = absl::StrSplit(k.key_models, ',', absl::SkipEmpty());
  auto key = ballast::server::AddKey(k.keys_file, who);
  if (!key.ok()) {
    std::cerr << "error: " << key.status().message() << "\n";
    return 2;
  }
  std::cout << *key << "\n";
  std::cerr << "added a " << k.key_role << " key for tenant " << k.key_tenant << " to "
            << k.keys_file << " (only its SHA-256 is stored; keep the key above)\n";
  return 0;
}

// `make-model`'s flags.
struct MakeModelCommand {
  ballast::engine::SyntheticModelSpec spec;
  std::string out_dir;
  int make_threads = 0;
  CLI::App* cmd = nullptr;
};

// Registers `make-model`.
void AddMakeModel(CLI::App* app, MakeModelCommand* m) {
  auto& spec = m->spec;
  auto* mk = m->cmd =
      app->add_subcommand("make-model", "write a synthetic model (safetensors + config.json)");
  mk->add_option("--out", m->out_dir, "output directory")->required();
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
  mk->add_option("--threads", m->make_threads, "threads drawing weights (0: one per core)")
      ->capture_default_str();
}

// Runs `make-model`.
int RunMakeModel(const MakeModelCommand& m) {
  if (auto st = ballast::engine::WriteSyntheticModel(
          m.spec, m.out_dir, ballast::engine::SyntheticWriteOptions{.threads = m.make_threads});
      !st.ok()) {
    std::cerr << "error: " << st.message() << "\n";
    return 2;
  }
  std::cout << "wrote " << m.out_dir << "/config.json and model.safetensors\n";
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

  DaemonCommands daemons;
  AddDaemons(&app, &daemons);
  GenerateCommand generate;
  AddGenerate(&app, &generate);
  ChatCommand chat;
  AddChat(&app, &chat);
  ClusterCommands cluster;
  AddClusterViews(&app, &cluster);
  AddDrain(&app, &cluster);
  KeysCommand keys;
  AddKeys(&app, &keys);
  MakeModelCommand make_model;
  AddMakeModel(&app, &make_model);

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

  if (int rc = 0; RunDaemon(daemons, &rc)) return rc;
  if (generate.cmd->parsed()) return RunGenerateCommand(&generate);
  if (chat.cmd->parsed()) {
    if (*chat.seed_opt) chat.chat_f.seed = chat.seed;
    return ballast::server::RunChat(chat.chat_f, std::cin, std::cout, std::cerr, isatty(0) != 0);
  }
  if (int rc = 0; RunClusterCommand(cluster, &rc)) return rc;
  if (keys.add->parsed()) return RunKeysAdd(keys);
  if (make_model.cmd->parsed()) return RunMakeModel(make_model);
  return 1;
}
