// Scheduler's session steps: beginning a turn (with the lost-history
// check), ending sessions and expiring idle ones (see scheduler.h and
// session_directory.h for the rules).
#include <grpcpp/grpcpp.h>

#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "global_scheduler/scheduler.h"
#include "spdlog/spdlog.h"

namespace ballast::global_scheduler {

// How long the lost-history check waits for a node's answer.
constexpr absl::Duration kSessionProbeTimeout = absl::Milliseconds(500);
// How long EndSession waits for the nodes to drop the session.
constexpr absl::Duration kEndSessionTimeout = absl::Seconds(2);

absl::Status Scheduler::BeginSessionTurn(const v1::GenerateRequest& req, Route* route,
                                         std::string* affinity) {
  auto turn = sessions_.Begin(route->session_id, req.model(), !req.messages().empty(), req.tenant(),
                              quotas_.MaxSessions(req.tenant()));
  if (!turn.ok()) return turn.status();
  if (turn->fresh && NodesKnowSession(route->session_id)) {
    sessions_.MarkLost(route->session_id, LostReason::kForgotten);
    spdlog::warn("session {}: a node served it but the scheduler has no history",
                 route->session_id);
    return SessionDirectory::LostError(route->session_id, LostReason::kForgotten);
  }
  route->history = std::move(turn->history);
  route->history_messages = std::move(turn->messages);
  *affinity = turn->node_id;
  return absl::OkStatus();
}

absl::StatusOr<bool> Scheduler::EndSession(const std::string& session_id,
                                           const std::optional<std::string>& tenant) {
  bool existed = false;
  auto ended = sessions_.End(session_id, &existed, tenant);
  if (!ended.ok()) return ended.status();
  if (tenant && !existed) return false;  // unknown to us: nothing of this tenant's to drop
  // Dropped everywhere before the client hears back: a turn that reuses the
  // id right after must find no node that still knows it (else the
  // lost-history check would take it for a forgotten session).
  AskNodesToDrop(session_id, kEndSessionTimeout);
  return existed;
}

void Scheduler::DropOnNodes(const std::string& session_id) {
  for (const auto& n : cluster_.Snapshot()) {
    if (!n.alive) continue;
    auto stub = Stub(n.node_id);
    if (!stub) continue;
    pool_->Schedule([stub, session_id] {
      v1::DropSessionRequest req;
      req.set_session_id(session_id);
      v1::DropSessionResponse resp;
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
      stub->DropSession(&ctx, req, &resp);
    });
  }
}

bool Scheduler::NodesKnowSession(const std::string& session_id) {
  return AskNodesToDrop(session_id, kSessionProbeTimeout);
}

bool Scheduler::AskNodesToDrop(const std::string& session_id, absl::Duration timeout) {
  // Asked of all nodes at once, on one completion queue owned by this
  // thread: every call ends (answer or deadline) before it returns.
  struct Call {
    grpc::ClientContext ctx;
    v1::DropSessionResponse resp;
    grpc::Status status;
    std::unique_ptr<grpc::ClientAsyncResponseReaderInterface<v1::DropSessionResponse>> reader;
  };
  grpc::CompletionQueue cq;
  v1::DropSessionRequest req;
  req.set_session_id(session_id);
  const auto deadline = absl::ToChronoTime(absl::Now() + timeout);
  std::vector<std::unique_ptr<Call>> calls;
  for (const auto& n : cluster_.Snapshot()) {
    if (!n.alive || n.suspect) continue;
    auto stub = Stub(n.node_id);
    if (!stub) continue;
    auto c = std::make_unique<Call>();
    c->ctx.set_deadline(deadline);
    c->reader = stub->AsyncDropSession(&c->ctx, req, &cq);
    if (!c->reader) continue;
    c->reader->Finish(&c->resp, &c->status, c.get());
    calls.push_back(std::move(c));
  }
  bool known = false;
  void* tag = nullptr;
  bool ok = false;
  for (size_t i = 0; i < calls.size() && cq.Next(&tag, &ok); ++i) {
    const Call* c = static_cast<const Call*>(tag);
    if (ok && c->status.ok() && c->resp.existed()) known = true;
  }
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  return known;
}

void Scheduler::ExpireSessions() {
  if (options_.session_ttl <= absl::ZeroDuration()) return;
  // A pass walks every session: at most one a second, not every tick.
  const absl::Time now = clock_();
  if (now - last_session_sweep_ < absl::Seconds(1)) return;
  last_session_sweep_ = now;
  const auto expired = sessions_.Expire(options_.session_ttl);
  if (!expired.empty()) spdlog::info("{} idle session(s) expired", expired.size());
  for (const auto& [id, node] : expired) DropOnNodes(id);
}

}  // namespace ballast::global_scheduler
