// Client subcommands that talk to a running scheduler over the public API:
// `generate` (streams one reply to stdout), `models` (catalogue and where
// each model is resident), `cluster` (nodes and devices) and `demo` (one
// concurrent stream per model, drawn side by side).
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "ballast/v1/inference.grpc.pb.h"

namespace ballast::server {

struct GenerateFlags {
  std::string target = "127.0.0.1:50051";
  std::string model;
  std::string prompt;
  std::string session;
  int max_tokens = 64;
  float temperature = 0.0f;
  float top_p = 1.0f;
  int top_k = 0;
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;
  bool ignore_eos = false;
  uint32_t ttft_ms = 0, tpot_ms = 0;
  int priority = 0;
  bool stats = false;  // print usage and timings to stderr
};

// Calls Inference.Generate with `req` on `stub`, writing each
// token's text to `out` as it arrives; *final gets the Final message.
// Returns the call's status.
grpc::Status StreamGenerate(v1::Inference::StubInterface* stub, const v1::GenerateRequest& req,
                            std::ostream& out, std::optional<v1::Final>* final);

int RunGenerate(const GenerateFlags& f);
// Credentials of the command-line clients (server/tls.h's
// BALLAST_TLS_CA, BALLAST_TLS_CERT, BALLAST_TLS_KEY); prints the error and
// exits with status 2 if a named file cannot be read.
std::shared_ptr<grpc::ChannelCredentials> ClientCredentials();

// Adds BALLAST_API_KEY, when set, as the call's bearer token (server/auth.h).
void AddApiKey(grpc::ClientContext* ctx);

int RunModels(const std::string& target);
// Admin.DrainNode; with `wait_s` > 0, waits until the node holds no models
// (exit 1 if it still does then).
int RunDrain(const std::string& target, const std::string& node, bool undo, int wait_s);
int RunCluster(const std::string& target);
// grpc.health.v1 Check; exit 0 when SERVING (for probes and scripts).
int RunHealth(const std::string& target, const std::string& service);
// `health --metrics-url`: an HTTP GET of the metrics endpoint (HttpProbe,
// server/http_probe.h), a liveness check that needs no gRPC port (a
// standby scheduler's are closed). Exit 0 on 200, 1 on another status, 2
// for a bad URL, 3 when nothing answers (refused, unresolved, timed out).
int RunMetricsHealth(const std::string& url);
int RunDemo(const std::string& target, const std::string& prompt, int max_tokens);

}  // namespace ballast::server
