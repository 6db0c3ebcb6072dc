// A routed request's token stream on the node, on gRPC's callback API: no
// thread per stream and no polling. The request is admitted
// (NodeManager::Submit: tokenizing, reading the KV tiers, which may wait on
// a disk or a peer) on a small shared pool; the engine's step thread then
// pushes tokens and the final result into the stream, which writes one
// message at a time as gRPC completes the previous one. A client that
// cancels (or whose write fails) cancels the sequence in the engine.
//
// Lifetime: the stream is both gRPC's reactor and the engine's sink; it
// deletes itself once gRPC is done with it (OnDone) and the engine has
// delivered its result (or the request was never admitted).
//
// Thread-safety: gRPC's reactions, the admission pool and the engine's
// step thread call in concurrently; state is guarded by one mutex, and no
// gRPC call is made while holding it.
#pragma once

#include <grpcpp/grpcpp.h>

#include "ballast/v1/node.grpc.pb.h"
#include "engine/generation.h"
#include "node_manager/node_manager.h"
#include "server/metrics.h"
#include "transfer/worker_pool.h"

namespace ballast::server {

// Starts the stream for `req` (gRPC owns the returned reactor).
grpc::ServerWriteReactor<v1::NodeGenerateResponse>* StartNodeGenerate(
    node_manager::NodeManager* node, Metrics* metrics, transfer::WorkerPool* admission,
    grpc::CallbackServerContext* ctx, const v1::NodeGenerateRequest* req);

// The metrics label of a KV source.
std::string KvSourceLabel(engine::KvSource s);

}  // namespace ballast::server
