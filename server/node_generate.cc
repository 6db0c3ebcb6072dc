#include "server/node_generate.h"

#include <deque>
#include <optional>
#include <utility>
#include <variant>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "server/node_service.h"
#include "server/request_id.h"
#include "server/status_util.h"
#include "spdlog/spdlog.h"

namespace ballast::server {
namespace {

// A generated token on the wire, with its log-probabilities when asked.
void FillToken(const engine::Tokenizer& tokenizer, int id, const std::string& text,
               const engine::TokenLogprobs* logprobs, v1::Token* out) {
  out->set_id(id);
  out->set_text(text);
  if (!logprobs) return;
  out->set_logprob(logprobs->logprob);
  out->set_token_bytes(tokenizer.TokenBytes(id));
  for (const engine::TokenLogprob& alt : logprobs->top) {
    v1::TopLogprob* p = out->add_top_logprobs();
    p->set_id(alt.id);
    p->set_token(tokenizer.TokenBytes(alt.id));
    p->set_logprob(alt.logprob);
  }
}

// The final message of a finished request.
v1::NodeGenerateResponse FinalMessage(const engine::GenerationResult& g,
                                      const node_manager::Admission& admitted,
                                      const v1::NodeGenerateRequest& req,
                                      const std::string& node_id) {
  v1::NodeGenerateResponse r;
  v1::NodeFinal* nf = r.mutable_final();
  v1::Final* f = nf->mutable_final();
  f->set_finish_reason(ToProto(g.reason));
  f->mutable_usage()->set_prompt_tokens(g.prompt_tokens);
  f->mutable_usage()->set_cached_prompt_tokens(g.cached_tokens);
  f->mutable_usage()->set_completion_tokens(static_cast<int>(g.output_tokens.size()));
  f->set_preemptions(g.preemptions);
  v1::Timings* t = f->mutable_timings();
  t->set_queue_ms(g.queue_ms);
  t->set_ttft_ms(g.ttft_ms);
  t->set_node_ttft_ms(g.ttft_ms);
  t->set_mean_tpot_ms(g.mean_tpot_ms);
  t->set_e2e_ms(g.e2e_ms);
  t->set_scheduler_ms(req.scheduler_ms());
  t->set_kv_fetch_ms(g.kv_fetch_ms);
  t->set_kv_load_ms(g.kv_load_ms);
  f->set_kv_source(ToProto(g.kv_source));
  f->set_node_id(node_id);
  f->set_device(admitted.device);
  f->set_text(g.text);
  for (int tok : admitted.turn_tokens) nf->add_prompt_tokens(tok);
  nf->set_prompt_replaces_history(admitted.replaces_history);
  for (int tok : g.output_tokens) nf->add_output_tokens(tok);
  return r;
}

class NodeGenerateStream final : public grpc::ServerWriteReactor<v1::NodeGenerateResponse>,
                                 public engine::GenerationSink {
 public:
  NodeGenerateStream(node_manager::NodeManager* node, Metrics* metrics, DeliveryQueue* delivery,
                     const v1::NodeGenerateRequest& req, std::string request_id)
      : node_(node),
        metrics_(metrics),
        delivery_(delivery),
        req_(req),
        request_id_(std::move(request_id)) {
    outcome_.model = req.model();
  }

  // On the admission pool: tokenizes, reads the tiers and queues the
  // sequence. Engine events may arrive before it returns; they wait.
  void Admit() {
    {
      absl::MutexLock lock(&mu_);
      admit_started_ = absl::Now();
    }
    absl::StatusOr<node_manager::Admission> admitted = node_->Submit(req_, this);
    Settle(std::move(admitted));
  }

  void Settle(absl::StatusOr<node_manager::Admission> admitted) {
    std::shared_ptr<engine::ModelEngine> cancel;
    {
      absl::MutexLock lock(&mu_);
      if (admitted.ok()) {
        admitted_ = std::move(*admitted);
        if (!client_ok_ && !cancel_sent_) {  // the client left during admission
          cancel_sent_ = true;
          cancel = admitted_->engine;
        }
      }
    }
    if (cancel) cancel->Cancel(req_.request_id());
    Pump([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      if (!admitted.ok()) {
        engine_done_ = true;  // the engine never saw this sink
        End(ToGrpc(admitted.status()), absl::StatusCodeToString(admitted.status().code()));
      }
      settled_ = true;
    });
  }

  // engine::GenerationSink (the device's step thread): records the event;
  // the delivery pool writes it (Post).
  void OnToken(int id, const std::string& text, const engine::TokenLogprobs* logprobs) override {
    Token t{id, text, std::nullopt};
    if (logprobs) t.logprobs = *logprobs;
    Post([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      if (first_token_at_ == absl::InfinitePast()) first_token_at_ = absl::Now();
      events_.push_back(std::move(t));
    });
  }
  void OnDone(absl::StatusOr<engine::GenerationResult> r) override {
    Post([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      events_.push_back(std::move(r));
      engine_done_ = true;
    });
  }

  // grpc::ServerWriteReactor.
  void OnWriteDone(bool ok) override {
    bool cancel = false;
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (!ok && client_ok_) {
        client_ok_ = false;
        cancel = true;
      }
    }
    if (cancel) CancelInEngine();
    Pump();
  }
  void OnCancel() override {
    {
      absl::MutexLock lock(&mu_);
      client_ok_ = false;
    }
    CancelInEngine();
    Pump();
  }
  void OnDone() override {
    Pump([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { grpc_done_ = true; });
  }

 private:
  // The most tokens one batched message carries (token_batches).
  static constexpr size_t kMaxTokensPerMessage = 256;
  struct Token {
    int id = 0;
    std::string text;
    std::optional<engine::TokenLogprobs> logprobs;
  };
  using Event = std::variant<Token, absl::StatusOr<engine::GenerationResult>>;

  // What a Pump does once it has dropped mu_.
  struct Step {
    enum { kNone, kToken, kWrite, kFinish } action = kNone;
    // kToken: go into current_ (one: `token`; more: `tokens`, a batch).
    std::vector<Token> tokens;
    const engine::Tokenizer* tokenizer = nullptr;  // kToken
    grpc::Status finish;                           // kFinish
  };

  // True exactly once: when gRPC, the engine, the admission and the
  // delivery pool are all done with this object (the caller deletes it).
  // REQUIRES: mu_ held.
  bool Release() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!grpc_done_ || !engine_done_ || !settled_ || delivering_ || starting_ || released_) {
      return false;
    }
    released_ = true;
    return true;
  }

  // The stream's end: `status` once what is queued is written.
  // REQUIRES: mu_ held.
  void End(grpc::Status status, std::string label) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (end_) return;
    end_ = std::move(status);
    outcome_.status = std::move(label);
  }

  void CancelInEngine() {
    std::shared_ptr<engine::ModelEngine> engine;
    {
      absl::MutexLock lock(&mu_);
      if (cancel_sent_ || !admitted_) return;
      cancel_sent_ = true;
      engine = admitted_->engine;
    }
    engine->Cancel(req_.request_id());  // never under mu_: the engine calls into us
  }

  // The final message of `done` into `current_`; false if the request
  // failed (no message, the stream ends with its status).
  // REQUIRES: mu_ held, admitted_, no write outstanding.
  bool FinalToCurrent(const absl::StatusOr<engine::GenerationResult>& done)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!done.ok()) {
      End(ToGrpc(done.status()), absl::StatusCodeToString(done.status().code()));
      return false;
    }
    const engine::GenerationResult& g = *done;
    current_ = FinalMessage(g, *admitted_, req_, node_->options().node_id);
    v1::Timings* t = current_.mutable_final()->mutable_final()->mutable_timings();
    t->set_node_admission_ms(absl::ToDoubleMilliseconds(admit_started_ - created_));
    if (first_write_at_ != absl::InfinitePast()) {
      t->set_first_token_delivery_ms(absl::ToDoubleMilliseconds(first_write_at_ - first_token_at_));
    }
    End(grpc::Status::OK, "OK");
    outcome_.ttft_s = g.ttft_ms / 1000.0;
    outcome_.queue_s = g.queue_ms / 1000.0;
    if (g.output_tokens.size() > 1) outcome_.tpot_s = g.mean_tpot_ms / 1000.0;
    outcome_.tokens = static_cast<int64_t>(g.output_tokens.size());
    metrics_->KvHit(KvSourceLabel(g.kv_source),
                    g.prefetch_lead_ms >= 0 ? g.prefetch_lead_ms / 1000.0 : -1);
    return true;
  }

  // Takes what is due next: a token to write (its message is built after
  // mu_ is dropped), the final message, or the Finish once everything
  // queued is written; marks the write (and its start) or the Finish
  // outstanding. Nothing while a write, its start or the Finish is.
  // REQUIRES: mu_ held.
  Step TakeNext() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Step next;
    if (grpc_done_ || writing_ || starting_ || finishing_) return next;
    if (!client_ok_) {
      End(grpc::Status(grpc::StatusCode::CANCELLED, "request cancelled"), "CANCELLED");
      events_.clear();
    }
    while (admitted_ && client_ok_ && !events_.empty() && next.action == Step::kNone) {
      Event e = std::move(events_.front());
      events_.pop_front();
      if (auto* t = std::get_if<Token>(&e)) {
        next.action = Step::kToken;
        next.tokens.push_back(std::move(*t));
        next.tokenizer = &admitted_->engine->tokenizer();
        // A batching caller gets every token queued behind it, up to a cap.
        while (req_.token_batches() && !events_.empty() &&
               next.tokens.size() < kMaxTokensPerMessage) {
          t = std::get_if<Token>(&events_.front());
          if (t == nullptr) break;
          next.tokens.push_back(std::move(*t));
          events_.pop_front();
        }
      } else if (FinalToCurrent(std::get<absl::StatusOr<engine::GenerationResult>>(e))) {
        next.action = Step::kWrite;
      }
    }
    if (next.action == Step::kNone && events_.empty() && end_) {
      finishing_ = true;
      next.finish = *end_;
      // Counted before the client can see the status (a scrape right
      // after the call ends includes it).
      metrics_->NodeRequest(outcome_);
      next.action = Step::kFinish;
    }
    if (next.action == Step::kToken && first_write_at_ == absl::InfinitePast()) {
      first_write_at_ = absl::Now();
    }
    writing_ = next.action == Step::kToken || next.action == Step::kWrite;
    starting_ = next.action != Step::kNone;
    return next;
  }

  // Runs `change` under mu_, then starts the next write, or the Finish, if
  // one is due (gRPC is called outside mu_: its reactions may run inline;
  // one write at a time). The thread that starts a write owns current_
  // until StartWrite returns and it has cleared starting_ under mu_: a
  // write that completes meanwhile leaves the next one to it, so current_
  // is never refilled while gRPC may still read it in StartWrite
  // (serialization), and every hand-off of current_ goes through mu_.
  // The object is deleted by the one call whose change completes it
  // (Release), in the same critical section, so no other thread touches
  // it afterwards: the engine and the admission do not call again once
  // done, a posted delivery holds it (delivering_), and gRPC's OnDone
  // comes last of its calls, after the Finish, which waits for the write
  // and its start (so a thread back from StartWrite finds it alive). The
  // thread that calls Finish holds the object too (starting_) until
  // Finish returns: OnDone may run on another thread before that, and
  // only our own mutex, not gRPC's internal hand-off, orders the two.
  template <typename Change>
  void Pump(Change change) {
    bool last = false;
    Step next;
    {
      absl::MutexLock lock(&mu_);
      change();
      if (grpc_done_) last = Release();
      next = TakeNext();
    }
    if (last) {
      delete this;
      return;
    }
    while (next.action == Step::kToken || next.action == Step::kWrite) {
      if (next.action == Step::kToken) {  // current_ is ours (starting_)
        current_.Clear();
        for (const Token& t : next.tokens) {
          FillToken(*next.tokenizer, t.id, t.text, t.logprobs ? &*t.logprobs : nullptr,
                    next.tokens.size() == 1 ? current_.mutable_token()
                                            : current_.mutable_tokens()->add_tokens());
        }
      }
      StartWrite(&current_);
      absl::MutexLock lock(&mu_);
      starting_ = false;
      next = TakeNext();  // nothing while the write is outstanding
    }
    if (next.action == Step::kFinish) {
      spdlog::debug("request {} for {}: {} on this node", request_id_, req_.model(),
                    CodeName(next.finish.error_code()));
      Finish(next.finish);
      FinishReturned();  // OnDone may have run meanwhile: it left the release to this
    }
  }
  // Not a template: Pump calls it.
  void FinishReturned() {
    Pump([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { starting_ = false; });
  }
  void Pump() {
    Pump([]() {});
  }

  // The engine's step thread: runs `change` (records an event) under mu_
  // and, when nothing else will pump it (no write, write start or Finish
  // outstanding, no delivery posted), posts a Pump to the delivery queue.
  // Deletes the object if gRPC is already done and this completes it. The
  // object outlives this call: engine_done_ is set only by the engine's
  // last call, and delivering_ holds it until the posted Pump runs.
  template <typename Change>
  void Post(Change change) {
    bool last = false, deliver = false;
    {
      absl::MutexLock lock(&mu_);
      change();
      if (grpc_done_) {
        last = Release();
      } else if (admitted_ && !writing_ && !starting_ && !finishing_ && !delivering_) {
        delivering_ = deliver = true;  // not yet admitted: Settle pumps
      }
    }
    if (last) {
      delete this;
    } else if (deliver) {  // inline if the pool is stopping: nothing hangs
      delivery_->Post(
          [this] { Pump([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { delivering_ = false; }); });
    }
  }

  node_manager::NodeManager* const node_;
  Metrics* const metrics_;
  DeliveryQueue* const delivery_;
  const v1::NodeGenerateRequest req_;
  const std::string request_id_;            // the client's (server/request_id.h), for logs
  const absl::Time created_ = absl::Now();  // the call's receipt
  absl::Mutex mu_;
  // The path's node-side stamps (Timings.node_admission_ms,
  // first_token_delivery_ms): admission began; the first token reached
  // this stream (the engine's step); its write was taken up.
  absl::Time admit_started_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::Time first_token_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::Time first_write_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::optional<node_manager::Admission> admitted_ ABSL_GUARDED_BY(mu_);
  std::deque<Event> events_ ABSL_GUARDED_BY(mu_);
  // Being written: filled by the Pump that set starting_ (under mu_ or
  // just after it), then read by gRPC in StartWrite and until OnWriteDone
  // (writing_ and starting_ keep others off it).
  v1::NodeGenerateResponse current_;
  std::optional<grpc::Status> end_ ABSL_GUARDED_BY(mu_);  // after the queue drains
  RequestOutcome outcome_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;   // until OnWriteDone
  bool starting_ ABSL_GUARDED_BY(mu_) = false;  // until StartWrite or Finish returned
  bool finishing_ ABSL_GUARDED_BY(mu_) = false;
  bool delivering_ ABSL_GUARDED_BY(mu_) = false;  // a Pump is posted to delivery_
  bool client_ok_ ABSL_GUARDED_BY(mu_) = true;
  bool cancel_sent_ ABSL_GUARDED_BY(mu_) = false;
  bool engine_done_ ABSL_GUARDED_BY(mu_) = false;  // the engine will not call again
  bool grpc_done_ ABSL_GUARDED_BY(mu_) = false;
  bool settled_ ABSL_GUARDED_BY(mu_) = false;  // Settle ran (admitted or refused)
  bool released_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

grpc::ServerWriteReactor<v1::NodeGenerateResponse>* StartNodeGenerate(
    node_manager::NodeManager* node, Metrics* metrics, transfer::WorkerPool* admission,
    DeliveryQueue* delivery, grpc::CallbackServerContext* ctx, const v1::NodeGenerateRequest* req) {
  auto* s = new NodeGenerateStream(node, metrics, delivery, *req, RequestIdOf(*ctx));
  // Accepted at once: the scheduler times a node's acceptance to find hung
  // nodes (SchedulerOptions::node_accept_timeout), admission may queue.
  s->StartSendInitialMetadata();
  if (!admission->Schedule([s] { s->Admit(); })) {
    s->Settle(absl::UnavailableError("the node is shutting down"));
  }
  return s;
}

std::string KvSourceLabel(engine::KvSource s) {
  switch (s) {
    case engine::KvSource::kNone:
      return "none";
    case engine::KvSource::kDevice:
      return "device";
    case engine::KvSource::kRecomputed:
      return "recomputed";
    case engine::KvSource::kHostDram:
      return "host_dram";
    case engine::KvSource::kSsd:
      return "ssd";
    case engine::KvSource::kPeer:
      return "peer";
  }
  return "none";
}

}  // namespace ballast::server
