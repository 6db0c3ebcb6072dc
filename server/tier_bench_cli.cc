#include "server/tier_bench_cli.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/notification.h"
#include "grpcpp/grpcpp.h"
#include "nlohmann/json.hpp"
#include "node_manager/node_manager.h"
#include "server/metrics.h"
#include "server/node_service.h"

namespace ballast::server {
namespace {

using node_manager::NodeManager;

enum class Where { kResident, kDram, kSsd, kPeer, kRecompute };
constexpr Where kAll[] = {Where::kResident, Where::kDram, Where::kSsd, Where::kPeer,
                          Where::kRecompute};

const char* Name(Where w) {
  switch (w) {
    case Where::kResident:
      return "resident";
    case Where::kDram:
      return "dram";
    case Where::kSsd:
      return "ssd";
    case Where::kPeer:
      return "peer";
    case Where::kRecompute:
      return "recompute";
  }
  return "?";
}

// Where turn 2 must find the history's KV when nothing was advised.
engine::KvSource Expected(Where w) {
  switch (w) {
    case Where::kResident:
      return engine::KvSource::kDevice;
    case Where::kDram:
      return engine::KvSource::kHostDram;
    case Where::kSsd:
      return engine::KvSource::kSsd;
    case Where::kPeer:
      return engine::KvSource::kPeer;
    case Where::kRecompute:
      return engine::KvSource::kRecomputed;
  }
  return engine::KvSource::kNone;
}

struct Turn {
  std::vector<int> prompt_tokens;
  engine::GenerationResult result;
};

class WaitSink : public engine::GenerationSink {
 public:
  void OnToken(int, const std::string&, const engine::TokenLogprobs*) override {}
  void OnDone(absl::StatusOr<engine::GenerationResult> r) override {
    result_ = std::move(r);
    done_.Notify();
  }
  absl::StatusOr<engine::GenerationResult> Wait() {
    done_.WaitForNotification();
    return result_;
  }

 private:
  absl::Notification done_;
  absl::StatusOr<engine::GenerationResult> result_;
};

}  // namespace

struct TierBenchCli::State {
  CLI::App* cmd = nullptr;
  std::string model, backend = "cuda", device, ssd_dir = "/tmp/ballast-tier-bench", out;
  int64_t memory_mib = 32768, dram_mib = 8192, slab_mib = 64;
  int history = 2047, runs = 3, chunk_tokens = 256, max_batch_tokens = 4096, io_threads = 0;
  std::string kv_load = "both";  // layerwise | whole | both
  bool layerwise = true;         // the mode being measured
  bool ssd_direct = true;

  std::unique_ptr<NodeManager> serving, peer;
  Metrics metrics;
  std::unique_ptr<NodeService> peer_service;
  std::unique_ptr<grpc::Server> peer_server;
  std::string peer_address;

  absl::StatusOr<std::unique_ptr<NodeManager>> MakeNode(const std::string& id,
                                                        const std::string& ssd) {
    node_manager::NodeOptions n;
    n.node_id = id;
    n.devices = {{device, memory_mib << 20}};
    n.slab_bytes = static_cast<size_t>(slab_mib) << 20;
    n.engine.backend = backend;
    n.engine.max_batch_tokens = max_batch_tokens;
    n.kv_tiers.dram_bytes = dram_mib << 20;
    n.kv_tiers.chunk_tokens = chunk_tokens;
    n.kv_tiers.io_threads = io_threads;
    n.kv_tiers.layerwise_load = layerwise;
    n.kv_tiers.ssd_direct_io = ssd_direct;
    n.kv_tiers.ssd_dir = ssd;
    n.kv_tiers.ssd_bytes = ssd.empty() ? 0 : 64ll << 30;
    auto node = NodeManager::Create(n);
    if (!node.ok()) return node.status();
    auto m = (*node)->LoadModel("m", model, "auto", "");
    if (!m.ok()) return m.status();
    return node;
  }

  absl::Status Start() {
    std::filesystem::remove_all(ssd_dir);
    auto s = MakeNode("serving", (std::filesystem::path(ssd_dir) / "serving").string());
    if (!s.ok()) return s.status();
    serving = std::move(*s);
    auto p = MakeNode("peer", "");
    if (!p.ok()) return p.status();
    peer = std::move(*p);
    peer_service = std::make_unique<NodeService>(peer.get(), &metrics);
    grpc::ServerBuilder b;
    int port = 0;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    b.RegisterService(peer_service.get());
    peer_server = b.BuildAndStart();
    if (!peer_server || port == 0) return absl::InternalError("peer server did not start");
    peer_address = absl::StrCat("127.0.0.1:", port);
    return absl::OkStatus();
  }

  absl::StatusOr<Turn> RunTurn(NodeManager* node, const std::string& session,
                               const std::vector<int>& history, const std::string& prompt,
                               const std::string& kv_peer) {
    v1::NodeGenerateRequest r;
    r.set_request_id(absl::StrCat(session, "-", history.size()));
    r.set_model("m");
    r.set_session_id(session);
    r.set_prompt(prompt);
    r.set_kv_peer(kv_peer);
    for (int t : history) r.add_history_tokens(t);
    r.mutable_sampling()->set_max_tokens(1);
    r.mutable_sampling()->set_ignore_eos(true);
    WaitSink sink;
    auto a = node->Submit(r, &sink);
    if (!a.ok()) return a.status();
    auto done = sink.Wait();
    if (!done.ok()) return done.status();
    return Turn{a->turn_tokens, *done};
  }

  // One measurement: turn 1 leaves the KV where `w` says, then turn 2's TTFT.
  absl::StatusOr<nlohmann::json> Measure(Where w, bool advise, int run) {
    const std::string session = absl::StrCat(Name(w), advise ? "-advised-" : "-", run);
    std::mt19937 rng(static_cast<uint32_t>(std::hash<std::string>()(session)));
    std::vector<int> history(history_len());
    for (int& t : history) t = 1 + static_cast<int>(rng() % 255);  // distinct per session
    NodeManager* first = w == Where::kPeer ? peer.get() : serving.get();
    auto t1 = RunTurn(first, session, history, "a", "");
    if (!t1.ok()) return t1.status();
    std::vector<int> full = history;
    full.insert(full.end(), t1->prompt_tokens.begin(), t1->prompt_tokens.end());
    full.insert(full.end(), t1->result.output_tokens.begin(), t1->result.output_tokens.end());
    auto engine = serving->devices()[0]->Find("m");
    // The engine keeps a session under the node's tenant-scoped key (these
    // turns have no tenant). Dropping the raw id dropped nothing, and every
    // "dram" and "ssd" turn then found its KV still on the device.
    const std::string key = NodeManager::SessionKey("", session);
    if (w != Where::kPeer && engine->CachedSessionTokens(key) == 0) {
      return absl::InternalError("turn 1 left no device copy of the session to place");
    }
    auto drop_device = [&] {
      engine->DropSession(key);
      while (engine->CachedSessionTokens(key) > 0) absl::SleepFor(absl::Milliseconds(1));
    };
    switch (w) {
      case Where::kResident:
      case Where::kPeer:
        break;
      case Where::kDram:
        drop_device();
        break;
      case Where::kSsd:
        serving->kv_tiers()->Flush();
        drop_device();
        serving->kv_tiers()->ShedDram();
        break;
      case Where::kRecompute:
        serving->DropSession(session);  // every copy
        drop_device();
        break;
    }
    const std::string kv_peer = w == Where::kPeer ? peer_address : "";
    nlohmann::json row{
        {"where", Name(w)}, {"advised", advise}, {"run", run}, {"layerwise", layerwise}};
    if (advise) {
      v1::PrefetchKvRequest p;
      p.set_session_id(session);
      p.set_model("m");
      for (int t : full) p.add_tokens(t);
      p.set_kv_peer(kv_peer);
      p.set_ttl_ms(60000);
      const absl::Time t0 = absl::Now();
      auto got = serving->PrefetchKv(p);
      if (!got.ok()) return got.status();
      row["prefetch_ms"] = absl::ToDoubleMilliseconds(absl::Now() - t0);
      row["prefetched_tokens"] = got->tokens;
    }
    auto t2 = RunTurn(serving.get(), session, full, "b", kv_peer);
    if (!t2.ok()) return t2.status();
    row["ttft_ms"] = t2->result.ttft_ms;
    row["fetch_ms"] = t2->result.kv_fetch_ms;
    row["load_ms"] = t2->result.kv_load_ms;
    row["cached_tokens"] = t2->result.cached_tokens;
    row["prompt_tokens"] = t2->result.prompt_tokens;
    row["kv_source"] = static_cast<int>(t2->result.kv_source);
    if (!advise && t2->result.kv_source != Expected(w)) {
      return absl::InternalError(absl::StrCat("turn 2 took its KV from source ",
                                              static_cast<int>(t2->result.kv_source), ", not ",
                                              static_cast<int>(Expected(w)), " (KvSource)"));
    }
    row["kv_bytes"] = engine->kv_bytes_per_token() * t2->result.cached_tokens;
    serving->DropSession(session);
    peer->DropSession(session);
    return row;
  }
  int history_len() const { return history; }

  // Measures every tier in the current mode, appending rows.
  absl::Status MeasureAll(nlohmann::json* rows) {
    if (auto st = Start(); !st.ok()) return st;
    for (int run = -1; run < runs; ++run) {  // run -1 warms up (graphs, allocator)
      for (Where w : kAll) {
        for (bool advise : {false, true}) {
          auto row = Measure(w, advise, run);
          if (!row.ok()) {
            return absl::Status(row.status().code(),
                                absl::StrCat(Name(w), ": ", row.status().message()));
          }
          if (run >= 0) rows->push_back(*row);
        }
      }
    }
    peer_server->Shutdown();
    serving->Shutdown();
    peer->Shutdown();
    peer_server.reset();
    peer_service.reset();
    serving.reset();
    peer.reset();
    return absl::OkStatus();
  }

  int Run() {
    if (device.empty()) device = backend == "cuda" ? "cuda:0" : "cpu:0";
    std::vector<bool> modes;
    if (kv_load == "layerwise" || kv_load == "both") modes.push_back(true);
    if (kv_load == "whole" || kv_load == "both") modes.push_back(false);
    if (modes.empty()) {
      std::cerr << "error: --kv-load is layerwise, whole or both, not \"" << kv_load << "\"\n";
      return 1;
    }
    nlohmann::json rows = nlohmann::json::array();
    for (bool mode : modes) {
      layerwise = mode;
      if (auto st = MeasureAll(&rows); !st.ok()) {
        std::cerr << "error: " << st.message() << "\n";
        return 1;
      }
    }
    Report(rows, modes);
    return 0;
  }

  void Report(const nlohmann::json& rows, const std::vector<bool>& modes) {
    auto median = [&](bool mode, Where w, bool advise, const char* key) {
      std::vector<double> v;
      for (const auto& r : rows) {
        if (r["layerwise"] == mode && r["where"] == Name(w) && r["advised"] == advise &&
            r.contains(key)) {
          v.push_back(r[key].get<double>());
        }
      }
      if (v.empty()) return -1.0;
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    nlohmann::json summary;
    std::cout << absl::StrFormat("history %d tokens, %d runs (medians), backend %s on %s\n",
                                 history, runs, backend, device);
    for (bool mode : modes) {
      const char* name = mode ? "layerwise" : "whole";
      std::cout << "KV load: " << name << "\n"
                << "where      | TTFT ms | (fetch ms | load ms) | advised TTFT ms | prefetch ms\n";
      for (Where w : kAll) {
        const double plain = median(mode, w, false, "ttft_ms"),
                     adv = median(mode, w, true, "ttft_ms"),
                     pre = median(mode, w, true, "prefetch_ms"),
                     fetch = median(mode, w, false, "fetch_ms"),
                     load = median(mode, w, false, "load_ms");
        std::cout << absl::StrFormat("%-10s | %7.2f | (%9.2f | %7.2f) | %15.2f | %11.2f\n", Name(w),
                                     plain, fetch, load, adv, pre);
        summary[name][Name(w)] = {{"ttft_ms", plain},
                                  {"fetch_ms", fetch},
                                  {"load_ms", load},
                                  {"advised_ttft_ms", adv},
                                  {"prefetch_ms", pre}};
      }
    }
    if (modes.size() == 2) {
      // The copy onto the device costs load_ms when it runs alone (whole);
      // the share of it that layer-wise loading takes out of the TTFT.
      std::cout << "share of the copy onto the device hidden behind compute:\n";
      for (Where w : {Where::kDram, Where::kSsd, Where::kPeer}) {
        // TTFT less the tier read (the same work in both modes, and noisy
        // for peers).
        auto on_device = [&](bool mode) {
          return median(mode, w, false, "ttft_ms") - median(mode, w, false, "fetch_ms");
        };
        const double copy = median(false, w, false, "load_ms");
        const double saved = on_device(false) - on_device(true);
        const double share = copy > 0 ? saved / copy : 0;
        std::cout << absl::StrFormat("%-10s | copy %.2f ms | TTFT saved %.2f ms | hidden %.0f%%\n",
                                     Name(w), copy, saved, 100 * share);
        summary["hidden_share"][Name(w)] = share;
      }
    }
    if (!out.empty()) {
      std::ofstream(out) << nlohmann::json{{"history", history}, {"runs", runs},
                                           {"backend", backend}, {"device", device},
                                           {"summary", summary}, {"rows", rows}}
                                .dump(2);
    }
  }
};

TierBenchCli::TierBenchCli(CLI::App* app) : s_(std::make_unique<State>()) {
  auto* c = app->add_subcommand("bench-tiers",
                                "TTFT of a session's next turn with its KV resident, in DRAM, "
                                "on SSD, on a peer or recomputed, with and without Advise");
  s_->cmd = c;
  c->add_option("--model", s_->model, "checkpoint directory")->required();
  c->add_option("--backend", s_->backend, "cuda | cpu")->capture_default_str();
  c->add_option("--device", s_->device, "cuda:N or cpu:0 (default: the backend's first)");
  c->add_option("--memory-mib", s_->memory_mib, "device budget of each of the two nodes")
      ->capture_default_str();
  c->add_option("--dram-mib", s_->dram_mib, "DRAM tier of each node")->capture_default_str();
  c->add_option("--slab-mib", s_->slab_mib, "KV arena slab (configs/gpu.yaml: 64)")
      ->capture_default_str();
  c->add_option("--ssd-dir", s_->ssd_dir, "SSD tier directory (emptied first)")
      ->capture_default_str();
  c->add_option("--history", s_->history, "tokens of the session before the measured turn")
      ->capture_default_str();
  c->add_option("--runs", s_->runs)->capture_default_str();
  c->add_option("--chunk-tokens", s_->chunk_tokens)->capture_default_str();
  c->add_option("--max-batch-tokens", s_->max_batch_tokens, "recompute prefills in one step")
      ->capture_default_str();
  c->add_option("--io-threads", s_->io_threads,
                "tier read/verify threads (0: one per core, up to 16)")
      ->capture_default_str();
  c->add_option("--kv-load", s_->kv_load,
                "layerwise | whole | both: how a lease reaches the device (both: each, and "
                "the share of the copy hidden behind compute)")
      ->capture_default_str();
  c->add_option("--ssd-direct", s_->ssd_direct,
                "SSD reads with io_uring + O_DIRECT (false: pread through the page cache)")
      ->capture_default_str();
  c->add_option("--out", s_->out, "write the JSON result here");
}

TierBenchCli::~TierBenchCli() = default;

bool TierBenchCli::RunParsed(int* rc) {
  if (!s_->cmd->parsed()) return false;
  *rc = s_->Run();
  return true;
}

}  // namespace ballast::server
