// The scheduler's Generate on gRPC's callback API: a client's stream is
// proxied to the node that routing picked, with no thread per stream and no
// polling. Routing (Scheduler::BeginRoute/TryRoute) runs on a bounded pool;
// while no replica is ready the stream parks with the scheduler's waiters
// (AwaitReplica), holding no thread. The node's stream is read with the
// callback client (an Upstream, server/scheduler_upstream.h), one message
// at a time, ahead of the client's writes into a TokenRelay (token_relay.h)
// of at most TokenRelay::kMaxTokens tokens; when it is full, reading waits
// for the client (flow control end to end). A node that fails
// UNAVAILABLE, or does not accept within node_accept_timeout, before the
// first token is retried once on another replica; a client that cancels
// (or stops reading) cancels the node call.
//
// Lifetime: the stream deletes itself once gRPC is done with it, no node
// call is in flight, no routing is pending and no acceptance alarm is
// outstanding.
//
// Thread-safety: gRPC reactions (server and client side) and the routing
// pool call in concurrently; state is guarded by one mutex, and no gRPC
// call is made while holding it.
#pragma once

#include <grpcpp/grpcpp.h>

#include "ballast/v1/inference.grpc.pb.h"
#include "global_scheduler/scheduler.h"
#include "server/auth.h"
#include "server/metrics.h"
#include "transfer/worker_pool.h"

namespace ballast::server {

// Starts the stream for the raw request `raw` (gRPC owns the returned
// reactor). The method is raw so that a request with invalid UTF-8 in a
// string field is refused INVALID_ARGUMENT naming the field, not INTERNAL
// (request_parse.h); responses are GenerateResponse messages.
// `keys`: API keys checked before routing (null: none).
grpc::ServerWriteReactor<grpc::ByteBuffer>* StartSchedulerGenerate(
    global_scheduler::Scheduler* sched, Metrics* metrics, transfer::WorkerPool* routing,
    KeyStore* keys, grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* raw);

// What the scheduler sends a node for `req` along `route` (t0: its arrival).
v1::NodeGenerateRequest NodeRequest(const v1::GenerateRequest& req,
                                    const global_scheduler::Route& route, absl::Time t0);

}  // namespace ballast::server
