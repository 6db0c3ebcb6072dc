// The scheduler's gRPC services: the public Inference API (Generate proxies
// the token stream from the chosen node), Admin, and the NodeRegistry that
// nodes register and heartbeat with. Decisions are the Scheduler's; this
// file only moves messages and maps statuses.
//
// Thread-safety: handlers run concurrently; shared state lives in the
// thread-safe Scheduler and Metrics.
#pragma once

#include <memory>

#include "ballast/v1/admin.grpc.pb.h"
#include "ballast/v1/inference.grpc.pb.h"
#include "ballast/v1/node.grpc.pb.h"
#include "global_scheduler/scheduler.h"
#include "server/auth.h"
#include "server/metrics.h"
#include "transfer/worker_pool.h"

namespace ballast::server {

// Generate (server/scheduler_generate.h) and Advise run on gRPC's callback
// API: no thread per call. Shut the gRPC server down before destroying it.
// Advise refuses over-quota calls on gRPC's own thread (a flood costs no
// hand-off) and runs admitted ones, which may call a node, on a bounded
// pool of their own (SchedulerOptions::advise_threads, advise_queue), never
// on Generate's routing pool: advisories cannot hold up routing. A full
// queue refuses RESOURCE_EXHAUSTED with a retry hint, as a quota does.
class InferenceService final
    : public v1::Inference::WithCallbackMethod_Advise<
          v1::Inference::WithRawCallbackMethod_Generate<v1::Inference::Service>> {
 public:
  // Threads that route requests (validation, session checks, the pick;
  // requests waiting for a replica park without a thread), whatever the
  // number of streams.
  static constexpr int kRoutingThreads = 32;

  // `keys`: API keys (server/auth.h); null: no authentication.
  InferenceService(global_scheduler::Scheduler* s, Metrics* m, KeyStore* keys = nullptr)
      : sched_(s),
        metrics_(m),
        keys_(keys),
        routing_(std::make_unique<transfer::WorkerPool>(kRoutingThreads, 0, "sched-route")),
        advise_(std::make_unique<transfer::WorkerPool>(
            s->options().advise_threads, s->options().advise_queue, "sched-advise")) {}

  // Raw: parsed by StartSchedulerGenerate (request_parse.h).
  grpc::ServerWriteReactor<grpc::ByteBuffer>* Generate(grpc::CallbackServerContext* ctx,
                                                       const grpc::ByteBuffer* req) override;
  grpc::ServerUnaryReactor* Advise(grpc::CallbackServerContext* ctx, const v1::AdviseRequest* req,
                                   v1::AdviseResponse* resp) override;
  grpc::Status Invalidate(grpc::ServerContext* ctx, const v1::InvalidateRequest* req,
                          v1::InvalidateResponse* resp) override;
  grpc::Status EndSession(grpc::ServerContext* ctx, const v1::EndSessionRequest* req,
                          v1::EndSessionResponse* resp) override;
  grpc::Status ListModels(grpc::ServerContext* ctx, const v1::ListModelsRequest* req,
                          v1::ListModelsResponse* resp) override;

  // The pool admitted advisories run on (tests watch it).
  const transfer::WorkerPool& advisories() const { return *advise_; }

 private:
  global_scheduler::Scheduler* sched_;
  Metrics* metrics_;
  KeyStore* keys_;  // null: no authentication
  std::unique_ptr<transfer::WorkerPool> routing_;
  // Admitted advisories (declared last: stopped first, running what is queued).
  std::unique_ptr<transfer::WorkerPool> advise_;
};

class AdminService final : public v1::Admin::Service {
 public:
  // `keys`: only admin keys may call (server/auth.h); null: anyone.
  explicit AdminService(global_scheduler::Scheduler* s, KeyStore* keys = nullptr)
      : sched_(s), keys_(keys) {}
  grpc::Status RegisterModel(grpc::ServerContext* ctx, const v1::RegisterModelRequest* req,
                             v1::RegisterModelResponse* resp) override;
  grpc::Status UnregisterModel(grpc::ServerContext* ctx, const v1::UnregisterModelRequest* req,
                               v1::UnregisterModelResponse* resp) override;
  grpc::Status GetClusterState(grpc::ServerContext* ctx, const v1::GetClusterStateRequest* req,
                               v1::ClusterState* resp) override;
  grpc::Status MigrateModel(grpc::ServerContext* ctx, const v1::MigrateModelRequest* req,
                            v1::MigrateModelResponse* resp) override;
  grpc::Status DrainNode(grpc::ServerContext* ctx, const v1::DrainNodeRequest* req,
                         v1::DrainNodeResponse* resp) override;

 private:
  global_scheduler::Scheduler* sched_;
  KeyStore* keys_;  // null: no authentication
};

class RegistryService final : public v1::NodeRegistry::Service {
 public:
  // `require_node_cert`: the port has TLS, and only callers with a
  // certificate it verified (the cluster CA's) may register or heartbeat.
  RegistryService(global_scheduler::Scheduler* s, bool require_node_cert)
      : sched_(s), require_node_cert_(require_node_cert) {}
  grpc::Status Register(grpc::ServerContext* ctx, const v1::RegisterNodeRequest* req,
                        v1::RegisterNodeResponse* resp) override;
  grpc::Status Heartbeat(grpc::ServerContext* ctx, const v1::HeartbeatRequest* req,
                         v1::HeartbeatResponse* resp) override;

 private:
  // With TLS: the caller's certificate names node `node_id`.
  grpc::Status CheckPeer(const grpc::ServerContext& ctx, const std::string& node_id) const;

  global_scheduler::Scheduler* sched_;
  const bool require_node_cert_;
};

}  // namespace ballast::server
