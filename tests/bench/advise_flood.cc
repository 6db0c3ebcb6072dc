// Quota isolation benchmark (issue 19, item 3): one tenant floods Advise at
// RATE calls/s while another tenant's Generate requests measure their TTFT;
// the same probes run first without the flood. The scheduler should refuse
// the flood cheaply (scheduler.quotas advisories_per_s) so the other
// tenant's TTFT barely moves. A benchmark, not a test: results go to
// docs/benchmarks.md.
//
// Usage: advise_flood ADDRESS MODEL RATE PROBES [TOKENS]
// The flood is open loop (gRPC's callback client, at most 4,096 calls
// outstanding: beyond that it counts the calls it could not send).
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "ballast/v1/inference.grpc.pb.h"

namespace {

using namespace ballast;

struct Flood {
  std::atomic<int64_t> sent{0}, skipped{0}, outstanding{0};
  absl::Mutex mu;
  std::map<int, int64_t> codes ABSL_GUARDED_BY(mu);
};

struct Call {
  grpc::ClientContext ctx;
  v1::AdviseRequest req;
  v1::AdviseResponse resp;
};

void RunFlood(v1::Inference::Stub* stub, const std::string& model, double rate, Flood* f,
              absl::Notification* stop) {
  const absl::Time start = absl::Now();
  int64_t n = 0;
  while (!stop->HasBeenNotified()) {
    const absl::Time due = start + absl::Seconds(static_cast<double>(n) / rate);
    const absl::Time now = absl::Now();
    if (due > now) absl::SleepFor(std::min(due - now, absl::Milliseconds(1)));
    if (absl::Now() < due) continue;
    ++n;
    if (f->outstanding.load() >= 4096) {
      f->skipped.fetch_add(1);
      continue;
    }
    auto* c = new Call;
    c->req.set_session_id("flood-session");
    c->req.set_model(model);
    c->req.set_tenant("flooder");
    f->outstanding.fetch_add(1);
    f->sent.fetch_add(1);
    stub->async()->Advise(&c->ctx, &c->req, &c->resp, [c, f](grpc::Status st) {
      {
        absl::MutexLock lock(&f->mu);
        ++f->codes[st.error_code()];
      }
      f->outstanding.fetch_sub(1);
      delete c;
    });
  }
}

// TTFT (ms) of one Generate of tenant "victim".
double Probe(v1::Inference::Stub* stub, const std::string& model, int tokens, int i) {
  v1::GenerateRequest req;
  req.set_model(model);
  req.set_prompt("Probe request number " + std::to_string(i) + " asks for a few tokens.");
  req.set_tenant("victim");
  req.mutable_sampling()->set_max_tokens(tokens);
  req.mutable_sampling()->set_ignore_eos(true);
  grpc::ClientContext ctx;
  const absl::Time t0 = absl::Now();
  auto reader = stub->Generate(&ctx, req);
  v1::GenerateResponse resp;
  double ttft = -1;
  while (reader->Read(&resp)) {
    if (ttft < 0 && resp.has_token()) ttft = absl::ToDoubleMilliseconds(absl::Now() - t0);
  }
  if (!reader->Finish().ok()) return -1;
  return ttft;
}

void Report(const char* what, std::vector<double> v) {
  std::sort(v.begin(), v.end());
  if (v.empty()) return;
  double sum = 0;
  for (double x : v) sum += x;
  std::printf("%s: %zu probes, TTFT mean %.2f ms, p50 %.2f, p90 %.2f, max %.2f\n", what, v.size(),
              sum / static_cast<double>(v.size()), v[v.size() / 2], v[v.size() * 9 / 10], v.back());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: advise_flood ADDRESS MODEL RATE PROBES [TOKENS]\n");
    return 2;
  }
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // lines survive a timeout
  const std::string model = argv[2];
  const double rate = std::atof(argv[3]);
  const int probes = std::atoi(argv[4]);
  const int tokens = argc > 5 ? std::atoi(argv[5]) : 8;
  auto channel = grpc::CreateChannel(argv[1], grpc::InsecureChannelCredentials());
  auto stub = v1::Inference::NewStub(channel);
  // A separate connection for the flood, as a separate client would have.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  auto flood_stub = v1::Inference::NewStub(
      grpc::CreateCustomChannel(argv[1], grpc::InsecureChannelCredentials(), args));

  for (int i = 0; i < 5; ++i) Probe(stub.get(), model, tokens, -1 - i);  // warm up
  {  // the flooder's session, so that its admitted advisories do real work
    v1::GenerateRequest req;
    req.set_model(model);
    req.set_prompt("The flooding tenant's conversation so far.");
    req.set_tenant("flooder");
    req.set_session_id("flood-session");
    req.mutable_sampling()->set_max_tokens(4);
    grpc::ClientContext ctx;
    auto reader = stub->Generate(&ctx, req);
    v1::GenerateResponse resp;
    while (reader->Read(&resp)) {
    }
    if (grpc::Status st = reader->Finish(); !st.ok()) {
      std::fprintf(stderr, "the flooder's session failed: %s\n", st.error_message().c_str());
      return 1;
    }
  }
  std::vector<double> quiet, flooded;
  for (int i = 0; i < probes; ++i) quiet.push_back(Probe(stub.get(), model, tokens, i));
  Report("without flood", quiet);

  Flood f;
  absl::Notification stop;
  std::thread flood([&] { RunFlood(flood_stub.get(), model, rate, &f, &stop); });
  absl::SleepFor(absl::Seconds(1));  // the flood at full rate first
  const absl::Time t0 = absl::Now();
  const int64_t sent0 = f.sent.load();
  for (int i = 0; i < probes; ++i) flooded.push_back(Probe(stub.get(), model, tokens, probes + i));
  const double secs = absl::ToDoubleSeconds(absl::Now() - t0);
  const int64_t sent = f.sent.load() - sent0;
  stop.Notify();
  flood.join();
  while (f.outstanding.load() > 0) absl::SleepFor(absl::Milliseconds(10));
  Report("with flood", flooded);
  std::printf(
      "flood: %.0f Advise calls/s sent during the probes (target %.0f), %lld not sent "
      "(4,096 outstanding)\n",
      static_cast<double>(sent) / secs, rate, static_cast<long long>(f.skipped.load()));
  absl::MutexLock lock(&f.mu);
  for (const auto& [code, n] : f.codes) {
    std::printf("  flood status %d: %lld\n", code, static_cast<long long>(n));
  }
  return 0;
}
