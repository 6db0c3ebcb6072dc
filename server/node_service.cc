#include "server/node_service.h"

#include <deque>
#include <optional>
#include <variant>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "server/status_util.h"

namespace ballast::server {
namespace {

// Hands engine events from the device thread to the RPC thread.
class StreamSink final : public engine::GenerationSink {
 public:
  struct Token {
    int id;
    std::string text;
    std::optional<engine::TokenLogprobs> logprobs;
  };
  using Event = std::variant<Token, absl::StatusOr<engine::GenerationResult>>;

  void OnToken(int id, const std::string& text, const engine::TokenLogprobs* logprobs) override {
    absl::MutexLock lock(&mu_);
    Token t{id, text, std::nullopt};
    if (logprobs) t.logprobs = *logprobs;
    events_.push_back(std::move(t));
  }
  void OnDone(absl::StatusOr<engine::GenerationResult> r) override {
    absl::MutexLock lock(&mu_);
    events_.push_back(std::move(r));
  }
  // Next event, or nullopt after `timeout` without one.
  std::optional<Event> Pop(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !events_.empty(); };
    mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
    if (events_.empty()) return std::nullopt;
    Event e = std::move(events_.front());
    events_.pop_front();
    return e;
  }

 private:
  absl::Mutex mu_;
  std::deque<Event> events_ ABSL_GUARDED_BY(mu_);
};

// A generated token on the wire, with its log-probabilities when asked.
void FillToken(const engine::Tokenizer& tokenizer, const StreamSink::Token& t, v1::Token* out) {
  out->set_id(t.id);
  out->set_text(t.text);
  if (!t.logprobs) return;
  out->set_logprob(t.logprobs->logprob);
  out->set_token_bytes(tokenizer.TokenBytes(t.id));
  for (const engine::TokenLogprob& alt : t.logprobs->top) {
    v1::TopLogprob* p = out->add_top_logprobs();
    p->set_id(alt.id);
    p->set_token(tokenizer.TokenBytes(alt.id));
    p->set_logprob(alt.logprob);
  }
}

}  // namespace

v1::FinishReason ToProto(engine::FinishReason r) {
  switch (r) {
    case engine::FinishReason::kLength:
      return v1::FINISH_REASON_LENGTH;
    case engine::FinishReason::kEos:
      return v1::FINISH_REASON_EOS;
    case engine::FinishReason::kStop:
      return v1::FINISH_REASON_STOP;
    case engine::FinishReason::kContext:
      return v1::FINISH_REASON_CONTEXT;
  }
  return v1::FINISH_REASON_UNSPECIFIED;
}

v1::KvSource ToProto(engine::KvSource s) {
  switch (s) {
    case engine::KvSource::kNone:
      return v1::KV_SOURCE_NONE;
    case engine::KvSource::kDevice:
      return v1::KV_SOURCE_DEVICE;
    case engine::KvSource::kRecomputed:
      return v1::KV_SOURCE_RECOMPUTED;
    case engine::KvSource::kHostDram:
      return v1::KV_SOURCE_HOST_DRAM;
    case engine::KvSource::kSsd:
      return v1::KV_SOURCE_SSD;
    case engine::KvSource::kPeer:
      return v1::KV_SOURCE_PEER;
  }
  return v1::KV_SOURCE_UNSPECIFIED;
}

// The metrics label of a KV source.
static std::string KvSourceLabel(engine::KvSource s) {
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

// The wire's "0 = none" to TenantLimits.
static memory::TenantLimits KvLimits(int64_t floor, int64_t limit) {
  memory::TenantLimits l;
  l.floor_bytes = floor;
  if (limit > 0) l.limit_bytes = limit;
  return l;
}

grpc::Status NodeService::LoadModel(grpc::ServerContext*, const v1::LoadModelRequest* req,
                                    v1::LoadModelResponse* resp) {
  auto m = node_->LoadModel(req->name(), req->path(), req->kv_dtype(), req->device(),
                            KvLimits(req->kv_floor_bytes(), req->kv_limit_bytes()));
  if (!m.ok()) return ToGrpc(m.status());
  *resp->mutable_model() = *m;
  return grpc::Status::OK;
}

grpc::Status NodeService::SetKvLimits(grpc::ServerContext*, const v1::SetKvLimitsRequest* req,
                                      v1::SetKvLimitsResponse*) {
  if (req->kv_floor_bytes() < 0 || req->kv_limit_bytes() < 0 ||
      (req->kv_limit_bytes() > 0 && req->kv_floor_bytes() > req->kv_limit_bytes())) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "kv floor/limit must be >= 0 and floor <= limit (0 = none)");
  }
  return ToGrpc(
      node_->SetKvLimits(req->name(), KvLimits(req->kv_floor_bytes(), req->kv_limit_bytes())));
}

grpc::Status NodeService::EvictModel(grpc::ServerContext*, const v1::EvictModelRequest* req,
                                     v1::EvictModelResponse*) {
  return ToGrpc(node_->EvictModel(req->name(), req->drain(), !req->drop_host_copy(),
                                  absl::Milliseconds(req->drain_timeout_ms())));
}

grpc::Status NodeService::DropSession(grpc::ServerContext*, const v1::DropSessionRequest* req,
                                      v1::DropSessionResponse* resp) {
  resp->set_existed(node_->DropSession(req->session_id()));
  return grpc::Status::OK;
}

grpc::Status NodeService::FetchKv(grpc::ServerContext* ctx, const v1::FetchKvRequest* req,
                                  grpc::ServerWriter<v1::KvChunk>* writer) {
  if (req->tokens().empty() || req->max_tokens() == 0) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "FetchKv needs tokens and max_tokens");
  }
  const auto chunks = node_->ChunksForPeer(*req);
  for (size_t i = 0; i < chunks.size(); ++i) {
    if (ctx->IsCancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "fetch cancelled");
    const bool ok = node_manager::WriteChunkPieces(
        *chunks[i], static_cast<uint32_t>(i), [&](const v1::KvChunk& m) {
          metrics_->PeerBytesSent(static_cast<int64_t>(m.data().size()));
          return writer->Write(m);
        });
    if (!ok) return grpc::Status(grpc::StatusCode::CANCELLED, "the peer went away");
  }
  return grpc::Status::OK;
}

grpc::Status NodeService::PrefetchKv(grpc::ServerContext*, const v1::PrefetchKvRequest* req,
                                     v1::PrefetchKvResponse* resp) {
  auto r = node_->PrefetchKv(*req);
  if (!r.ok()) return ToGrpc(r.status());
  resp->set_tokens(r->tokens);
  resp->set_source(ToProto(r->source));
  return grpc::Status::OK;
}

grpc::Status NodeService::DropPrefetch(grpc::ServerContext*, const v1::DropPrefetchRequest* req,
                                       v1::DropPrefetchResponse* resp) {
  auto r = node_->DropPrefetch(req->session_id(), req->model());
  if (!r.ok()) return ToGrpc(r.status());
  resp->set_dropped(*r);
  return grpc::Status::OK;
}

grpc::Status NodeService::Generate(grpc::ServerContext* ctx, const v1::NodeGenerateRequest* req,
                                   grpc::ServerWriter<v1::NodeGenerateResponse>* writer) {
  StreamSink sink;
  RequestOutcome outcome;
  outcome.model = req->model();
  auto admitted = node_->Submit(*req, &sink);
  if (!admitted.ok()) {
    outcome.status = absl::StatusCodeToString(admitted.status().code());
    metrics_->NodeRequest(outcome);
    return ToGrpc(admitted.status());
  }
  bool cancelled = false;
  grpc::Status result;
  while (true) {
    auto ev = sink.Pop(absl::Milliseconds(25));
    if (!ev) {
      if (!cancelled && ctx->IsCancelled()) {
        cancelled = true;
        admitted->engine->Cancel(req->request_id());
      }
      continue;
    }
    if (auto* tok = std::get_if<StreamSink::Token>(&*ev)) {
      if (cancelled) continue;
      v1::NodeGenerateResponse r;
      FillToken(admitted->engine->tokenizer(), *tok, r.mutable_token());
      if (!writer->Write(r)) {
        cancelled = true;
        admitted->engine->Cancel(req->request_id());
      }
      continue;
    }
    auto& done = std::get<absl::StatusOr<engine::GenerationResult>>(*ev);
    if (!done.ok()) {
      result = ToGrpc(done.status());
      outcome.status = absl::StatusCodeToString(done.status().code());
      break;
    }
    const engine::GenerationResult& g = *done;
    v1::NodeGenerateResponse r;
    v1::NodeFinal* nf = r.mutable_final();
    v1::Final* f = nf->mutable_final();
    f->set_finish_reason(ToProto(g.reason));
    f->mutable_usage()->set_prompt_tokens(g.prompt_tokens);
    f->mutable_usage()->set_cached_prompt_tokens(g.cached_tokens);
    f->mutable_usage()->set_completion_tokens(static_cast<int>(g.output_tokens.size()));
    f->mutable_timings()->set_queue_ms(g.queue_ms);
    f->mutable_timings()->set_ttft_ms(g.ttft_ms);
    f->mutable_timings()->set_mean_tpot_ms(g.mean_tpot_ms);
    f->mutable_timings()->set_e2e_ms(g.e2e_ms);
    f->mutable_timings()->set_scheduler_ms(req->scheduler_ms());
    f->mutable_timings()->set_kv_fetch_ms(g.kv_fetch_ms);
    f->mutable_timings()->set_kv_load_ms(g.kv_load_ms);
    f->set_kv_source(ToProto(g.kv_source));
    f->set_node_id(node_->options().node_id);
    f->set_device(admitted->device);
    f->set_text(g.text);
    for (int t : admitted->turn_tokens) nf->add_prompt_tokens(t);
    nf->set_prompt_replaces_history(admitted->replaces_history);
    for (int t : g.output_tokens) nf->add_output_tokens(t);
    writer->Write(r);
    outcome.status = "OK";
    outcome.ttft_s = g.ttft_ms / 1000.0;
    if (g.output_tokens.size() > 1) outcome.tpot_s = g.mean_tpot_ms / 1000.0;
    outcome.tokens = static_cast<int64_t>(g.output_tokens.size());
    metrics_->KvHit(KvSourceLabel(g.kv_source),
                    g.prefetch_lead_ms >= 0 ? g.prefetch_lead_ms / 1000.0 : -1);
    break;
  }
  metrics_->NodeRequest(outcome);
  return result;
}

}  // namespace ballast::server
