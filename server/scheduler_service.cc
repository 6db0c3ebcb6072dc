#include "server/scheduler_service.h"

#include <atomic>
#include <optional>
#include <thread>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "global_scheduler/request_validation.h"
#include "proto/model_name.h"
#include "server/status_util.h"
#include "spdlog/spdlog.h"

namespace ballast::server {
namespace {

std::string NewRequestId() {
  static std::atomic<uint64_t> counter{0};
  thread_local absl::BitGen gen;
  return absl::StrCat("req-", counter.fetch_add(1), "-",
                      absl::Hex(absl::Uniform<uint32_t>(gen), absl::kZeroPad8));
}

// Cancels the upstream (node) call when the downstream client goes away.
class CancelWatcher {
 public:
  CancelWatcher(grpc::ServerContext* down, grpc::ClientContext* up)
      : thread_([this, down, up] {
          while (!done_.WaitForNotificationWithTimeout(absl::Milliseconds(20))) {
            if (down->IsCancelled()) {
              up->TryCancel();
              return;
            }
          }
        }) {}
  ~CancelWatcher() {
    done_.Notify();
    thread_.join();
  }

 private:
  absl::Notification done_;
  std::thread thread_;
};

double MsSince(absl::Time t) { return absl::ToDoubleMilliseconds(absl::Now() - t); }

v1::NodeGenerateRequest NodeRequest(const v1::GenerateRequest& req,
                                    const global_scheduler::Route& route, absl::Time t0) {
  v1::NodeGenerateRequest nreq;
  nreq.set_request_id(NewRequestId());
  nreq.set_model(req.model());
  for (int t : route.history) nreq.add_history_tokens(t);
  nreq.set_prompt(req.prompt());
  for (const auto& m : route.history_messages) *nreq.add_history_messages() = m;
  *nreq.mutable_messages() = req.messages();
  nreq.set_session_id(req.session_id());
  nreq.set_tenant(req.tenant());
  nreq.set_kv_peer(route.kv_peer);
  *nreq.mutable_sampling() = req.sampling();
  nreq.mutable_slo()->set_ttft_ms(route.ttft_ms);
  nreq.mutable_slo()->set_tpot_ms(route.tpot_ms);
  nreq.set_priority(req.priority());
  nreq.set_reject_if_slo_unmet(req.reject_if_slo_unmet());
  nreq.set_scheduler_ms(MsSince(t0));
  return nreq;
}

// One attempt of a request on its routed node: the node's tokens go to the
// client as they come.
struct Attempt {
  grpc::Status status;
  std::optional<v1::NodeFinal> final;
  bool streamed = false;  // a token reached the client: no retry now
  bool client_gone = false;
};

Attempt Proxy(grpc::ServerContext* ctx, const global_scheduler::Route& route,
              const v1::NodeGenerateRequest& nreq, grpc::ServerWriter<v1::GenerateResponse>* writer,
              absl::Time t0, double* ttft_ms) {
  Attempt a;
  grpc::ClientContext up;
  CancelWatcher watcher(ctx, &up);
  auto reader = route.stub->Generate(&up, nreq);
  v1::NodeGenerateResponse resp;
  while (reader->Read(&resp)) {
    if (resp.has_token()) {
      if (*ttft_ms < 0) *ttft_ms = MsSince(t0);
      a.streamed = true;
      v1::GenerateResponse out;
      *out.mutable_token() = resp.token();
      if (!a.client_gone && !writer->Write(out)) {
        a.client_gone = true;
        up.TryCancel();
      }
    } else if (resp.has_final()) {
      a.final = resp.final();
    }
  }
  a.status = reader->Finish();
  return a;
}

}  // namespace

grpc::Status InferenceService::Generate(grpc::ServerContext* ctx, const v1::GenerateRequest* req,
                                        grpc::ServerWriter<v1::GenerateResponse>* writer) {
  const absl::Time t0 = absl::Now();
  RequestOutcome outcome;
  outcome.model = req->model();
  auto finish = [&](const grpc::Status& st) {
    outcome.status = CodeName(st.error_code());
    metrics_->SchedulerRequest(outcome);
    return st;
  };
  const auto cancelled = [ctx] { return ctx->IsCancelled(); };
  auto route = sched_->RouteRequest(*req, cancelled);
  if (!route.ok()) return finish(ToGrpc(route.status()));
  double ttft_ms = -1;
  Attempt a;
  for (int attempt = 0;; ++attempt) {
    a = Proxy(ctx, *route, NodeRequest(*req, *route, t0), writer, t0, &ttft_ms);
    const bool ok = a.status.ok() && a.final.has_value() && !a.client_gone && !ctx->IsCancelled();
    sched_->Complete(*route, ok ? &*a.final : nullptr);
    if (a.client_gone || ctx->IsCancelled()) {
      return finish(grpc::Status(grpc::StatusCode::CANCELLED, "client cancelled the request"));
    }
    if (a.status.error_code() != grpc::StatusCode::UNAVAILABLE) break;
    sched_->ReportUnavailable(route->node_id);
    if (a.streamed || attempt > 0) break;
    // The node failed before the first token: once, on another replica.
    spdlog::warn("request for {} failed on node {} before its first token ({}): retrying",
                 req->model(), route->node_id, a.status.error_message());
    auto retry = sched_->RouteRequest(*req, cancelled, route->node_id);
    if (!retry.ok()) return finish(ToGrpc(retry.status()));
    route = std::move(retry);
  }
  if (!a.status.ok()) {
    if (a.status.error_code() == grpc::StatusCode::UNAVAILABLE) {
      a.status = grpc::Status(grpc::StatusCode::UNAVAILABLE,
                              absl::StrCat("node ", route->node_id,
                                           " failed during the request: ", a.status.error_message(),
                                           "; retry (sessions are recomputed)"));
    }
    return finish(a.status);
  }
  if (!a.final) {
    return finish(grpc::Status(grpc::StatusCode::INTERNAL, "node sent no final message"));
  }
  return finish(SendFinal(*req, *a.final, t0, ttft_ms, writer, &outcome));
}

grpc::Status InferenceService::SendFinal(const v1::GenerateRequest& req, const v1::NodeFinal& final,
                                         absl::Time t0, double ttft_ms,
                                         grpc::ServerWriter<v1::GenerateResponse>* writer,
                                         RequestOutcome* outcome) {
  v1::GenerateResponse out;
  v1::Final* f = out.mutable_final();
  *f = final.final();
  f->mutable_timings()->set_ttft_ms(ttft_ms >= 0 ? ttft_ms : MsSince(t0));
  f->mutable_timings()->set_e2e_ms(MsSince(t0));
  writer->Write(out);
  outcome->ttft_s = f->timings().ttft_ms() / 1000.0;
  if (f->usage().completion_tokens() > 1) outcome->tpot_s = f->timings().mean_tpot_ms() / 1000.0;
  outcome->tokens = f->usage().completion_tokens();
  // Prompt tokens whose KV was computed (reused session KV is not new load).
  sched_->RecordCompletion(req.model(),
                           f->usage().prompt_tokens() - f->usage().cached_prompt_tokens(),
                           f->usage().completion_tokens());
  return grpc::Status::OK;
}

grpc::Status InferenceService::Advise(grpc::ServerContext*, const v1::AdviseRequest* req,
                                      v1::AdviseResponse* resp) {
  auto r = sched_->Advise(*req);
  if (!r.ok()) return ToGrpc(r.status());
  *resp = std::move(*r);
  return grpc::Status::OK;
}

grpc::Status InferenceService::Invalidate(grpc::ServerContext*, const v1::InvalidateRequest* req,
                                          v1::InvalidateResponse*) {
  return ToGrpc(sched_->Invalidate(*req));
}

grpc::Status InferenceService::EndSession(grpc::ServerContext*, const v1::EndSessionRequest* req,
                                          v1::EndSessionResponse* resp) {
  if (req->session_id().empty()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "session_id is required");
  }
  if (auto st = global_scheduler::ValidateSessionId(req->session_id()); !st.ok()) {
    return ToGrpc(st);
  }
  resp->set_existed(sched_->EndSession(req->session_id()));
  return grpc::Status::OK;
}

grpc::Status InferenceService::ListModels(grpc::ServerContext*, const v1::ListModelsRequest*,
                                          v1::ListModelsResponse* resp) {
  *resp = sched_->ListModels();
  return grpc::Status::OK;
}

grpc::Status AdminService::RegisterModel(grpc::ServerContext*, const v1::RegisterModelRequest* req,
                                         v1::RegisterModelResponse*) {
  global_scheduler::ModelSpec spec;
  spec.name = req->name();
  spec.path = req->path();
  spec.kv_dtype = req->kv_dtype().empty() ? "auto" : req->kv_dtype();
  spec.ttft_ms = req->slo().ttft_ms();
  spec.tpot_ms = req->slo().tpot_ms();
  spec.replicas = req->replicas() == 0 ? 1 : req->replicas();
  spec.kv_floor_bytes = req->kv_floor_bytes();
  spec.kv_limit_bytes = req->kv_limit_bytes();
  return ToGrpc(sched_->RegisterModel(spec));
}

grpc::Status AdminService::MigrateModel(grpc::ServerContext*, const v1::MigrateModelRequest* req,
                                        v1::MigrateModelResponse*) {
  return ToGrpc(sched_->MigrateModel(req->name(), req->from_node(), req->to_node()));
}

grpc::Status AdminService::UnregisterModel(grpc::ServerContext*,
                                           const v1::UnregisterModelRequest* req,
                                           v1::UnregisterModelResponse*) {
  return ToGrpc(sched_->UnregisterModel(req->name()));
}

grpc::Status AdminService::GetClusterState(grpc::ServerContext*, const v1::GetClusterStateRequest*,
                                           v1::ClusterState* resp) {
  *resp = sched_->GetClusterState();
  return grpc::Status::OK;
}

grpc::Status RegistryService::Register(grpc::ServerContext*, const v1::RegisterNodeRequest* req,
                                       v1::RegisterNodeResponse* resp) {
  if (req->node_id().empty() || req->address().empty()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "node_id and address are required");
  }
  auto registered = sched_->RegisterNode(*req);
  if (!registered.ok()) return ToGrpc(registered.status());
  *resp = *registered;
  return grpc::Status::OK;
}

grpc::Status RegistryService::Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest* req,
                                        v1::HeartbeatResponse* resp) {
  *resp = sched_->Heartbeat(*req);
  return grpc::Status::OK;
}

}  // namespace ballast::server
