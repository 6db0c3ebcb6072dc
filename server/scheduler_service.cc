#include "server/scheduler_service.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "engine/model_config.h"
#include "global_scheduler/request_validation.h"
#include "proto/model_name.h"
#include "server/auth.h"
#include "server/scheduler_generate.h"
#include "server/status_util.h"
#include "server/tls.h"
#include "spdlog/spdlog.h"

namespace ballast::server {
namespace {

// The caller may use `model` (nullopt: authentication is off; an empty
// model is the session's, which its own Generate was allowed).
absl::Status CheckModel(const std::optional<Principal>& caller, const std::string& model) {
  if (!caller || model.empty()) return absl::OkStatus();
  return caller->CheckModel(model);
}

// The tenant a request acts as, filled in from the caller's key.
template <typename Req>
absl::Status ApplyTenant(const std::optional<Principal>& caller, Req* req) {
  if (!caller) return absl::OkStatus();
  auto tenant = caller->TenantFor(req->tenant());
  if (!tenant.ok()) return tenant.status();
  req->set_tenant(*tenant);
  return absl::OkStatus();
}

absl::Status RequireAdmin(KeyStore* keys, const grpc::ServerContext& ctx) {
  auto caller = CallerOf(keys, ctx);
  if (!caller.ok()) return caller.status();
  if (*caller && (*caller)->role != Role::kAdmin) {
    return absl::PermissionDeniedError(
        absl::StrCat("the Admin API needs an admin key; this one is tenant \"", (*caller)->tenant,
                     "\"'s user key"));
  }
  return absl::OkStatus();
}

// Ends an Advise call with `st`; a refusal's retry hint goes into the
// trailing metadata.
void FinishAdvise(grpc::ServerContextBase* ctx, grpc::ServerUnaryReactor* reactor,
                  const absl::Status& st) {
  AddRetryHint(ctx, st);
  reactor->Finish(ToGrpc(st));
}

// Admitted advisories past SchedulerOptions::advise_queue are refused; a
// retry this much later finds room unless the queue is flooded.
constexpr absl::Duration kAdviseQueueRetry = absl::Milliseconds(250);

absl::Status AdviseQueueFull(int queue) {
  return global_scheduler::QuotaExceeded(
      absl::StrCat("the scheduler's advisory queue is full (", queue, " waiting)"),
      kAdviseQueueRetry, "scheduler.advise_queue");
}

}  // namespace

grpc::ServerWriteReactor<grpc::ByteBuffer>* InferenceService::Generate(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req) {
  return StartSchedulerGenerate(sched_, metrics_, routing_.get(), keys_, ctx, req);
}

grpc::ServerUnaryReactor* InferenceService::Advise(grpc::CallbackServerContext* ctx,
                                                   const v1::AdviseRequest* in,
                                                   v1::AdviseResponse* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  v1::AdviseRequest req = *in;
  // A refusal: counted under `reason` (null: not counted) and ended now.
  auto refuse = [&](const absl::Status& st, const char* reason = nullptr) {
    if (reason != nullptr) metrics_->Rejection(reason, req.tenant());
    FinishAdvise(ctx, reactor, st);
    return reactor;
  };
  auto caller = CallerOf(keys_, *ctx);
  if (!caller.ok()) return refuse(caller.status());
  if (auto st = CheckModel(*caller, req.model()); !st.ok()) return refuse(st);
  for (const std::string& hop : req.next_hops()) {  // hops load models: the same rule
    if (auto st = CheckModel(*caller, hop); !st.ok()) return refuse(st);
  }
  if (auto st = ApplyTenant(*caller, &req); !st.ok()) return refuse(st);
  if (auto st = sched_->AdmitAdvisory(req.tenant()); !st.ok()) {
    const bool quota = st.code() == absl::StatusCode::kResourceExhausted;
    return refuse(st, quota ? Metrics::kRejectAdviseQuota : nullptr);
  }
  using Result = transfer::WorkerPool::ScheduleResult;
  // A copy (a refusal below still names the tenant).
  const Result queued = advise_->TrySchedule([this, ctx, reactor, resp, req] {
    auto r = sched_->AdviseAdmitted(req);
    if (r.ok()) *resp = std::move(*r);
    FinishAdvise(ctx, reactor, r.status());
  });
  switch (queued) {
    case Result::kQueued:
      return reactor;
    case Result::kFull:
      return refuse(AdviseQueueFull(sched_->options().advise_queue),
                    Metrics::kRejectAdviseQueueFull);
    case Result::kStopped:
      break;
  }
  return refuse(absl::UnavailableError("the scheduler is shutting down"));
}

grpc::Status InferenceService::Invalidate(grpc::ServerContext* ctx, const v1::InvalidateRequest* in,
                                          v1::InvalidateResponse*) {
  auto caller = CallerOf(keys_, *ctx);
  if (!caller.ok()) return ToGrpc(caller.status());
  v1::InvalidateRequest req = *in;
  if (auto st = CheckModel(*caller, req.model()); !st.ok()) return ToGrpc(st);
  if (auto st = ApplyTenant(*caller, &req); !st.ok()) return ToGrpc(st);
  return ToGrpc(sched_->Invalidate(req));
}

grpc::Status InferenceService::EndSession(grpc::ServerContext* ctx,
                                          const v1::EndSessionRequest* req,
                                          v1::EndSessionResponse* resp) {
  auto caller = CallerOf(keys_, *ctx);
  if (!caller.ok()) return ToGrpc(caller.status());
  if (req->session_id().empty()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "session_id is required");
  }
  if (auto st = global_scheduler::ValidateSessionId(req->session_id()); !st.ok()) {
    return ToGrpc(st);
  }
  std::optional<std::string> tenant;  // a user key ends only its tenant's sessions
  if (*caller && (*caller)->role != Role::kAdmin) tenant = (*caller)->tenant;
  auto ended = sched_->EndSession(req->session_id(), tenant);
  if (!ended.ok()) return ToGrpc(ended.status());
  resp->set_existed(*ended);
  return grpc::Status::OK;
}

grpc::Status InferenceService::ListModels(grpc::ServerContext* ctx, const v1::ListModelsRequest*,
                                          v1::ListModelsResponse* resp) {
  auto caller = CallerOf(keys_, *ctx);
  if (!caller.ok()) return ToGrpc(caller.status());
  *resp = sched_->ListModels();
  if (*caller) {  // only the models this key may use
    auto* models = resp->mutable_models();
    models->erase(
        std::remove_if(models->begin(), models->end(),
                       [&](const v1::ModelInfo& m) { return !(*caller)->AllowsModel(m.name()); }),
        models->end());
  }
  return grpc::Status::OK;
}

grpc::Status AdminService::RegisterModel(grpc::ServerContext* ctx,
                                         const v1::RegisterModelRequest* req,
                                         v1::RegisterModelResponse*) {
  if (auto st = RequireAdmin(keys_, *ctx); !st.ok()) return ToGrpc(st);
  global_scheduler::ModelSpec spec;
  spec.name = req->name();
  spec.path = req->path();
  spec.kv_dtype = req->kv_dtype().empty() ? "auto" : req->kv_dtype();
  // Empty is "none"; aliases take the engine's name, as in the config.
  auto quant = engine::WeightQuantFromConfig(req->quantization());
  if (!quant.ok()) {
    return ToGrpc(absl::InvalidArgumentError(
        absl::StrCat("model ", req->name(), ": ", quant.status().message())));
  }
  spec.quantization = engine::WeightQuantName(*quant);
  spec.ttft_ms = req->slo().ttft_ms();
  spec.tpot_ms = req->slo().tpot_ms();
  spec.replicas = req->replicas() == 0 ? 1 : req->replicas();
  spec.kv_floor_bytes = req->kv_floor_bytes();
  spec.kv_limit_bytes = req->kv_limit_bytes();
  return ToGrpc(sched_->RegisterModel(spec));
}

grpc::Status AdminService::MigrateModel(grpc::ServerContext* ctx,
                                        const v1::MigrateModelRequest* req,
                                        v1::MigrateModelResponse*) {
  if (auto st = RequireAdmin(keys_, *ctx); !st.ok()) return ToGrpc(st);
  return ToGrpc(sched_->MigrateModel(req->name(), req->from_node(), req->to_node()));
}

grpc::Status AdminService::DrainNode(grpc::ServerContext* ctx, const v1::DrainNodeRequest* req,
                                     v1::DrainNodeResponse* resp) {
  if (auto st = RequireAdmin(keys_, *ctx); !st.ok()) return ToGrpc(st);
  if (req->node_id().empty()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "node_id is required");
  }
  auto r = sched_->DrainNode(req->node_id(), req->undo());
  if (!r.ok()) return ToGrpc(r.status());
  *resp = std::move(*r);
  return grpc::Status::OK;
}

grpc::Status AdminService::UnregisterModel(grpc::ServerContext* ctx,
                                           const v1::UnregisterModelRequest* req,
                                           v1::UnregisterModelResponse*) {
  if (auto st = RequireAdmin(keys_, *ctx); !st.ok()) return ToGrpc(st);
  return ToGrpc(sched_->UnregisterModel(req->name()));
}

grpc::Status AdminService::GetClusterState(grpc::ServerContext* ctx,
                                           const v1::GetClusterStateRequest*,
                                           v1::ClusterState* resp) {
  if (auto st = RequireAdmin(keys_, *ctx); !st.ok()) return ToGrpc(st);
  *resp = sched_->GetClusterState();
  return grpc::Status::OK;
}

grpc::Status RegistryService::CheckPeer(const grpc::ServerContext& ctx,
                                        const std::string& node_id) const {
  if (!require_node_cert_) return grpc::Status::OK;
  return ToGrpc(CheckNodeIdentity(*ctx.auth_context(), node_id));
}

grpc::Status RegistryService::Register(grpc::ServerContext* ctx, const v1::RegisterNodeRequest* req,
                                       v1::RegisterNodeResponse* resp) {
  if (req->node_id().empty() || req->address().empty()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "node_id and address are required");
  }
  if (grpc::Status st = CheckPeer(*ctx, req->node_id()); !st.ok()) return st;
  auto registered = sched_->RegisterNode(*req);
  if (!registered.ok()) return ToGrpc(registered.status());
  *resp = *registered;
  return grpc::Status::OK;
}

grpc::Status RegistryService::Heartbeat(grpc::ServerContext* ctx, const v1::HeartbeatRequest* req,
                                        v1::HeartbeatResponse* resp) {
  if (grpc::Status st = CheckPeer(*ctx, req->node_id()); !st.ok()) return st;
  *resp = sched_->Heartbeat(*req);
  return grpc::Status::OK;
}

}  // namespace ballast::server
