// NodeRequest (scheduler_generate.h): what the scheduler asks a node for
// one routed attempt of a client's Generate.
#include <atomic>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/scheduler_generate.h"

namespace ballast::server {
namespace {

// The node-side key of one attempt (its Cancel), unique per attempt; the
// client's request id travels separately (server/request_id.h).
std::string NewAttemptId() {
  static std::atomic<uint64_t> counter{0};
  thread_local absl::BitGen gen;
  return absl::StrCat("req-", counter.fetch_add(1), "-",
                      absl::Hex(absl::Uniform<uint32_t>(gen), absl::kZeroPad8));
}

}  // namespace

v1::NodeGenerateRequest NodeRequest(const v1::GenerateRequest& req,
                                    const global_scheduler::Route& route, absl::Time t0) {
  v1::NodeGenerateRequest nreq;
  nreq.set_request_id(NewAttemptId());
  nreq.set_model(req.model());
  for (int t : route.history) nreq.add_history_tokens(t);
  nreq.set_prompt(req.prompt());
  for (const auto& m : route.history_messages) *nreq.add_history_messages() = m;
  *nreq.mutable_messages() = req.messages();
  nreq.set_session_id(req.session_id());
  nreq.set_tenant(req.tenant());
  nreq.set_kv_peer(route.kv_peer);
  *nreq.mutable_sampling() = req.sampling();
  nreq.mutable_slo()->set_ttft_ms(route.ttft_ms);
  nreq.mutable_slo()->set_tpot_ms(route.tpot_ms);
  nreq.set_priority(req.priority());
  nreq.set_reject_if_slo_unmet(req.reject_if_slo_unmet());
  nreq.set_scheduler_ms(absl::ToDoubleMilliseconds(absl::Now() - t0));
  nreq.set_token_batches(true);  // relayed a token per message if the client wants
  return nreq;
}

}  // namespace ballast::server
