// NodeService: the gRPC face of a NodeManager (node.proto's Node service):
// load/evict, token streaming for routed requests, session drops, Advise
// prefetches and peer KV fetches. It polls
// for client cancellation while a request runs and cancels it in the
// engine, so a client that goes away frees its sequence.
//
// Thread-safety: gRPC calls handlers concurrently; all state is in the
// thread-safe NodeManager and Metrics.
#pragma once

#include "ballast/v1/node.grpc.pb.h"
#include "node_manager/node_manager.h"
#include "server/metrics.h"

namespace ballast::server {

class NodeService final : public v1::Node::Service {
 public:
  NodeService(node_manager::NodeManager* node, Metrics* metrics) : node_(node), metrics_(metrics) {}

  grpc::Status LoadModel(grpc::ServerContext* ctx, const v1::LoadModelRequest* req,
                         v1::LoadModelResponse* resp) override;
  grpc::Status SetKvLimits(grpc::ServerContext* ctx, const v1::SetKvLimitsRequest* req,
                           v1::SetKvLimitsResponse* resp) override;
  grpc::Status EvictModel(grpc::ServerContext* ctx, const v1::EvictModelRequest* req,
                          v1::EvictModelResponse* resp) override;
  grpc::Status Generate(grpc::ServerContext* ctx, const v1::NodeGenerateRequest* req,
                        grpc::ServerWriter<v1::NodeGenerateResponse>* writer) override;
  grpc::Status DropSession(grpc::ServerContext* ctx, const v1::DropSessionRequest* req,
                           v1::DropSessionResponse* resp) override;
  grpc::Status FetchKv(grpc::ServerContext* ctx, const v1::FetchKvRequest* req,
                       grpc::ServerWriter<v1::KvChunk>* writer) override;
  grpc::Status PrefetchKv(grpc::ServerContext* ctx, const v1::PrefetchKvRequest* req,
                          v1::PrefetchKvResponse* resp) override;
  grpc::Status DropPrefetch(grpc::ServerContext* ctx, const v1::DropPrefetchRequest* req,
                            v1::DropPrefetchResponse* resp) override;

 private:
  node_manager::NodeManager* node_;
  Metrics* metrics_;
};

// Copies engine results into the wire types.
v1::FinishReason ToProto(engine::FinishReason r);
v1::KvSource ToProto(engine::KvSource s);

}  // namespace ballast::server
