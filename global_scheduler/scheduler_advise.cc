// Scheduler's advisory requests (Symphony §3): Advise and Invalidate.
//
// Advise rule (where the next turn runs, and where its KV comes from):
//   1. The serving node is the session's affinity node if it has the model
//      READY, else the least loaded node with the model READY (the same
//      choice RouteRequest makes, so the turn lands where the prefetch
//      went). Moving a session to its KV's node beats moving the KV when
//      that node can serve; when it cannot (the model is not there, or the
//      node is dead), the KV moves.
//   2. If the serving node is not the affinity node and the affinity node
//      is alive, the serving node fetches what its own tiers lack from the
//      affinity node's tiers (peer transfer); a dead one means recompute.
//   3. The serving node becomes the session's affinity.
//   4. The prefetch is released at expected_arrival_ms + kAdviseGrace (or
//      kAdviseDefaultTtl when no arrival is given) if no turn used it.
//   5. next_hops: each registered model counts a request now, so the
//      control loop activates it if it has no replica (placement as for a
//      real request).
// Hints are advisory: Advise never fails a later turn, and a node that
// cannot take the KV (no free device memory) answers with 0 tokens.
#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "global_scheduler/request_validation.h"
#include "global_scheduler/scheduler.h"
#include "proto/model_name.h"

namespace ballast::global_scheduler {

namespace {
constexpr absl::Duration kAdviseGrace = absl::Seconds(30);
constexpr absl::Duration kAdviseDefaultTtl = absl::Minutes(2);
constexpr absl::Duration kAdviseRpcTimeout = absl::Seconds(30);

// The session a hint names, after checking the id and tenant (both hints).
absl::StatusOr<SessionDirectory::Snapshot> PeekHinted(const SessionDirectory& sessions,
                                                      const std::string& session_id,
                                                      const std::string& tenant) {
  if (session_id.empty()) return absl::InvalidArgumentError("session_id is required");
  if (auto st = ValidateSessionId(session_id); !st.ok()) return st;
  if (auto st = ValidateTenant(tenant); !st.ok()) return st;
  return sessions.Peek(session_id, tenant);
}

absl::Status FromGrpc(const grpc::Status& s, const std::string& node) {
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      absl::StrCat("node ", node, ": ", s.error_message()));
}
}  // namespace

std::string Scheduler::PeerAddress(const std::string& affinity, const std::string& serving) const {
  if (affinity.empty() || affinity == serving) return "";
  auto info = cluster_.Get(affinity);
  if (!info || !info->alive || info->suspect) return "";
  return info->address;
}

absl::StatusOr<v1::AdviseResponse> Scheduler::Advise(const v1::AdviseRequest& req) {
  if (auto st = AdmitAdvisory(req.tenant()); !st.ok()) return st;
  return AdviseAdmitted(req);
}

absl::Status Scheduler::AdmitAdvisory(const std::string& tenant) {
  return quotas_.AdmitAdvisory(tenant);
}

absl::StatusOr<v1::AdviseResponse> Scheduler::AdviseAdmitted(const v1::AdviseRequest& req) {
  auto session = PeekHinted(sessions_, req.session_id(), req.tenant());
  if (!session.ok()) return session.status();
  const std::string& model = req.model().empty() ? session->model : req.model();
  if (auto st = ValidateModelName(model); !st.ok()) return st;
  if (!registry_.Get(model)) {
    return absl::NotFoundError(absl::StrCat("model \"", model, "\" is not registered"));
  }
  for (const std::string& hop : req.next_hops()) {
    if (ValidateModelName(hop).ok() && registry_.Get(hop)) registry_.RecordRequest(hop, clock_());
  }
  if (!req.next_hops().empty()) Kick();
  v1::AdviseResponse resp;
  resp.set_source(v1::KV_SOURCE_NONE);
  // The session's KV is its model's: another model's turn can only be
  // made resident.
  if (model != session->model) {
    registry_.RecordRequest(model, clock_());
    Kick();
    return resp;
  }
  auto nodes = cluster_.NodesWithModel(model);
  std::optional<std::string> pick;
  if (std::find(nodes.begin(), nodes.end(), session->node_id) != nodes.end()) {
    pick = session->node_id;
  } else {
    pick = cluster_.LeastLoaded(nodes);
  }
  if (!pick) {  // not resident anywhere: activate it; nothing to prefetch into yet
    registry_.RecordRequest(model, clock_());
    Kick();
    return resp;
  }
  auto stub = Stub(*pick);
  if (!stub) return absl::UnavailableError(absl::StrCat("node ", *pick, " is unreachable"));
  v1::PrefetchKvRequest p;
  p.set_session_id(req.session_id());
  p.set_model(model);
  p.set_tenant(req.tenant());
  p.mutable_tokens()->Add(session->tokens.begin(), session->tokens.end());
  p.set_kv_peer(PeerAddress(session->node_id, *pick));
  const absl::Duration ttl = req.expected_arrival_ms() > 0
                                 ? absl::Milliseconds(req.expected_arrival_ms()) + kAdviseGrace
                                 : kAdviseDefaultTtl;
  p.set_ttl_ms(static_cast<uint32_t>(absl::ToInt64Milliseconds(ttl)));
  p.set_priority(req.priority());
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + kAdviseRpcTimeout));
  v1::PrefetchKvResponse got;
  const grpc::Status st = stub->PrefetchKv(&ctx, p, &got);
  resp.set_node_id(*pick);
  if (st.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) return resp;  // advisory
  if (!st.ok()) return FromGrpc(st, *pick);
  sessions_.SetAffinity(req.session_id(), *pick);
  resp.set_prefetched_tokens(got.tokens());
  resp.set_source(got.source());
  return resp;
}

absl::Status Scheduler::Invalidate(const v1::InvalidateRequest& req) {
  auto session = PeekHinted(sessions_, req.session_id(), req.tenant());
  if (!session.ok()) return session.status();
  if (session->node_id.empty()) return absl::OkStatus();  // nothing prefetched anywhere
  auto stub = Stub(session->node_id);
  if (!stub) return absl::OkStatus();  // its node is gone, and the prefetch with it
  v1::DropPrefetchRequest d;
  d.set_session_id(req.session_id());
  d.set_model(req.model().empty() ? session->model : req.model());
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + kAdviseRpcTimeout));
  v1::DropPrefetchResponse resp;
  const grpc::Status st = stub->DropPrefetch(&ctx, d, &resp);
  if (!st.ok() && st.error_code() != grpc::StatusCode::NOT_FOUND) {
    return FromGrpc(st, session->node_id);
  }
  return absl::OkStatus();
}

}  // namespace ballast::global_scheduler
