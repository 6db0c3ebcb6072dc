#include "server/processes.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "global_scheduler/etcd_client.h"
#include "server/gateway/http_gateway.h"
#include "server/grpc_errors.h"
#include "server/metrics.h"
#include "server/model_tokenizer.h"
#include "server/node_service.h"
#include "server/scheduler_service.h"
#include "server/tls.h"
#include "spdlog/spdlog.h"

namespace ballast::server {
namespace {

// What the metrics show of one device's usage.
DeviceGauges GaugesOf(const std::string& name, const node_manager::DeviceUsage& u) {
  DeviceGauges g;
  g.device = name;
  g.kv_blocks_used = u.kv_blocks_total - u.kv_blocks_free;
  g.kv_blocks_free = u.kv_blocks_free;
  g.memory_used_bytes = u.memory_used_bytes;
  g.queue_length = u.waiting;
  g.running = u.running;
  g.preemptions_total = u.preemptions;
  g.slabs_formatted = u.slabs_formatted;
  g.slabs_empty = u.slabs_empty;
  g.kv_bytes_used = u.kv_bytes_used;
  g.kv_bytes_free = u.kv_bytes_free;
  g.page_map_calls = u.page_map_calls;
  g.page_unmap_calls = u.page_unmap_calls;
  g.step_host = u.step_host;
  g.step_thread = u.step_thread;
  g.step_starts = u.step_starts;
  g.step_drains = u.step_drains;
  g.remap = u.remap;
  g.kv_reclaims = u.kv_reclaims;
  g.kv_compactions = u.kv_compactions;
  g.arbitration = u.arbitration;
  g.model_memory = u.model_memory;
  g.model_preemptions = u.model_preemptions;
  return g;
}

// Blocks until SIGINT or SIGTERM (which main() blocked in every thread).
void WaitForSignal() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  int sig = 0;
  sigwait(&set, &sig);
  spdlog::info("received signal {}, shutting down", sig);
}

std::string ExpandHome(const std::string& p) {
  if (p.rfind("~/", 0) == 0) {
    const char* home = std::getenv("HOME");
    return std::string(home ? home : ".") + p.substr(1);
  }
  return p;
}

// A gRPC server with the health service; `bound` gets host:port as bound.
absl::StatusOr<std::unique_ptr<grpc::Server>> StartGrpc(
    const std::string& listen, const std::vector<grpc::Service*>& services,
    const std::shared_ptr<grpc::ServerCredentials>& credentials, std::string* bound,
    const std::string& what) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder b;
  // gRPC binds with SO_REUSEPORT by default: a second process on the same
  // port would then share (and cross-wire) it instead of failing.
  b.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // Accept the scheduler's keepalive pings (every second, even between
  // calls) without answering them with GOAWAY "too many pings".
  b.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 500);
  b.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  InstallRequestErrors(&b);  // protobuf's parse errors: rate-limited logs
  int port = 0;
  b.AddListeningPort(listen, credentials, &port);
  for (auto* s : services) b.RegisterService(s);
  auto server = b.BuildAndStart();
  if (!server || port == 0) {
    return absl::UnavailableError(absl::StrCat(what, ": cannot listen on ", listen, " (port ",
                                               listen.substr(listen.rfind(':') + 1),
                                               " already in use, or an invalid address)"));
  }
  *bound = absl::StrCat(listen.substr(0, listen.rfind(':')), ":", port);
  server->GetHealthCheckService()->SetServingStatus(true);
  return server;
}

struct SchedulerParts {
  std::unique_ptr<global_scheduler::Scheduler> scheduler;
  std::unique_ptr<InferenceService> inference;
  std::unique_ptr<AdminService> admin;
  std::unique_ptr<RegistryService> registry;
  std::unique_ptr<KeyStore> keys;  // null: no API keys
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<gateway::HttpGateway> gateway;  // null unless http_listen is set
  std::string address;
  std::thread gauges;
  absl::Notification stop_gauges;
  absl::Duration grace;  // scheduler.shutdown_grace_s

  void Shutdown() {
    server->GetHealthCheckService()->SetServingStatus(false);
    // The gateway first: it cancels its streams, which are gRPC calls to `server`.
    if (gateway) gateway->Shutdown();
    server->Shutdown(absl::ToChronoTime(absl::Now() + grace));
    stop_gauges.Notify();
    if (gauges.joinable()) gauges.join();
    scheduler->Stop();
  }
};

absl::StatusOr<std::unique_ptr<SchedulerParts>> StartScheduler(const SchedulerSection& cfg,
                                                               Metrics* metrics) {
  auto p = std::make_unique<SchedulerParts>();
  p->grace = absl::Seconds(cfg.shutdown_grace_s);
  global_scheduler::SchedulerOptions options = cfg.options;
  auto node_creds = ChannelCredentialsFor(cfg.tls);  // mTLS to the nodes
  if (!node_creds.ok()) return node_creds.status();
  options.node_credentials = *node_creds;
  auto s = global_scheduler::Scheduler::Create(options);
  if (!s.ok()) return s.status();
  p->scheduler = std::move(*s);
  metrics->AddModelSource(
      [sched = p->scheduler.get()](const std::string& m) { return sched->HasModel(m); });
  if (!cfg.keys_file.empty()) {
    auto keys = KeyStore::Load(cfg.keys_file);
    if (!keys.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("scheduler.auth.keys_file: ", keys.status().message(),
                       " (make one with `ballast keys add --file FILE --tenant T`)"));
    }
    p->keys = std::move(*keys);
    spdlog::info("API keys: {} from {}", p->keys->size(), cfg.keys_file);
  }
  metrics->SetTenantSource(
      [keys = p->keys.get(), quotas = cfg.options.quotas.tenants](const std::string& t) {
        return quotas.count(t) > 0 || (keys != nullptr && keys->KnowsTenant(t));
      });
  p->inference = std::make_unique<InferenceService>(p->scheduler.get(), metrics, p->keys.get());
  p->admin = std::make_unique<AdminService>(p->scheduler.get(), p->keys.get());
  // Nodes register only with a certificate the cluster CA signed when the
  // port has TLS.
  p->registry = std::make_unique<RegistryService>(p->scheduler.get(), cfg.tls.enabled());
  auto server_creds = ServerCredentialsFor(
      cfg.tls, cfg.tls.require_client_cert ? ClientCerts::kRequired : ClientCerts::kOptional);
  if (!server_creds.ok()) return server_creds.status();
  auto server = StartGrpc(cfg.listen, {p->inference.get(), p->admin.get(), p->registry.get()},
                          *server_creds, &p->address, "scheduler");
  if (!server.ok()) return server.status();
  p->server = std::move(*server);
  if (!cfg.http_listen.empty()) {
    gateway::GatewayOptions go;
    go.listen = cfg.http_listen;
    go.upstream = gateway::LoopbackTarget(p->address);
    auto upstream_creds = ChannelCredentialsFor(cfg.tls);
    if (!upstream_creds.ok()) return upstream_creds.status();
    go.upstream_credentials = *upstream_creds;
    if (cfg.tls.enabled()) {  // HTTPS with the gRPC port's certificate and CA
      go.tls = gateway::GatewayTlsOptions{cfg.tls.cert_file, cfg.tls.key_file, cfg.tls.ca_file,
                                          cfg.tls.require_client_cert,
                                          absl::Seconds(cfg.tls.reload_interval_s)};
    }
    auto gw = gateway::HttpGateway::Create(go);
    if (!gw.ok()) {
      p->server->Shutdown();
      return gw.status();
    }
    p->gateway = std::move(*gw);
  }
  p->scheduler->Start();
  p->gauges = std::thread([raw = p.get(), metrics] {
    do {
      int alive = 0, dead = 0;
      for (const auto& n : raw->scheduler->cluster().Snapshot()) (n.alive ? alive : dead)++;
      metrics->SetNodes(alive, dead);
      metrics->SetSessions(raw->scheduler->sessions().size());
      metrics->SetStateWriteErrors(raw->scheduler->sessions().write_errors());
    } while (!raw->stop_gauges.WaitForNotificationWithTimeout(absl::Seconds(1)));
  });
  spdlog::info("scheduler listening on {}", p->address);
  return p;
}

struct NodeParts {
  std::unique_ptr<node_manager::NodeManager> node;
  std::unique_ptr<NodeService> service;
  std::unique_ptr<grpc::Server> server;
  std::string address;
  std::thread gauges;
  absl::Notification stop_gauges;
  // Set when the scheduler refused this node's id or replaced it.
  absl::Mutex refused_mu;
  absl::Status refused ABSL_GUARDED_BY(refused_mu);

  absl::Status Refused() {
    absl::MutexLock lock(&refused_mu);
    return refused;
  }
  absl::Duration grace;  // node.shutdown_grace_s

  void Shutdown() {
    server->GetHealthCheckService()->SetServingStatus(false);
    stop_gauges.Notify();
    if (gauges.joinable()) gauges.join();
    // Drain: the server takes no new calls (the scheduler retries them on
    // another replica) and lets the streams in flight finish on the still
    // running engines, for up to `grace`; then it cancels the rest.
    // Past that, the node stops too, which also ends handlers blocked in it
    // (a draining eviction).
    absl::Notification drained;
    std::thread drain([&] {
      server->Shutdown(absl::ToChronoTime(absl::Now() + grace));
      drained.Notify();
    });
    drained.WaitForNotificationWithTimeout(grace + absl::Seconds(1));
    node->Shutdown();  // heartbeats, then device workers
    drain.join();
  }
};

absl::StatusOr<std::unique_ptr<NodeParts>> StartNode(const NodeSection& cfg, Metrics* metrics) {
  auto p = std::make_unique<NodeParts>();
  p->grace = absl::Seconds(cfg.shutdown_grace_s);
  node_manager::NodeOptions options = cfg.options;
  auto creds = ChannelCredentialsFor(cfg.tls);  // mTLS to the scheduler and peers
  if (!creds.ok()) return creds.status();
  options.credentials = *creds;
  // Only the scheduler and peer nodes call the Node service: with TLS, a
  // certificate from the cluster CA is required.
  auto server_creds = NodeServerCredentials(cfg.tls);
  if (!server_creds.ok()) return server_creds.status();
  auto n = node_manager::NodeManager::Create(options);
  if (!n.ok()) return n.status();
  p->node = std::move(*n);
  metrics->AddModelSource(
      [node = p->node.get()](const std::string& m) { return node->HasModel(m); });
  p->service = std::make_unique<NodeService>(p->node.get(), metrics, cfg.stream_threads);
  auto server = StartGrpc(cfg.listen, {p->service.get()}, *server_creds, &p->address, "node");
  if (!server.ok()) return server.status();
  p->server = std::move(*server);
  std::string advertise = cfg.options.advertise_address;
  if (advertise.empty()) advertise = p->address;  // the bound listen address
  p->node->StartHeartbeats(advertise, [raw = p.get()](const absl::Status& st) {
    {
      absl::MutexLock lock(&raw->refused_mu);
      raw->refused = st;
    }
    kill(getpid(), SIGTERM);  // wakes WaitForSignal; the process exits non-zero
  });
  p->gauges = std::thread([raw = p.get(), metrics, serving = true]() mutable {
    do {
      // grpc health: NOT_SERVING while the scheduler does not know this node.
      if (const bool c = raw->node->Connected();
          c != serving && !raw->stop_gauges.HasBeenNotified()) {
        raw->server->GetHealthCheckService()->SetServingStatus(c);
        serving = c;
      }
      for (auto* d : raw->node->devices()) {
        metrics->SetDevice(GaugesOf(d->name(), d->Usage()));
      }
      if (const auto* tiers = raw->node->kv_tiers()) {
        const auto t = tiers->stats();
        KvTierGauges g{t.dram_bytes,     t.ssd_bytes,       t.chunks,    t.checksum_failures,
                       t.ssd_read_bytes, t.ssd_write_bytes, t.peer_bytes};
        for (auto* d : raw->node->devices()) {
          for (const auto& e : d->Engines()) {
            const auto p = e->stats().prefetches;
            g.prefetch_used += p.used;
            g.prefetch_invalidated += p.invalidated;
            g.prefetch_expired += p.expired;
          }
        }
        metrics->SetKvTiers(g);
      }
    } while (!raw->stop_gauges.WaitForNotificationWithTimeout(absl::Milliseconds(500)));
  });
  spdlog::info("node {} listening on {} (scheduler {})", cfg.options.node_id, p->address,
               cfg.options.scheduler_address.empty() ? "none" : cfg.options.scheduler_address);
  return p;
}

int Fail(const absl::Status& st) {
  spdlog::error("{}", std::string(st.message()));
  return 1;
}

absl::StatusOr<std::unique_ptr<prometheus::Exposer>> MaybeExpose(const std::string& listen,
                                                                 Metrics& metrics) {
  if (listen.empty()) return std::unique_ptr<prometheus::Exposer>();
  auto e = StartExposer(listen, metrics.registry());
  if (e.ok()) spdlog::info("metrics on http://{}/metrics", listen);
  return e;
}

}  // namespace

absl::StatusOr<std::vector<global_scheduler::ModelSpec>> PrepareSyntheticModels(
    const ServeSection& serve) {
  std::vector<global_scheduler::ModelSpec> out;
  const std::filesystem::path cache = ExpandHome(serve.cache_dir);
  for (size_t i = 0; i < serve.models.size(); ++i) {
    const SyntheticModelEntry& m = serve.models[i];
    engine::SyntheticModelSpec model = m.spec;
    const std::string tokenizer = m.tokenizer.empty() ? "" : ExpandHome(m.tokenizer);
    if (!tokenizer.empty()) {
      auto vocab = TokenizerVocabSize(tokenizer);
      if (!vocab.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("serve.models[", i, "].tokenizer: ", vocab.status().message()));
      }
      model.vocab = std::max(model.vocab, *vocab);
    }
    auto cfg = engine::SyntheticConfig(model);
    if (!cfg.ok()) return cfg.status();
    // The directory name carries a hash of the spec so edits regenerate.
    const std::string key =
        absl::StrCat(m.name, "-",
                     absl::Hex(std::hash<std::string>{}(absl::StrCat(cfg->ToJson(), model.seed,
                                                                     model.init_std, tokenizer)) &
                               0xffffffffu));
    const std::filesystem::path dir = cache / key;
    if (!std::filesystem::exists(dir / "config.json")) {
      const std::filesystem::path tmp = cache / (key + ".tmp");
      std::error_code ec;
      std::filesystem::remove_all(tmp, ec);
      if (auto st = engine::WriteSyntheticModel(model, tmp.string()); !st.ok()) return st;
      if (!tokenizer.empty()) {
        if (auto st = AttachTokenizer(tokenizer, tmp.string()); !st.ok()) return st;
      }
      std::filesystem::rename(tmp, dir, ec);
      if (ec)
        return absl::InternalError(
            absl::StrCat("cannot create ", dir.string(), ": ", ec.message()));
      spdlog::info("generated synthetic model {} in {}", m.name, dir.string());
    }
    global_scheduler::ModelSpec spec;
    spec.name = m.name;
    spec.path = dir.string();
    spec.kv_dtype = m.kv_dtype;
    spec.quantization = m.quantization;
    spec.replicas = m.replicas;
    out.push_back(spec);
  }
  return out;
}

namespace {

// The transport rules of server/tls.h for one section, naming the file.
absl::Status CheckTransport(const Config& c, const TlsSettings& tls,
                            const std::vector<std::string>& listen, const std::string& section) {
  if (absl::Status st = CheckTls(tls, listen, absl::StrCat(c.source, ": ", section, ".tls"));
      !st.ok()) {
    return st;
  }
  if (tls.insecure) {
    spdlog::warn("{}.tls.insecure is true: gRPC traffic on {} is plaintext and unauthenticated",
                 section, absl::StrJoin(listen, ", "));
  }
  return absl::OkStatus();
}

absl::Status CheckSchedulerTransport(const Config& c) {
  const SchedulerSection& s = c.scheduler;
  return CheckTransport(c, s.tls, {s.listen, s.http_listen}, "scheduler");
}

absl::Status CheckNodeTransport(const Config& c) {
  const NodeSection& n = c.node;
  return CheckTransport(c, n.tls, {n.listen, n.options.advertise_address}, "node");
}

}  // namespace

// Waits for SIGINT/SIGTERM on a thread of its own, so that a standby
// scheduler blocked in its campaign can be stopped; on_signal runs there.
// Thread-safety: Wait and received from any thread; the destructor from
// the owner's (it releases the thread with a SIGTERM of its own if none
// came).
class ShutdownSignal {
 public:
  explicit ShutdownSignal(std::function<void()> on_signal)
      : thread_([this, f = std::move(on_signal)] {
          WaitForSignal();
          got_.Notify();
          if (f) f();
        }) {}
  ~ShutdownSignal() {
    if (!got_.HasBeenNotified()) kill(getpid(), SIGTERM);  // releases the thread
    thread_.join();
  }
  void Wait() { got_.WaitForNotification(); }
  bool received() const { return got_.HasBeenNotified(); }

 private:
  absl::Notification got_;
  std::thread thread_;
};

// scheduler.state.etcd: this scheduler's candidacy (its id names its
// address, host and pid).
std::unique_ptr<global_scheduler::LeaderElection> Candidacy(
    const SchedulerSection& cfg, std::shared_ptr<global_scheduler::EtcdClient> client) {
  char host[256] = "";
  gethostname(host, sizeof(host) - 1);
  global_scheduler::LeaderElectionOptions eo;
  eo.key = cfg.etcd.prefix + "/leader";
  eo.id = absl::StrCat(cfg.listen, " (", host, ", pid ", getpid(), ")");
  eo.ttl_s = cfg.etcd.lease_ttl_s;
  return std::make_unique<global_scheduler::LeaderElection>(std::move(client), eo);
}

// Stands for leadership, blocking while another scheduler leads (this one's
// ports stay closed meanwhile, so nodes and clients that list both
// addresses reach the leader), then opens the store fenced by it. A leader
// that loses its lease exits at once (status 75) so that a restart stands
// by again: it must not go on acting as leader.
absl::StatusOr<std::shared_ptr<global_scheduler::StateStore>> Lead(
    const SchedulerSection& cfg, std::shared_ptr<global_scheduler::EtcdClient> client,
    global_scheduler::LeaderElection* election) {
  spdlog::info("scheduler {}: standing for {} in etcd {}", election->id(), election->key(),
               cfg.etcd.endpoints);
  absl::Status st = election->Campaign([](const absl::Status& lost) {
    spdlog::critical("{}; exiting (status 75) so that a restart stands by",
                     std::string(lost.message()));
    spdlog::default_logger()->flush();
    std::_Exit(75);
  });
  if (!st.ok()) return st;
  global_scheduler::EtcdStateOptions so;
  so.prefix = cfg.etcd.prefix;
  so.fence_key = election->key();
  so.fence_revision = election->won_revision();
  so.fence_id = election->id();
  auto store = global_scheduler::OpenEtcdStateStore(std::move(client), so);
  if (!store.ok()) {
    election->Resign().IgnoreError();  // the standby need not wait for the TTL
    return store.status();
  }
  return std::shared_ptr<global_scheduler::StateStore>(std::move(*store));
}

int RunScheduler(const Config& config) {
  if (absl::Status st = CheckSchedulerTransport(config); !st.ok()) return Fail(st);
  Metrics metrics;
  // A standby exports ballast_scheduler_leader 0 until it leads, and serves
  // /metrics all along: its liveness probe (`ballast health --metrics-url`)
  // needs no gRPC port.
  metrics.SetLeader(config.scheduler.etcd.endpoints.empty());
  auto exposer = MaybeExpose(config.scheduler.metrics_listen, metrics);
  if (!exposer.ok()) return Fail(exposer.status());
  SchedulerSection cfg = config.scheduler;
  std::shared_ptr<global_scheduler::EtcdClient> etcd;
  std::unique_ptr<global_scheduler::LeaderElection> election;
  if (!cfg.etcd.endpoints.empty()) {
    auto client = global_scheduler::EtcdClient::Create(cfg.etcd.endpoints,
                                                       absl::Milliseconds(cfg.etcd.timeout_ms));
    if (!client.ok()) return Fail(client.status());
    etcd = *client;
    election = Candidacy(cfg, etcd);
  }
  // A signal during the campaign cancels it (Cancel is harmless after).
  ShutdownSignal signal([e = election.get()] {
    if (e != nullptr) e->Cancel();
  });
  if (election) {
    auto store = Lead(cfg, etcd, election.get());
    if (!store.ok()) {
      if (absl::IsCancelled(store.status()) && signal.received()) return 0;  // a standby stopped
      return Fail(store.status());
    }
    cfg.options.state_store = std::move(*store);
    metrics.SetLeader(true);
  }
  auto s = StartScheduler(cfg, &metrics);
  if (!s.ok()) {
    if (election) election->Resign().IgnoreError();
    return Fail(s.status());
  }
  signal.Wait();
  (*s)->Shutdown();
  if (election) election->Resign().IgnoreError();  // the standby need not wait for the TTL
  return 0;
}

int RunNode(const Config& config) {
  if (config.node.options.scheduler_address.empty()) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat(config.source, ": node.scheduler: missing (use --scheduler HOST:PORT)")));
  }
  if (absl::Status st = CheckNodeTransport(config); !st.ok()) return Fail(st);
  Metrics metrics;
  auto exposer = MaybeExpose(config.node.metrics_listen, metrics);
  if (!exposer.ok()) return Fail(exposer.status());
  auto n = StartNode(config.node, &metrics);
  if (!n.ok()) return Fail(n.status());
  WaitForSignal();
  (*n)->Shutdown();
  if (absl::Status refused = (*n)->Refused(); !refused.ok()) return Fail(refused);
  return 0;
}

int RunServe(const Config& config) {
  if (absl::Status st = CheckSchedulerTransport(config); !st.ok()) return Fail(st);
  if (!config.scheduler.etcd.endpoints.empty()) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat(config.source,
                     ": scheduler.state.etcd: a highly available pair runs `ballast scheduler` "
                     "processes; `serve` keeps one scheduler (use scheduler.state.path)")));
  }
  if (absl::Status st = CheckNodeTransport(config); !st.ok()) return Fail(st);
  Config c = config;
  auto models = PrepareSyntheticModels(c.serve);
  if (!models.ok()) return Fail(models.status());
  for (auto& m : *models) c.scheduler.options.models.push_back(m);
  Metrics metrics;          // one registry, scheduler and node families
  metrics.SetLeader(true);  // the one scheduler
  auto exposer = MaybeExpose(c.scheduler.metrics_listen, metrics);
  if (!exposer.ok()) return Fail(exposer.status());
  auto s = StartScheduler(c.scheduler, &metrics);
  if (!s.ok()) return Fail(s.status());
  c.node.options.scheduler_address = (*s)->address;
  auto n = StartNode(c.node, &metrics);
  if (!n.ok()) {
    (*s)->Shutdown();
    return Fail(n.status());
  }
  std::string names;
  for (const auto& m : *models) names += (names.empty() ? "" : ", ") + m.name;
  spdlog::info(
      "ballast serve ready on {}: models {}. Try: ballast generate --target {} --model {} "
      "--prompt 'Hello'",
      (*s)->address, names, (*s)->address, models->empty() ? "M" : models->front().name);
  WaitForSignal();
  (*n)->Shutdown();
  (*s)->Shutdown();
  return 0;
}

}  // namespace ballast::server
