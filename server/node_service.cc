#include "server/node_service.h"

#include "absl/strings/str_cat.h"
#include "server/node_generate.h"
#include "server/status_util.h"

namespace ballast::server {

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

// The wire's "0 = none" to TenantLimits.
static memory::TenantLimits KvLimits(int64_t floor, int64_t limit) {
  memory::TenantLimits l;
  l.floor_bytes = floor;
  if (limit > 0) l.limit_bytes = limit;
  return l;
}

grpc::Status NodeService::LoadModel(grpc::ServerContext*, const v1::LoadModelRequest* req,
                                    v1::LoadModelResponse* resp) {
  auto m =
      node_->LoadModel(req->name(), req->path(), req->kv_dtype(), req->device(),
                       KvLimits(req->kv_floor_bytes(), req->kv_limit_bytes()), req->quantization());
  if (!m.ok()) return ToGrpc(m.status());
  metrics_->Activation(req->name(), m->from_host_copy() ? "host_copy" : "disk",
                       m->activation_ms() / 1000.0);
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
  const std::string label = metrics_->ModelLabel(req->name());
  absl::Status st = node_->EvictModel(req->name(), req->drain(), !req->drop_host_copy(),
                                      absl::Milliseconds(req->drain_timeout_ms()));
  if (st.ok()) metrics_->Eviction(label);
  return ToGrpc(st);
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

grpc::ServerWriteReactor<v1::NodeGenerateResponse>* NodeService::Generate(
    grpc::CallbackServerContext* ctx, const v1::NodeGenerateRequest* req) {
  return StartNodeGenerate(node_, metrics_, admission_.get(), delivery_.get(), ctx, req);
}

}  // namespace ballast::server
