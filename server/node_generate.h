// A routed request's token stream on the node, on gRPC's callback API: no
// thread per stream and no polling. The request is admitted
// (NodeManager::Submit: tokenizing, reading the KV tiers, which may wait on
// a disk or a peer) on a small shared pool; the engine's step thread then
// pushes tokens and the final result into the stream, which writes one
// message at a time as gRPC completes the previous one. A caller that set
// token_batches gets the tokens queued behind a write in one message
// (NodeGenerateResponse.tokens, up to 256), so a stream that falls behind
// catches up in fewer writes. A client that
// cancels (or whose write fails) cancels the sequence in the engine.
//
// Lifetime: the stream is both gRPC's reactor and the engine's sink; it
// deletes itself once gRPC is done with it (OnDone), the engine has
// delivered its result (or the request was never admitted) and no
// delivery it scheduled is still to run.
//
// Thread-safety: gRPC's reactions, the admission pool, the delivery pool
// and the engine's step thread call in concurrently; state is guarded by
// one mutex, and no gRPC call is made while holding it. The step thread
// only records its event (a token, the result) under that mutex: it never
// builds a message nor calls gRPC. When the stream has no write
// outstanding and no delivery posted, it posts the stream to the delivery
// queue (server/delivery_queue.h: a few shared pool threads), which builds
// the next message and starts its write, or the Finish; gRPC's reactions
// (OnWriteDone, OnCancel, OnDone) and the admission pump inline as before.
// A stopping delivery pool runs the pump inline: nothing hangs.
#pragma once

#include <grpcpp/grpcpp.h>

#include "ballast/v1/node.grpc.pb.h"
#include "engine/generation.h"
#include "node_manager/node_manager.h"
#include "server/delivery_queue.h"
#include "server/metrics.h"
#include "transfer/worker_pool.h"

namespace ballast::server {

// Starts the stream for `req` (gRPC owns the returned reactor): admitted on
// `admission`, its messages built and written on `delivery` (both must
// outlive every stream whose gRPC call is not done: shut the server down
// first).
grpc::ServerWriteReactor<v1::NodeGenerateResponse>* StartNodeGenerate(
    node_manager::NodeManager* node, Metrics* metrics, transfer::WorkerPool* admission,
    DeliveryQueue* delivery, grpc::CallbackServerContext* ctx, const v1::NodeGenerateRequest* req);

// The metrics label of a KV source.
std::string KvSourceLabel(engine::KvSource s);

}  // namespace ballast::server
