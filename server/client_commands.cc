#include "server/client_commands.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <iostream>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "ballast/v1/admin.grpc.pb.h"
#include "ballast/v1/inference.grpc.pb.h"
#include "bench/replay.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "proto/model_state.h"
#include "proto/token_events.h"
#include "server/auth.h"
#include "server/http_probe.h"
#include "server/status_util.h"
#include "server/tls.h"

namespace ballast::server {

std::shared_ptr<grpc::ChannelCredentials> ClientCredentials() {
  auto creds = ClientCredentialsFromEnv();
  if (!creds.ok()) {
    std::cerr << "error: " << creds.status().message() << "\n";
    std::exit(2);
  }
  return *creds;
}

void AddApiKey(grpc::ClientContext* ctx) {
  const char* key = std::getenv("BALLAST_API_KEY");
  if (key != nullptr && *key != '\0')
    ctx->AddMetadata(kAuthorizationKey, absl::StrCat("Bearer ", key));
}

namespace {

std::shared_ptr<grpc::Channel> Connect(const std::string& target) {
  return grpc::CreateChannel(target, ClientCredentials());
}

int PrintError(const grpc::Status& st) {
  std::cerr << "error: " << CodeName(st.error_code()) << ": " << st.error_message() << "\n";
  return st.error_code() == grpc::StatusCode::UNAVAILABLE ? 3 : 2;
}

std::string Mib(int64_t bytes) { return absl::StrFormat("%.1f MiB", bytes / 1048576.0); }

}  // namespace

grpc::Status StreamGenerate(v1::Inference::StubInterface* stub, const v1::GenerateRequest& req,
                            std::ostream& out, std::optional<v1::Final>* final) {
  grpc::ClientContext ctx;
  AddApiKey(&ctx);
  v1::GenerateRequest batched = req;
  batched.set_token_batches(true);
  auto reader = stub->Generate(&ctx, batched);
  v1::GenerateResponse resp;
  while (reader->Read(&resp)) {
    if (ForEachToken(resp, [&](const v1::Token& t) { out << t.text(); }) > 0) {
      out << std::flush;
    } else if (resp.has_final()) {
      *final = resp.final();
    }
  }
  return reader->Finish();
}

int RunGenerate(const GenerateFlags& f) {
  auto stub = v1::Inference::NewStub(Connect(f.target));
  v1::GenerateRequest req;
  req.set_model(f.model);
  req.set_prompt(f.prompt);
  req.set_session_id(f.session);
  auto* s = req.mutable_sampling();
  s->set_max_tokens(f.max_tokens);
  s->set_temperature(f.temperature);
  s->set_top_p(f.top_p);
  s->set_top_k(f.top_k);
  if (f.seed) s->set_seed(*f.seed);
  for (const auto& x : f.stop) s->add_stop(x);
  s->set_ignore_eos(f.ignore_eos);
  req.mutable_slo()->set_ttft_ms(f.ttft_ms);
  req.mutable_slo()->set_tpot_ms(f.tpot_ms);
  req.set_priority(f.priority);
  std::optional<v1::Final> final;
  const grpc::Status st = StreamGenerate(stub.get(), req, std::cout, &final);
  std::cout << "\n";
  if (!st.ok()) return PrintError(st);
  if (f.stats && final) {
    const auto& t = final->timings();
    std::cerr << absl::StrFormat(
        "[%s on %s/%s] prompt %d tokens (%d cached, kv %s), %d generated, finish %s; "
        "queue %.1f ms, ttft %.1f ms, tpot %.2f ms, total %.1f ms\n",
        f.model, final->node_id(), final->device(), final->usage().prompt_tokens(),
        final->usage().cached_prompt_tokens(), bench::KvSourceName(final->kv_source()),
        final->usage().completion_tokens(), v1::FinishReason_Name(final->finish_reason()),
        t.queue_ms(), t.ttft_ms(), t.mean_tpot_ms(), t.e2e_ms());
  }
  return 0;
}

int RunModels(const std::string& target) {
  auto stub = v1::Inference::NewStub(Connect(target));
  grpc::ClientContext ctx;
  AddApiKey(&ctx);
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::ListModelsResponse resp;
  grpc::Status st = stub->ListModels(&ctx, v1::ListModelsRequest(), &resp);
  if (!st.ok()) return PrintError(st);
  std::cout << absl::StrFormat("%-20s %-18s %8s %10s %-8s %-5s %s\n", "MODEL", "ARCHITECTURE",
                               "CONTEXT", "WEIGHTS", "KV", "QUANT", "RESIDENT ON");
  for (const auto& m : resp.models()) {
    std::string where;
    for (const auto& r : m.replicas()) {
      if (!where.empty()) where += ", ";
      const std::string state(ModelStateLabel(r.state()));
      where += r.node_id().empty() ? absl::StrCat(state, ": ", r.error())
                                   : absl::StrCat(r.node_id(), "/", r.device(), " ", state);
    }
    if (where.empty()) where = "(not resident)";
    std::cout << absl::StrFormat("%-20s %-18s %8d %10s %-8s %-5s %s\n", m.name(), m.architecture(),
                                 m.context_window(), Mib(m.weight_bytes()), m.kv_dtype(),
                                 m.quantization(), where);
  }
  return 0;
}

int RunCluster(const std::string& target) {
  auto stub = v1::Admin::NewStub(Connect(target));
  grpc::ClientContext ctx;
  AddApiKey(&ctx);
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::ClusterState state;
  grpc::Status st = stub->GetClusterState(&ctx, v1::GetClusterStateRequest(), &state);
  if (!st.ok()) return PrintError(st);
  for (const auto& n : state.nodes()) {
    std::cout << absl::StrFormat("node %s at %s: %s%s (heartbeat %.1fs ago), %d in flight\n",
                                 n.node_id(), n.address(), n.alive() ? "alive" : "DEAD",
                                 n.draining() ? ", DRAINING" : "", n.last_heartbeat_age_s(),
                                 n.inflight_requests());
    for (const auto& d : n.devices()) {
      std::string models;
      for (const auto& m : d.resident_models()) models += (models.empty() ? "" : ", ") + m;
      // KV in bytes: block counts miss an elastic arena's unformatted room.
      const std::string lendable =
          d.kv_bytes_lendable() > 0 ? absl::StrCat(" + ", Mib(d.kv_bytes_lendable()), " lendable")
                                    : std::string();
      std::cout << absl::StrFormat(
          "  %s: memory %s / %s, KV %s used / %s free%s, queue %d, running %d, models [%s]\n",
          d.name(), Mib(d.memory_used_bytes()), Mib(d.memory_total_bytes()), Mib(d.kv_bytes_used()),
          Mib(d.kv_bytes_free()), lendable, d.queue_length(), d.running(), models);
    }
  }
  std::cout << state.sessions() << " session(s)\n";
  return 0;
}

namespace {
// The models the scheduler still places on `node` (replicas in any state:
// loading, ready, draining), empty if none. The scheduler's replica lists,
// not the devices' heartbeat reports, which lag a load by up to a second.
absl::StatusOr<std::vector<std::string>> ModelsOn(v1::Admin::Stub* stub, const std::string& node) {
  grpc::ClientContext ctx;
  AddApiKey(&ctx);
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::ClusterState state;
  grpc::Status st = stub->GetClusterState(&ctx, v1::GetClusterStateRequest(), &state);
  if (!st.ok())
    return absl::Status(static_cast<absl::StatusCode>(st.error_code()), st.error_message());
  std::vector<std::string> out;
  for (const auto& m : state.models())
    for (const auto& r : m.replicas())
      if (r.node_id() == node) out.push_back(m.name());
  return out;
}
}  // namespace

int RunDrain(const std::string& target, const std::string& node, bool undo, int wait_s) {
  auto stub = v1::Admin::NewStub(Connect(target));
  grpc::ClientContext ctx;
  AddApiKey(&ctx);
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::DrainNodeRequest req;
  req.set_node_id(node);
  req.set_undo(undo);
  v1::DrainNodeResponse resp;
  grpc::Status st = stub->DrainNode(&ctx, req, &resp);
  if (!st.ok()) return PrintError(st);
  if (undo) {
    std::cout << "node " << node << ": drain lifted\n";
    return 0;
  }
  std::cout << "node " << node << " draining: moving [" << absl::StrJoin(resp.moving(), ", ")
            << "], no room yet for [" << absl::StrJoin(resp.stuck(), ", ") << "]\n";
  const absl::Time end = absl::Now() + absl::Seconds(wait_s);
  while (wait_s > 0) {
    auto left = ModelsOn(stub.get(), node);
    if (!left.ok()) return PrintError(ToGrpc(left.status()));
    if (left->empty()) {
      std::cout << "node " << node << " holds no models\n";
      return 0;
    }
    if (absl::Now() >= end) {
      std::cerr << "error: after " << wait_s << " s node " << node << " still holds ["
                << absl::StrJoin(*left, ", ") << "]\n";
      return 1;
    }
    absl::SleepFor(absl::Milliseconds(500));
  }
  return 0;
}

int RunHealth(const std::string& target, const std::string& service) {
  auto stub = grpc::health::v1::Health::NewStub(Connect(target));
  grpc::ClientContext ctx;
  AddApiKey(&ctx);
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(3));
  grpc::health::v1::HealthCheckRequest req;
  req.set_service(service);
  grpc::health::v1::HealthCheckResponse resp;
  grpc::Status st = stub->Check(&ctx, req, &resp);
  if (!st.ok()) return PrintError(st);
  std::cout << grpc::health::v1::HealthCheckResponse::ServingStatus_Name(resp.status()) << "\n";
  return resp.status() == grpc::health::v1::HealthCheckResponse::SERVING ? 0 : 1;
}

int RunMetricsHealth(const std::string& url) {
  const absl::Status st = ProbeHttp(url, absl::Seconds(3));  // as RunHealth's deadline
  if (st.ok()) {
    std::cout << "OK: " << url << " answered 200\n";
    return 0;
  }
  std::cerr << "error: " << st.message() << "\n";
  if (absl::IsInvalidArgument(st)) return 2;
  return absl::IsFailedPrecondition(st) ? 1 : 3;
}

namespace {

// One model's stream in the demo: its text so far, state and summary.
struct DemoLine {
  std::string model, text, status = "waiting", summary;
};

// The demo's screen, shared by the streams' threads: a line per model,
// redrawn in place on a terminal.
struct DemoScreen {
  std::mutex mu;  // guards lines and failures while the streams run
  std::vector<DemoLine> lines;
  int failures = 0;
  bool tty = false;
  // Draws every line: on a terminal at each call, over the last drawing;
  // otherwise once, at the final draw. With streams running, mu held.
  void Draw(bool final_draw);
};

// `s` with control characters as spaces.
std::string Printable(const std::string& s) {
  std::string out;
  for (unsigned char c : s) out += (c < 32 || c == 127) ? ' ' : static_cast<char>(c);
  return out;
}

void DemoScreen::Draw(bool final_draw) {
  if (!tty && !final_draw) return;
  if (tty) std::cout << "\033[" << lines.size() << "A";  // back to the first line
  for (const auto& l : lines) {
    std::string t = Printable(l.text);
    if (t.size() > 60) t = "…" + t.substr(t.size() - 59);
    std::cout << (tty ? "\033[2K" : "")
              << absl::StrFormat("%-14s %-9s | %s\n", l.model, l.status, t);
  }
  std::cout << std::flush;
}

// Streams `prompt` from line `i`'s model into that line (a thread of the
// demo), then its summary or its failure.
void StreamDemoLine(v1::Inference::Stub* inference, const std::string& prompt, int max_tokens,
                    int i, DemoScreen* screen) {
  DemoLine& line = screen->lines[i];
  v1::GenerateRequest req;
  req.set_model(line.model);
  req.set_prompt(prompt);
  req.mutable_sampling()->set_max_tokens(max_tokens);
  req.mutable_sampling()->set_ignore_eos(true);
  req.set_token_batches(true);
  grpc::ClientContext ctx;
  AddApiKey(&ctx);
  auto reader = inference->Generate(&ctx, req);
  v1::GenerateResponse resp;
  while (reader->Read(&resp)) {
    std::lock_guard<std::mutex> lock(screen->mu);
    if (ForEachToken(resp, [&](const v1::Token& t) { line.text += t.text(); }) > 0) {
      line.status = "streaming";
    } else if (resp.has_final()) {
      const auto& f = resp.final();
      const double secs = f.timings().e2e_ms() / 1000.0;
      line.summary = absl::StrFormat("%d tokens on %s/%s, ttft %.0f ms, %.1f tokens/s",
                                     f.usage().completion_tokens(), f.node_id(), f.device(),
                                     f.timings().ttft_ms(),
                                     secs > 0 ? f.usage().completion_tokens() / secs : 0.0);
    }
    screen->Draw(false);
  }
  grpc::Status st = reader->Finish();
  std::lock_guard<std::mutex> lock(screen->mu);
  line.status = st.ok() ? "done" : "FAILED";
  if (!st.ok()) {
    line.summary = absl::StrCat(CodeName(st.error_code()), ": ", st.error_message());
    ++screen->failures;
  }
  screen->Draw(false);
}

}  // namespace

int RunDemo(const std::string& target, const std::string& prompt, int max_tokens) {
  auto channel = Connect(target);
  auto inference = v1::Inference::NewStub(channel);
  v1::ListModelsResponse models;
  {
    grpc::ClientContext ctx;
    AddApiKey(&ctx);
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    grpc::Status st = inference->ListModels(&ctx, v1::ListModelsRequest(), &models);
    if (!st.ok()) return PrintError(st);
  }
  const int n = models.models_size();
  if (n == 0) {
    std::cerr << "error: the server has no models\n";
    return 2;
  }
  DemoScreen screen;
  screen.lines.resize(n);
  screen.tty = isatty(STDOUT_FILENO);
  std::cout << "prompt: \"" << prompt << "\" — one concurrent stream per model\n";
  if (screen.tty) std::cout << std::string(n, '\n');
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    screen.lines[i].model = models.models(i).name();
    threads.emplace_back(
        [&, i] { StreamDemoLine(inference.get(), prompt, max_tokens, i, &screen); });
  }
  for (auto& t : threads) t.join();
  if (!screen.tty) screen.Draw(true);
  for (const auto& l : screen.lines) {
    std::cout << absl::StrFormat("%-14s %s\n", l.model, l.summary);
  }
  return screen.failures == 0 ? 0 : 2;
}

}  // namespace ballast::server
