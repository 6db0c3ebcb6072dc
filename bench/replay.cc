#include "bench/replay.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <queue>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "ballast/v1/inference.grpc.pb.h"
#include "proto/token_events.h"

namespace ballast::bench {
namespace {

using Clock = std::chrono::steady_clock;

std::string CodeName(grpc::StatusCode c) {
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(c));
}

class Runner {
 public:
  Runner(const std::vector<TraceRecord>& trace, const ReplayOptions& o)
      : trace_(trace), o_(o), state_(trace.size(), State::kExcluded), children_(trace.size()) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(64 << 20);
    channel_ = grpc::CreateCustomChannel(
        o.target, o.credentials ? o.credentials : grpc::InsecureChannelCredentials(), args);
    stub_ = v1::Inference::NewStub(channel_);
  }

  absl::StatusOr<ReplayResult> Run() {
    ReplayResult res;
    res.rate_scale = o_.rate_scale;
    {
      v1::ListModelsResponse models;
      grpc::ClientContext ctx;
      if (!o_.api_key.empty()) ctx.AddMetadata("authorization", "Bearer " + o_.api_key);
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
      grpc::Status st = stub_->ListModels(&ctx, v1::ListModelsRequest(), &models);
      if (!st.ok()) {
        return absl::UnavailableError(
            absl::StrCat("cannot reach ", o_.target, ": ", st.error_message()));
      }
      for (const auto& m : models.models())
        res.model_slos[m.name()] = {m.slo().ttft_ms(), m.slo().tpot_ms()};
    }
    // Index, dependencies and the duration cut. No other thread runs yet;
    // the lock is for the annotations' sake.
    absl::ReleasableMutexLock setup_lock(&mu_);
    std::map<std::string, size_t> index;
    for (size_t i = 0; i < trace_.size(); ++i) index[trace_[i].id] = i;
    for (size_t i = 0; i < trace_.size(); ++i) {
      const auto& r = trace_[i];
      if (r.is_request()) ++res.trace_requests;
      if (r.after.empty()) {
        const double t = r.arrival_s / o_.rate_scale;
        if (o_.duration_s <= 0 || t <= o_.duration_s) {
          state_[i] = State::kWaiting;
          Schedule(i, t);
        }
      } else {
        const size_t parent = index.at(r.after);
        children_[parent].push_back(i);
        if (state_[parent] != State::kExcluded) state_[i] = State::kWaiting;
      }
    }
    outcomes_.resize(trace_.size());
    for (size_t i = 0; i < trace_.size(); ++i) {
      const auto& r = trace_[i];
      if (!r.is_request()) continue;
      if (state_[i] == State::kExcluded) {
        ++res.excluded_by_duration;
        continue;
      }
      ++pending_;
      RequestOutcome& out = outcomes_[i];
      out.id = r.id;
      out.model = r.model;
      out.session = r.session;
      out.turn = r.turn;
      out.ttft_slo_ms = r.ttft_ms;
      out.tpot_slo_ms = r.tpot_ms;
    }
    total_ = pending_;
    start_ = Clock::now();
    setup_lock.Release();
    std::thread progress;
    if (o_.progress) progress = std::thread([this] { Progress(); });
    Loop();
    for (auto& t : threads_) t.join();
    {
      absl::MutexLock lock(&mu_);
      done_ = true;
    }
    if (progress.joinable()) progress.join();
    res.wall_s = Now();
    absl::MutexLock lock(&mu_);
    res.client_delayed = client_delayed_;
    res.advisories_sent = advisories_sent_;
    res.advisories_skipped = advisories_skipped_;
    res.advise_status = advise_status_;
    for (size_t i = 0; i < trace_.size(); ++i) {
      if (trace_[i].is_request() && state_[i] != State::kExcluded)
        res.requests.push_back(outcomes_[i]);
    }
    return res;
  }

 private:
  enum class State { kExcluded, kWaiting, kRunning, kDone, kFailed };

  double Now() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }

  void Schedule(size_t i, double t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { heap_.push({t, i}); }

  // Main loop: releases records at their times until every request ended.
  void Loop() {
    absl::MutexLock lock(&mu_);
    while (pending_ > 0 || !heap_.empty() || inflight_ > 0) {
      if (heap_.empty()) {
        cv_.Wait(&mu_);
        continue;
      }
      // Not a structured binding: clang 14 cannot capture one in a lambda.
      const double t = heap_.top().first;
      const size_t i = heap_.top().second;
      const double now = Now();
      if (t > now) {
        cv_.WaitWithTimeout(&mu_, absl::Seconds(t - now));
        continue;
      }
      if (trace_[i].is_request() && inflight_ >= o_.max_inflight) {
        if (delayed_.insert(i).second) ++client_delayed_;
        cv_.WaitWithTimeout(&mu_, absl::Milliseconds(5));
        continue;
      }
      heap_.pop();
      state_[i] = State::kRunning;
      ++inflight_;
      if (trace_[i].is_request()) outcomes_[i].release_s = t;
      threads_.emplace_back([this, i] {
        const bool ok = trace_[i].is_request() ? SendRequest(i) : SendAdvise(i);
        Finished(i, ok);
      });
    }
  }

  // REQUIRES: mu_ held. Marks the subtree under `i` as failed.
  void AbortChildren(size_t i) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (size_t c : children_[i]) {
      if (state_[c] != State::kWaiting) continue;
      state_[c] = State::kFailed;
      if (trace_[c].is_request()) {
        outcomes_[c].status = "ABORTED";
        outcomes_[c].message = absl::StrCat("dependency ", trace_[i].id, " failed");
        --pending_;
        ++failed_;
      } else {
        ++advisories_skipped_;
      }
      AbortChildren(c);
    }
  }

  void Finished(size_t i, bool ok) {
    absl::MutexLock lock(&mu_);
    --inflight_;
    state_[i] = ok ? State::kDone : State::kFailed;
    if (trace_[i].is_request()) {
      --pending_;
      if (!ok) ++failed_;
    }
    if (ok || !trace_[i].is_request()) {
      const double now = Now();
      for (size_t c : children_[i]) {
        if (state_[c] == State::kWaiting) Schedule(c, now + trace_[c].delay_s);
      }
    } else {
      AbortChildren(i);
    }
    cv_.Signal();
  }

  bool SendRequest(size_t i) {
    const TraceRecord& r = trace_[i];
    RequestOutcome out;
    {
      absl::MutexLock lock(&mu_);
      out = outcomes_[i];
    }
    v1::GenerateRequest req;
    req.set_model(r.model);
    req.set_prompt(r.prompt.empty()
                       ? SynthesizePrompt(r.prompt_tokens, std::hash<std::string>{}(r.id))
                       : r.prompt);
    req.set_session_id(r.session);
    req.mutable_sampling()->set_max_tokens(r.output_tokens);
    req.mutable_sampling()->set_ignore_eos(true);
    req.mutable_slo()->set_ttft_ms(r.ttft_ms);
    req.mutable_slo()->set_tpot_ms(r.tpot_ms);
    req.set_priority(r.priority);
    req.set_token_batches(true);  // as a production frontend would
    grpc::ClientContext ctx;
    if (!o_.api_key.empty()) ctx.AddMetadata("authorization", "Bearer " + o_.api_key);
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(30));
    out.send_s = Now();
    auto reader = stub_->Generate(&ctx, req);
    v1::GenerateResponse resp;
    int tokens = 0;
    while (reader->Read(&resp)) {
      if (const int n = ForEachToken(resp, [](const v1::Token&) {}); n > 0) {
        if (tokens == 0) out.first_token_s = Now();
        tokens += n;
        out.any_token = true;
      } else if (resp.has_final()) {
        const auto& f = resp.final();
        out.prompt_tokens = f.usage().prompt_tokens();
        out.cached_tokens = f.usage().cached_prompt_tokens();
        out.server_queue_ms = f.timings().queue_ms();
        out.scheduler_ms = f.timings().scheduler_ms();
        out.kv_fetch_ms = f.timings().kv_fetch_ms();
        out.kv_load_ms = f.timings().kv_load_ms();
        if (f.timings().node_ttft_ms() > 0) out.node_ttft_ms = f.timings().node_ttft_ms();
        if (f.timings().ttft_ms() > 0) out.scheduler_ttft_ms = f.timings().ttft_ms();
        if (f.timings().node_admission_ms() > 0) {
          out.node_admission_ms = f.timings().node_admission_ms();
        }
        if (f.timings().first_token_delivery_ms() > 0) {
          out.first_token_delivery_ms = f.timings().first_token_delivery_ms();
        }
        out.kv_source = KvSourceName(f.kv_source());
        out.preemptions = f.preemptions();
      }
    }
    grpc::Status st = reader->Finish();
    out.end_s = Now();
    out.output_tokens = tokens;
    out.status = CodeName(st.error_code());
    out.message = st.error_message();
    absl::MutexLock lock(&mu_);
    outcomes_[i] = std::move(out);
    return st.ok();
  }

  bool SendAdvise(size_t i) {
    const TraceRecord& r = trace_[i];
    v1::AdviseRequest req;
    req.set_session_id(r.session);
    req.set_model(r.model);
    req.set_expected_arrival_ms(static_cast<uint32_t>(r.expected_arrival_s * 1000));
    for (const auto& h : r.next_hops) req.add_next_hops(h);
    grpc::ClientContext ctx;
    if (!o_.api_key.empty()) ctx.AddMetadata("authorization", "Bearer " + o_.api_key);
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::AdviseResponse resp;
    grpc::Status st = stub_->Advise(&ctx, req, &resp);
    absl::MutexLock lock(&mu_);
    ++advisories_sent_;
    ++advise_status_[CodeName(st.error_code())];
    return true;  // advisories never block their dependents
  }

  void Progress() {
    const bool tty = isatty(STDERR_FILENO);
    double last_line = -10;
    while (true) {
      int done, inflight, failed;
      {
        absl::MutexLock lock(&mu_);
        auto finished = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done_; };
        mu_.AwaitWithTimeout(absl::Condition(&finished), absl::Milliseconds(tty ? 250 : 1000));
        if (done_) break;
        done = total_ - pending_;
        inflight = inflight_;
        failed = failed_;
      }
      const double now = Now();
      if (!tty && now - last_line < 5) continue;
      last_line = now;
      const int width = 30;
      const int filled = total_ > 0 ? width * done / total_ : width;
      std::fprintf(stderr, "%s[%s%s] %d/%d done, %d in flight, %d failed, %.1f s%s",
                   tty ? "\r" : "", std::string(static_cast<size_t>(filled), '#').c_str(),
                   std::string(static_cast<size_t>(width - filled), '.').c_str(), done, total_,
                   inflight, failed, now, tty ? "" : "\n");
    }
    std::fprintf(stderr, "%s%d/%d requests ended in %.1f s (rate scale %g)\n", tty ? "\r" : "",
                 total_, total_, Now(), o_.rate_scale);
  }

  const std::vector<TraceRecord>& trace_;
  const ReplayOptions o_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Inference::Stub> stub_;
  Clock::time_point start_;

  absl::Mutex mu_;
  absl::CondVar cv_;
  std::vector<State> state_ ABSL_GUARDED_BY(mu_);
  std::vector<std::vector<size_t>> children_;
  std::vector<RequestOutcome> outcomes_ ABSL_GUARDED_BY(mu_);
  std::priority_queue<std::pair<double, size_t>, std::vector<std::pair<double, size_t>>,
                      std::greater<>>
      heap_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> threads_;
  int pending_ ABSL_GUARDED_BY(mu_) = 0;
  int total_ = 0;
  int inflight_ ABSL_GUARDED_BY(mu_) = 0;
  int failed_ ABSL_GUARDED_BY(mu_) = 0;
  int client_delayed_ ABSL_GUARDED_BY(mu_) = 0;
  std::set<size_t> delayed_ ABSL_GUARDED_BY(mu_);
  int advisories_sent_ ABSL_GUARDED_BY(mu_) = 0;
  int advisories_skipped_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, int> advise_status_ ABSL_GUARDED_BY(mu_);
  bool done_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

std::string KvSourceName(v1::KvSource s) {
  std::string name = v1::KvSource_Name(s);
  if (name.rfind("KV_SOURCE_", 0) == 0) name = name.substr(10);
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return name;
}

absl::StatusOr<ReplayResult> Replay(const std::vector<TraceRecord>& trace,
                                    const ReplayOptions& options) {
  if (options.rate_scale <= 0) return absl::InvalidArgumentError("rate scale must be > 0");
  Runner runner(trace, options);
  return runner.Run();
}

}  // namespace ballast::bench
