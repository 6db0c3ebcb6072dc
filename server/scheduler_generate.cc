// The scheduler's Generate (scheduler_generate.h): the client's stream, its
// routing and its attempts on nodes (each an Upstream, scheduler_upstream.h).
#include "server/scheduler_generate.h"

#include <atomic>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "server/request_id.h"
#include "server/request_parse.h"
#include "server/scheduler_upstream.h"
#include "server/status_util.h"
#include "server/token_relay.h"
#include "spdlog/spdlog.h"

namespace ballast::server {
namespace {

double MsSince(absl::Time t) { return absl::ToDoubleMilliseconds(absl::Now() - t); }

// A request refused before any routing (it could not be parsed).
class RefusedStream final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  explicit RefusedStream(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

// One client's Generate: routed, then proxied from its node (see the header).
class SchedulerGenerateStream final : public grpc::ServerWriteReactor<grpc::ByteBuffer>,
                                      public UpstreamOwner {
  // The node's call ended while relay_ still had tokens to write.
  struct NodeEnd {
    Upstream* upstream;
    grpc::Status status;
  };

 public:
  SchedulerGenerateStream(global_scheduler::Scheduler* sched, Metrics* metrics,
                          transfer::WorkerPool* routing, const v1::GenerateRequest& req,
                          std::string request_id, grpc::CallbackServerContext* server_ctx)
      : server_ctx_(server_ctx),
        sched_(sched),
        metrics_(metrics),
        routing_(routing),
        req_(req),
        request_id_(std::move(request_id)),
        t0_(absl::Now()),
        relay_(req.token_batches()) {
    outcome_.model = req.model();
    outcome_.tenant = req.tenant();
  }

  // Routes on the pool (avoiding `avoid`, the node a first attempt failed
  // on), then starts the node call.
  void Route(std::string avoid) {
    {
      absl::MutexLock lock(&mu_);
      routing_pending_ = true;
    }
    if (!routing_->Schedule([this, avoid] { DoRoute(avoid); })) {
      Pump([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        routing_pending_ = false;
        End(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the scheduler is shutting down"));
      });
    }
  }

  // The node's next message (an Upstream's reaction). Its tokens join
  // relay_; the next read starts at once unless relay_ is full, so the
  // node's messages are taken as they come while the client's write is
  // outstanding (read-ahead), and what gathers meanwhile goes out in one
  // message to a client that asked for batches.
  void OnNodeMessage(Upstream* u) override {
    bool write = false;
    Upstream* read = nullptr;
    {
      absl::MutexLock lock(&mu_);
      reading_ = false;
      const v1::NodeGenerateResponse& r = u->resp();
      if (r.has_token() || r.tokens().tokens_size() > 0) {
        if (ttft_ms_ < 0) ttft_ms_ = MsSince(t0_);
        streamed_ = true;
        if (client_ok_) {  // else drained: the call was cancelled
          relay_.Add(r);
          if (!writing_) write = FillFromRelay();
        }
      } else if (r.has_final()) {
        final_ = r.final();
      }
      read = ReadAhead();
      ++calls_out_;
    }
    if (write) StartWrite(&wire_);
    if (read) read->ReadNext();
    Returned();
  }

  // The node's call ended. Taken up once every token read from it has been
  // written (no write outstanding, relay_ empty) or the client is gone:
  // the turn is saved, and the request counted, only after the client has
  // every token (NodeCallEnded), as when the node's end could only be read
  // after the last write. A client that stops reading keeps the route
  // counted until its call ends, as before.
  void OnNodeDone(Upstream* u, const grpc::Status& status) override {
    {
      absl::MutexLock lock(&mu_);
      if (client_ok_ && (writing_ || !relay_.empty())) {  // its OnWriteDone resumes
        node_end_.emplace(NodeEnd{u, status});
        return;
      }
    }
    NodeCallEnded(u, status);
  }

  // The node's call ended and nothing read from it is left to write.
  void NodeCallEnded(Upstream* u, const grpc::Status& status) {
    bool client_ok;
    std::optional<v1::NodeFinal> final;
    {
      absl::MutexLock lock(&mu_);
      client_ok = client_ok_;
      final = final_;
    }
    const bool ok = status.ok() && final.has_value() && client_ok;
    const absl::Status saved = sched_->Complete(u->route(), ok ? &*final : nullptr);
    const std::string node = u->route().node_id;
    const bool unaccepted = u->unaccepted();
    bool retry = false;
    Pump([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      upstream_active_ = false;
      if (!client_ok_) {
        End(grpc::Status(grpc::StatusCode::CANCELLED, "client cancelled the request"));
      } else if (status.error_code() == grpc::StatusCode::UNAVAILABLE || unaccepted) {
        if (!unaccepted) sched_->ReportUnavailable(node);
        if (!streamed_ && attempts_ == 1) {
          retry = true;
          routing_pending_ = true;  // before the stream could be released
        } else {
          End(grpc::Status(
              grpc::StatusCode::UNAVAILABLE,
              absl::StrCat("node ", node, " failed during the request: ", status.error_message(),
                           "; retry (sessions are recomputed)")));
        }
      } else if (!status.ok()) {
        End(status);
      } else if (!final_) {
        End(grpc::Status(grpc::StatusCode::INTERNAL, "node sent no final message"));
      } else if (!saved.ok()) {
        End(grpc::Status(grpc::StatusCode::UNAVAILABLE, std::string(saved.message())));
      } else {
        QueueFinal();
      }
    });
    if (retry) {
      // The node failed before the first token: once, on another replica.
      spdlog::warn("request {} for {} failed on node {} before its first token ({}): retrying",
                   request_id_, req_.model(), node,
                   unaccepted ? "not accepted in time" : status.error_message());
      if (!routing_->Schedule([this, node] { DoRoute(node); })) {
        Pump([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          routing_pending_ = false;
          End(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the scheduler is shutting down"));
        });
      }
    }
  }

  // The acceptance deadline of `u` passed (`fired`) or was cancelled. A
  // node that has not accepted the first attempt's stream is taken for hung
  // when the model has a replica elsewhere: the attempt is cancelled and
  // retried there (OnNodeDone). The pending count is dropped only after
  // the cancel, so the stream (and `u`) outlive it.
  void OnAcceptAlarm(Upstream* u, bool fired) override {
    const std::string& node = u->route().node_id;
    const bool elsewhere = fired && sched_->HasReplicaElsewhere(req_.model(), node);
    bool cancel = false;
    Pump([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      // Decided under mu_, where acceptance is recorded (NodeAccepted).
      if (elsewhere && u == upstream_.get() && !accepted_ && upstream_active_ && !streamed_ &&
          attempts_ == 1 && client_ok_) {
        u->MarkUnaccepted();
        cancel = true;
      } else {
        --alarms_pending_;
      }
    });
    if (!cancel) return;
    sched_->ReportUnresponsive(node);
    u->Cancel();
    Pump([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { --alarms_pending_; });
  }

  // The node sent the attempt's initial metadata (it accepted the call).
  void NodeAccepted(Upstream* u) override {
    absl::MutexLock lock(&mu_);
    if (u == upstream_.get()) accepted_ = true;
  }

  // grpc::ServerWriteReactor.
  void OnWriteDone(bool ok) override {
    Upstream* read = nullptr;
    Upstream* cancel = nullptr;
    bool write = false;
    std::optional<NodeEnd> ended;
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (!ok && client_ok_) {
        client_ok_ = false;
        cancelled_ = true;
        if (upstream_active_) cancel = upstream_.get();
      }
      if (!client_ok_) relay_.Clear();
      write = FillFromRelay();
      read = ReadAhead();  // relay_ may have room again
      if (!write) ended = TakeNodeEnd();
      if (cancel || read || write || ended) ++calls_out_;
    }
    if (cancel) cancel->Cancel();
    if (write) StartWrite(&wire_);
    if (read) read->ReadNext();
    if (ended) NodeCallEnded(ended->upstream, ended->status);
    Pump([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      if (cancel || read || write || ended) --calls_out_;
    });
  }
  void OnCancel() override {
    Upstream* cancel = nullptr;
    Upstream* read = nullptr;
    std::optional<NodeEnd> ended;
    {
      absl::MutexLock lock(&mu_);
      client_ok_ = false;
      cancelled_ = true;
      relay_.Clear();
      if (upstream_active_) cancel = upstream_.get();
      read = ReadAhead();  // a read stopped by a full relay_: the node's end
      ended = TakeNodeEnd();
      if (cancel || read || ended) ++calls_out_;
    }
    if (cancel) cancel->Cancel();
    if (read) read->ReadNext();
    if (ended) NodeCallEnded(ended->upstream, ended->status);
    Pump([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      if (cancel || read || ended) --calls_out_;
    });
  }
  void OnDone() override {
    Pump([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { grpc_done_ = true; });
  }

 private:
  // Routing, on the pool: begins the route, then steps it. While no
  // replica is ready the stream parks with the scheduler's waiters (no
  // thread held) and comes back to the pool when woken.
  void DoRoute(const std::string& avoid) {
    pending_ = global_scheduler::PendingRoute();
    if (auto st = sched_->BeginRoute(req_, avoid, &pending_); !st.ok()) {
      AddRetryHint(server_ctx_, st);  // a quota's refusal: when to retry
      Pump([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        routing_pending_ = false;
        End(ToGrpc(st));
      });
      return;
    }
    StepRoute();
  }

  void StepRoute() {
    auto route = sched_->TryRoute(req_, &pending_, cancelled_.load());
    if (!route.ok()) {
      Pump([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        routing_pending_ = false;
        End(ToGrpc(route.status()));
      });
      return;
    }
    if (!*route) {
      sched_->AwaitReplica(
          pending_, [this] { return cancelled_.load(); },
          [this] {
            if (!routing_->Schedule([this] { StepRoute(); })) {
              sched_->AbandonRoute(pending_);
              Pump([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                routing_pending_ = false;
                End(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the scheduler is shutting down"));
              });
            }
          });
      return;
    }
    StartAttempt(std::move(**route));
  }

  // Starts the node call of a routed attempt.
  void StartAttempt(global_scheduler::Route route) {
    auto up = std::make_unique<Upstream>(this, route, NodeRequest(req_, route, t0_), request_id_);
    Upstream* start = nullptr;
    const absl::Duration accept_timeout = sched_->node_accept_timeout();
    {
      absl::MutexLock lock(&mu_);
      if (client_ok_) {
        routing_pending_ = false;
        if (upstream_) retired_.push_back(std::move(upstream_));
        upstream_ = std::move(up);
        upstream_active_ = true;
        reading_ = true;  // Start() reads
        ++attempts_;
        accepted_ = false;
        final_.reset();
        outcome_.slo_ttft_s = upstream_->route().ttft_ms / 1000.0;
        outcome_.slo_tpot_s = upstream_->route().tpot_ms / 1000.0;
        start = upstream_.get();
        if (accept_timeout > absl::ZeroDuration()) ++alarms_pending_;
        ++calls_out_;
      }
    }
    if (start) {
      if (accept_timeout > absl::ZeroDuration()) start->ArmAcceptAlarm(accept_timeout);
      start->Start();
      Returned();
      return;
    }
    // The client left while routing: the route's count and turn are undone.
    sched_->Complete(route, nullptr).IgnoreError();  // no turn to save
    Pump([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      routing_pending_ = false;
      End(grpc::Status(grpc::StatusCode::CANCELLED, "client cancelled the request"));
    });
  }

  // The next message from relay_ (TokenRelay::Next) into wire_, marked
  // outstanding; false if there is none to write.
  // REQUIRES: mu_ held, no write outstanding.
  bool FillFromRelay() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!client_ok_ || !relay_.Next(&current_)) return false;
    Encode();
    writing_ = true;
    return true;
  }

  // The attempt whose next read is to start now, marked outstanding: none
  // while one is, or while relay_ is full for a client still there (the
  // node's stream then waits on HTTP/2 flow control, and the node batches
  // what gathers). REQUIRES: mu_ held.
  Upstream* ReadAhead() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!upstream_active_ || reading_ || (client_ok_ && relay_.full())) {
      return nullptr;
    }
    reading_ = true;
    return upstream_.get();
  }

  // The node's end held back by OnNodeDone, once nothing read from the
  // node is left to write to a client still there. REQUIRES: mu_ held.
  std::optional<NodeEnd> TakeNodeEnd() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!node_end_ || (client_ok_ && (writing_ || !relay_.empty()))) return std::nullopt;
    std::optional<NodeEnd> e = std::move(node_end_);
    node_end_.reset();
    return e;
  }

  // current_ into wire_. REQUIRES: mu_ held, no write outstanding.
  void Encode() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    bool own = false;
    wire_.Clear();  // the previous message was written (OnWriteDone)
    grpc::SerializationTraits<v1::GenerateResponse>::Serialize(current_, &wire_, &own);
  }

  // The stream's end: `status` once what is queued is written.
  // REQUIRES: mu_ held.
  void End(grpc::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (end_) return;
    outcome_.status = CodeName(status.error_code());
    end_ = std::move(status);
  }

  // The client's Final (the node's, with the scheduler's TTFT and E2E),
  // queued to be written before the stream ends OK. REQUIRES: mu_ held.
  void QueueFinal() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    final_msg_.emplace();
    v1::Final* f = final_msg_->mutable_final();
    *f = final_->final();
    f->mutable_timings()->set_ttft_ms(ttft_ms_ >= 0 ? ttft_ms_ : MsSince(t0_));
    f->mutable_timings()->set_e2e_ms(MsSince(t0_));
    outcome_.ttft_s = f->timings().ttft_ms() / 1000.0;
    if (f->usage().completion_tokens() > 1) outcome_.tpot_s = f->timings().mean_tpot_ms() / 1000.0;
    outcome_.tokens = f->usage().completion_tokens();
    // Prompt tokens whose KV was computed (reused session KV is not new load).
    sched_->RecordCompletion(req_.model(),
                             f->usage().prompt_tokens() - f->usage().cached_prompt_tokens(),
                             f->usage().completion_tokens(), req_.tenant());
    End(grpc::Status::OK);
  }

  // True exactly once: when gRPC is done with the stream, no node call or
  // routing is pending and no gRPC call made outside mu_ is still
  // returning (the caller deletes it). REQUIRES: mu_ held.
  bool Release() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!grpc_done_ || upstream_active_ || routing_pending_ || alarms_pending_ > 0 ||
        calls_out_ > 0 || released_) {
      return false;
    }
    released_ = true;
    return true;
  }

  // Runs `change` under mu_, then starts the next write or the Finish if
  // one is due, outside mu_; deletes the stream in the call whose change
  // completes it (see NodeGenerateStream for why in one critical section).
  template <typename Change>
  void Pump(Change change) {
    bool last = false;
    enum { kNone, kWrite, kFinish } action = kNone;
    grpc::Status finish;
    {
      absl::MutexLock lock(&mu_);
      change();
      if (grpc_done_) {
        last = Release();
      } else if (!writing_ && !finishing_) {
        if (!client_ok_) End(grpc::Status(grpc::StatusCode::CANCELLED, "request cancelled"));
        if (final_msg_ && client_ok_ && !final_written_ && relay_.empty()) {
          current_ = std::move(*final_msg_);
          Encode();
          final_msg_.reset();
          final_written_ = true;
          writing_ = true;
          action = kWrite;
        } else if (end_ && !(routing_pending_ && client_ok_) && (relay_.empty() || !client_ok_)) {
          finishing_ = true;
          finish = *end_;
          // Counted before the client can see the status (a scrape right
          // after the call ends includes it).
          metrics_->SchedulerRequest(outcome_);
          action = kFinish;
        }
        if (action != kNone) ++calls_out_;
      }
    }
    if (last) {
      delete this;
      return;
    }
    if (action == kWrite) StartWrite(&wire_);
    if (action == kFinish) {
      spdlog::debug("request {} for {}: {} after {:.1f} ms", request_id_, req_.model(),
                    CodeName(finish.error_code()), MsSince(t0_));
      Finish(finish);
    }
    if (action != kNone) Returned();
  }
  // A gRPC call counted in calls_out_ returned (not a template: Pump calls it).
  void Returned() {
    Pump([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { --calls_out_; });
  }
  void Pump() {
    Pump([]() {});
  }

  grpc::CallbackServerContext* const server_ctx_;  // trailing metadata before Finish
  global_scheduler::Scheduler* const sched_;
  Metrics* const metrics_;
  transfer::WorkerPool* const routing_;
  const v1::GenerateRequest req_;
  const std::string request_id_;  // server/request_id.h
  const absl::Time t0_;
  std::atomic<bool> cancelled_{false};  // read by routing and its wait
  // The route being found: used by one routing step at a time (pool and
  // waiter hand-offs order them), never while an attempt runs.
  global_scheduler::PendingRoute pending_;
  absl::Mutex mu_;
  std::unique_ptr<Upstream> upstream_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Upstream>> retired_ ABSL_GUARDED_BY(mu_);  // earlier attempts
  // Being written: filled under mu_ while no write is outstanding and
  // encoded into wire_, which gRPC reads until OnWriteDone (writing_ keeps
  // others off both). The method is raw (request_parse.h).
  v1::GenerateResponse current_;
  grpc::ByteBuffer wire_;
  // Tokens read from the node and not yet written to the client: read
  // ahead while a write is outstanding (OnNodeMessage).
  TokenRelay relay_ ABSL_GUARDED_BY(mu_);
  std::optional<NodeEnd> node_end_ ABSL_GUARDED_BY(mu_);
  std::optional<v1::NodeFinal> final_ ABSL_GUARDED_BY(mu_);             // this attempt's
  std::optional<v1::GenerateResponse> final_msg_ ABSL_GUARDED_BY(mu_);  // to write last
  std::optional<grpc::Status> end_ ABSL_GUARDED_BY(mu_);
  RequestOutcome outcome_ ABSL_GUARDED_BY(mu_);
  double ttft_ms_ ABSL_GUARDED_BY(mu_) = -1;
  int attempts_ ABSL_GUARDED_BY(mu_) = 0;
  int alarms_pending_ ABSL_GUARDED_BY(mu_) = 0;  // acceptance alarms not yet called back
  bool accepted_ ABSL_GUARDED_BY(mu_) = false;   // the current attempt's node accepted
  bool streamed_ ABSL_GUARDED_BY(mu_) = false;   // a token came from the node: no retry now
  bool client_ok_ ABSL_GUARDED_BY(mu_) = true;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool reading_ ABSL_GUARDED_BY(mu_) = false;  // the attempt's read is outstanding
  bool finishing_ ABSL_GUARDED_BY(mu_) = false;
  bool final_written_ ABSL_GUARDED_BY(mu_) = false;
  bool upstream_active_ ABSL_GUARDED_BY(mu_) = false;
  bool routing_pending_ ABSL_GUARDED_BY(mu_) = false;
  bool grpc_done_ ABSL_GUARDED_BY(mu_) = false;
  bool released_ ABSL_GUARDED_BY(mu_) = false;
  // gRPC calls this stream makes outside mu_ (StartWrite, Finish, an
  // attempt's Start, ReadNext and Cancel) that have not returned yet: the
  // stream is not released until they have. gRPC's OnDone can run on
  // another thread while such a call is still unwinding; only mu_, not
  // gRPC's internal hand-off (invisible to ThreadSanitizer), orders them.
  int calls_out_ ABSL_GUARDED_BY(mu_) = 0;
};

// With API keys (server/auth.h): the caller's key, its model allow-list and
// its tenant, which the request then carries.
absl::Status Authorize(KeyStore* keys, const grpc::CallbackServerContext& ctx,
                       v1::GenerateRequest* req) {
  auto caller = CallerOf(keys, ctx);
  if (!caller.ok()) return caller.status();
  if (!*caller) return absl::OkStatus();
  const Principal& p = **caller;
  if (auto st = p.CheckModel(req->model()); !st.ok()) return st;
  auto tenant = p.TenantFor(req->tenant());
  if (!tenant.ok()) return tenant.status();
  req->set_tenant(*tenant);
  return absl::OkStatus();
}

}  // namespace

grpc::ServerWriteReactor<grpc::ByteBuffer>* StartSchedulerGenerate(
    global_scheduler::Scheduler* sched, Metrics* metrics, transfer::WorkerPool* routing,
    KeyStore* keys, grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* raw) {
  std::string request_id = RequestIdOf(*ctx);
  ctx->AddInitialMetadata(kRequestIdKey, request_id);
  v1::GenerateRequest req;
  auto refuse = [&](const absl::Status& st) {
    AddRetryHint(ctx, st);
    RequestOutcome refused;
    refused.status = CodeName(ToGrpc(st).error_code());
    refused.tenant = req.tenant();
    metrics->SchedulerRequest(refused);
    return new RefusedStream(ToGrpc(st));
  };
  if (absl::Status st = ParseRequest(*raw, &req); !st.ok()) return refuse(st);
  if (absl::Status st = Authorize(keys, *ctx, &req); !st.ok()) return refuse(st);
  auto* s = new SchedulerGenerateStream(sched, metrics, routing, req, std::move(request_id), ctx);
  s->Route("");
  return s;
}

}  // namespace ballast::server
