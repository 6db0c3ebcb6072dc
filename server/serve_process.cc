#include "server/serve_process.h"

#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <iostream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "ballast/v1/inference.grpc.pb.h"
#include "server/client_commands.h"
#include "server/config.h"
#include "server/ports.h"

namespace ballast::server {
namespace {

// The `ballast serve` child of a running comparison, for the signal handler.
std::atomic<pid_t> g_serve_pid{-1};

// SIGINT/SIGTERM during a comparison: stop the child, then die of the signal.
void ForwardAndDie(int sig) {
  const pid_t pid = g_serve_pid.load();
  if (pid > 0) kill(pid, SIGTERM);
  signal(sig, SIG_DFL);
  raise(sig);
}

std::chrono::system_clock::time_point DeadlineIn(absl::Duration d) {
  return std::chrono::system_clock::now() + absl::ToChronoMilliseconds(d);
}

}  // namespace

void ForwardStopSignals() {
  signal(SIGINT, ForwardAndDie);
  signal(SIGTERM, ForwardAndDie);
}

void RestoreStopSignals() {
  signal(SIGINT, SIG_DFL);
  signal(SIGTERM, SIG_DFL);
}

absl::Status ServeProcess::Start(const std::string& config, const std::string& log,
                                 const ServeStartOptions& options, std::string* target) {
  auto cfg = LoadConfig(config);
  if (!cfg.ok()) return cfg.status();
  const size_t models = cfg->serve.models.size() + cfg->scheduler.options.models.size();
  config_ = config;
  log_ = log;
  // A free loopback port for the scheduler; the node takes any.
  *target = absl::StrCat("127.0.0.1:", FreeLoopbackPort());
  // Exec this very binary through an fd opened now: a rebuild that replaces
  // the file mid-comparison must not change (or break) what runs.
  static const int self_fd = open("/proc/self/exe", O_RDONLY);
  if (self_fd < 0) return absl::InternalError("cannot open /proc/self/exe");
  std::vector<std::string> argv = {"ballast",       "serve",      "--config",         config,
                                   "--listen",      *target,      "--metrics-listen", "",
                                   "--node-listen", "127.0.0.1:0"};
  const pid_t parent = getpid();
  pid_ = fork();
  if (pid_ == 0) {
    // Die with the comparison, even if it is killed outright (SIGKILL).
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(1);
    int out = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(out, 1);
    dup2(out, 2);
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    fexecve(self_fd, args.data(), environ);
    _exit(127);
  }
  g_serve_pid = pid_;
  if (auto st = WaitSettled(*target, models, options.settle_timeout); !st.ok()) return st;
  if (options.warm_models.empty()) return absl::OkStatus();
  if (auto st = Warm(*target, options.warm_models); !st.ok()) return st;
  return WaitSettled(*target, models, options.settle_timeout);
}

absl::Status ServeProcess::WaitSettled(const std::string& target, size_t models,
                                       absl::Duration timeout) {
  auto stub = v1::Inference::NewStub(grpc::CreateChannel(target, ClientCredentials()));
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      g_serve_pid = -1;
      const std::string how = WIFSIGNALED(status)
                                  ? absl::StrCat("was killed by signal ", WTERMSIG(status))
                                  : absl::StrCat("exited with status ", WEXITSTATUS(status));
      return absl::InternalError(
          absl::StrCat("ballast serve --config ", config_, " ", how, "; see ", log_));
    }
    grpc::ClientContext ctx;
    AddApiKey(&ctx);
    ctx.set_deadline(DeadlineIn(absl::Seconds(1)));
    v1::ListModelsResponse list;
    if (stub->ListModels(&ctx, v1::ListModelsRequest(), &list).ok()) {
      size_t settled = 0;
      bool loading = false;
      for (const auto& m : list.models()) {
        if (m.state() == v1::MODEL_STATE_FAILED) {
          return absl::FailedPreconditionError(
              absl::StrCat("ballast serve --config ", config_, ": model ", m.name(),
                           " failed to load: ", m.last_error(), " (see ", log_, ")"));
        }
        bool ready = false;
        for (const auto& r : m.replicas()) {
          ready |= r.state() == v1::MODEL_STATE_READY;
          loading |= r.state() == v1::MODEL_STATE_LOADING;
        }
        loading |= m.state() == v1::MODEL_STATE_LOADING;
        settled += ready || m.state() == v1::MODEL_STATE_EVICTED;
      }
      if (models > 0 && settled >= models && !loading) return absl::OkStatus();
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  return absl::DeadlineExceededError(absl::StrCat(
      "ballast serve --config ", config_, " did not settle in ", absl::FormatDuration(timeout),
      " (weights load from disk at first); see ", log_));
}

absl::Status ServeProcess::Warm(const std::string& target, const std::vector<std::string>& models) {
  auto channel = grpc::CreateChannel(target, ClientCredentials());
  std::vector<absl::Status> results(models.size());
  std::vector<std::thread> threads;  // a handful, once per run: not the serving path
  const absl::Time t0 = absl::Now();
  for (size_t i = 0; i < models.size(); ++i) {
    threads.emplace_back([&, i] {
      auto stub = v1::Inference::NewStub(channel);
      grpc::ClientContext ctx;
      AddApiKey(&ctx);
      ctx.set_deadline(DeadlineIn(absl::Seconds(120)));
      v1::GenerateRequest req;
      req.set_model(models[i]);
      req.set_prompt("Warm-up.");
      req.mutable_sampling()->set_max_tokens(1);
      auto reader = stub->Generate(&ctx, req);
      v1::GenerateResponse resp;
      while (reader->Read(&resp)) {
      }
      const grpc::Status st = reader->Finish();
      if (!st.ok()) {
        results[i] = absl::UnavailableError(
            absl::StrCat("warm-up request to model ", models[i], " failed: ", st.error_message()));
      }
    });
  }
  for (auto& t : threads) t.join();
  // Best effort: a model that could not be warmed (no room, no such model)
  // is measured cold, as the trace then asks for it; the run goes on.
  size_t warmed = 0;
  for (const auto& st : results) {
    if (st.ok()) {
      ++warmed;
    } else {
      std::cerr << "warning: " << st.message() << "\n";
    }
  }
  std::cout << absl::StrFormat("warmed %d of %d models in %.1f s", warmed, models.size(),
                               absl::ToDoubleSeconds(absl::Now() - t0))
            << std::endl;
  return absl::OkStatus();
}

void ServeProcess::Stop() {
  if (pid_ <= 0) return;
  kill(pid_, SIGTERM);
  int status = 0;
  waitpid(pid_, &status, 0);
  g_serve_pid = -1;
  pid_ = -1;
}

}  // namespace ballast::server
