// NodeService: the gRPC face of a NodeManager (node.proto's Node service):
// load/evict, token streaming for routed requests, session drops, Advise
// prefetches and peer KV fetches. Generate runs on gRPC's callback API
// (server/node_generate.h): no thread per stream; a client that goes away
// cancels its sequence in the engine. Streams are admitted on one small
// pool and their messages written from another, never on a step thread.
//
// Thread-safety: gRPC calls handlers concurrently; all state is in the
// thread-safe NodeManager and Metrics. Shut the gRPC server down before
// destroying the service.
#pragma once

#include <memory>

#include "ballast/v1/node.grpc.pb.h"
#include "node_manager/node_manager.h"
#include "server/delivery_queue.h"
#include "server/metrics.h"
#include "transfer/worker_pool.h"

namespace ballast::server {

class NodeService final : public v1::Node::WithCallbackMethod_Generate<v1::Node::Service> {
 public:
  // Threads that admit requests (NodeManager::Submit: tokenizing, reading
  // the KV tiers), whatever the number of streams.
  static constexpr int kAdmissionThreads = 8;
  // Threads that build and start the streams' writes, off the engines'
  // step threads (server/delivery_queue.h), whatever the number of streams.
  static constexpr int kDefaultDeliveryThreads = 2;

  NodeService(node_manager::NodeManager* node, Metrics* metrics,
              int delivery_threads = kDefaultDeliveryThreads)
      : node_(node),
        metrics_(metrics),
        delivery_(std::make_unique<DeliveryQueue>(delivery_threads)),
        admission_(std::make_unique<transfer::WorkerPool>(kAdmissionThreads, 0, "node-admit")) {}

  grpc::Status LoadModel(grpc::ServerContext* ctx, const v1::LoadModelRequest* req,
                         v1::LoadModelResponse* resp) override;
  grpc::Status SetKvLimits(grpc::ServerContext* ctx, const v1::SetKvLimitsRequest* req,
                           v1::SetKvLimitsResponse* resp) override;
  grpc::Status EvictModel(grpc::ServerContext* ctx, const v1::EvictModelRequest* req,
                          v1::EvictModelResponse* resp) override;
  grpc::ServerWriteReactor<v1::NodeGenerateResponse>* Generate(
      grpc::CallbackServerContext* ctx, const v1::NodeGenerateRequest* req) override;
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
  // Declared first, stopped last: admissions still queued at destruction
  // run while it stands.
  std::unique_ptr<DeliveryQueue> delivery_;
  std::unique_ptr<transfer::WorkerPool> admission_;
};

// Copies engine results into the wire types.
v1::FinishReason ToProto(engine::FinishReason r);
v1::KvSource ToProto(engine::KvSource s);

}  // namespace ballast::server
