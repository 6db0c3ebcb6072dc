// Overload benchmark (issue 15): N concurrent Generate streams against a
// running scheduler, opened at once with gRPC's callback client (the
// client takes no thread per stream, so it is not what limits the
// measurement). Prints the token throughput, the statuses, and the peak
// thread count of the server process when its pid is given. A benchmark,
// not a test: results go to docs/benchmarks.md.
//
// Also each stream's TTFT and every gap between tokens (TBT), p50 and p99.
//
// Usage: stream_storm ADDRESS MODEL STREAMS TOKENS [SERVER_PID]
// Env: STORM_CHANNELS (connections the streams are spread over, default 1),
//      STORM_PROMPT_CHARS (prompt length in characters, padded with text;
//      default: a short prompt), STORM_TOKEN_BATCHES (1: the streams ask
//      for token batches, GenerateRequest.token_batches; the tokens per
//      message are printed).
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "ballast/v1/inference.grpc.pb.h"

namespace {

using namespace ballast;

int Threads(const std::string& pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("Threads:", 0) == 0) return std::atoi(line.c_str() + 8);
  }
  return -1;
}

class Stream final : public grpc::ClientReadReactor<v1::GenerateResponse> {
 public:
  Stream(v1::Inference::Stub* stub, v1::GenerateRequest req) : req_(std::move(req)) {
    ctx_.set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(10));
    stub->async()->Generate(&ctx_, &req_, this);
    StartRead(&resp_);
    StartCall();
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;
    // A batch's tokens arrive together: the gaps between them are 0.
    const int got = resp_.has_token() ? 1 : resp_.tokens().tokens_size();
    const absl::Time now = absl::Now();
    for (int i = 0; i < got; ++i) {
      if (++tokens == 1) {
        first = now;
      } else {
        gaps_ms.push_back(absl::ToDoubleMilliseconds(now - last));
      }
      last = now;
    }
    messages += got > 0;
    StartRead(&resp_);
  }
  void OnDone(const grpc::Status& s) override {
    code = s.error_code();
    end = absl::Now();
    done.Notify();
  }
  const absl::Time start = absl::Now();
  int tokens = 0, messages = 0;  // messages that carried tokens
  absl::Time first, last;        // first and last token's arrival
  std::vector<double> gaps_ms;   // between consecutive tokens
  grpc::StatusCode code = grpc::StatusCode::UNKNOWN;
  absl::Time end;
  absl::Notification done;

 private:
  grpc::ClientContext ctx_;
  v1::GenerateRequest req_;
  v1::GenerateResponse resp_;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s ADDRESS MODEL STREAMS TOKENS [SERVER_PID]\n", argv[0]);
    return 2;
  }
  const std::string pid = argc > 5 ? argv[5] : "";
  const int n = std::atoi(argv[3]), max_tokens = std::atoi(argv[4]);
  // STORM_CHANNELS=K: the streams spread over K connections (default 1), as
  // K clients' would be.
  const char* k_env = std::getenv("STORM_CHANNELS");
  const int k = std::max(1, k_env ? std::atoi(k_env) : 1);
  const char* chars_env = std::getenv("STORM_PROMPT_CHARS");
  const int prompt_chars = chars_env ? std::atoi(chars_env) : 0;
  const char* batches_env = std::getenv("STORM_TOKEN_BATCHES");
  const bool token_batches = batches_env != nullptr && std::atoi(batches_env) != 0;
  std::vector<std::unique_ptr<v1::Inference::Stub>> stubs;
  for (int i = 0; i < k; ++i) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // its own connection
    stubs.push_back(v1::Inference::NewStub(
        grpc::CreateCustomChannel(argv[1], grpc::InsecureChannelCredentials(), args)));
  }
  const int threads_before = pid.empty() ? -1 : Threads(pid);
  const absl::Time t0 = absl::Now();
  std::vector<std::unique_ptr<Stream>> streams;
  for (int i = 0; i < n; ++i) {
    v1::GenerateRequest req;
    req.set_model(argv[2]);
    std::string prompt = absl::StrCat("request ", i, " of the storm");
    while (static_cast<int>(prompt.size()) < prompt_chars) prompt += " and the storm goes on";
    if (prompt_chars > 0) prompt.resize(static_cast<size_t>(prompt_chars));
    req.set_prompt(prompt);
    req.mutable_sampling()->set_max_tokens(max_tokens);
    req.mutable_sampling()->set_ignore_eos(true);
    req.set_token_batches(token_batches);
    streams.push_back(std::make_unique<Stream>(stubs[i % k].get(), std::move(req)));
  }
  int peak = threads_before;
  for (auto& s : streams) {
    while (!s->done.WaitForNotificationWithTimeout(absl::Milliseconds(50))) {
      if (!pid.empty()) peak = std::max(peak, Threads(pid));
    }
  }
  absl::Time last = t0;
  int64_t tokens = 0;
  std::map<std::string, int> codes;
  for (auto& s : streams) {
    tokens += s->tokens;
    last = std::max(last, s->end);
    ++codes[std::to_string(static_cast<int>(s->code))];
  }
  const double secs = absl::ToDoubleSeconds(last - t0);
  // Each stream's mean time between tokens as the client sees it (TPOT).
  std::vector<double> tpot_ms;
  for (auto& s : streams) {
    if (s->tokens > 1)
      tpot_ms.push_back(absl::ToDoubleMilliseconds(s->last - s->first) / (s->tokens - 1));
  }
  std::sort(tpot_ms.begin(), tpot_ms.end());
  std::printf("streams %d, tokens %lld in %.2f s: %.1f tokens/s; status codes:", n,
              static_cast<long long>(tokens), secs, tokens / secs);
  for (const auto& [c, k] : codes) std::printf(" %s=%d", c.c_str(), k);
  if (!tpot_ms.empty()) std::printf("; TPOT p50 %.3f ms", tpot_ms[tpot_ms.size() / 2]);
  std::vector<double> ttft_ms, gaps_ms;
  for (auto& s : streams) {
    if (s->tokens > 0) ttft_ms.push_back(absl::ToDoubleMilliseconds(s->first - s->start));
    gaps_ms.insert(gaps_ms.end(), s->gaps_ms.begin(), s->gaps_ms.end());
  }
  auto pct = [](std::vector<double>* v, double q) {
    std::sort(v->begin(), v->end());
    return (*v)[std::min(v->size() - 1, static_cast<size_t>(q * static_cast<double>(v->size())))];
  };
  if (!ttft_ms.empty()) {
    std::printf("; TTFT p50 %.3f p99 %.3f ms", pct(&ttft_ms, 0.5), pct(&ttft_ms, 0.99));
  }
  if (!gaps_ms.empty()) {
    std::printf("; TBT p50 %.3f p99 %.3f ms", pct(&gaps_ms, 0.5), pct(&gaps_ms, 0.99));
  }
  if (token_batches) {
    int64_t messages = 0;
    for (auto& s : streams) messages += s->messages;
    std::printf("; %.2f tokens per message",
                messages > 0 ? static_cast<double>(tokens) / messages : 0);
  }
  if (!pid.empty()) std::printf("; server threads %d -> peak %d", threads_before, peak);
  std::printf("\n");
  return 0;
}
