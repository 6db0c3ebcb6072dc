// Local request arbitration for one device's shared queue (Prism §6.2
// Algorithm 2, FineServe §6.3 Algorithm 2), as pure functions over
// request estimates so the policies are unit-tested against brute force.
//
// Policies:
//  * kFcfs: arrival order.
//  * kEdf: ascending TTFT deadline.
//  * kMooreHodgson (Prism): requests in ascending deadline are appended to
//    the schedule; whenever the running completion time (now + sum of
//    costs) passes the newest request's deadline, the request with the
//    longest cost in the schedule is dropped. Accepted requests are served
//    in deadline order, dropped ones after them (late, never discarded), in
//    deadline order. With chunked prefill a request's completion is the
//    sum of the costs queued before it, which makes this exactly the
//    single-machine problem Moore-Hodgson solves optimally (fewest misses).
//  * kFineServeBatch: requests that cannot meet their deadline even alone
//    (now + cost >= deadline) are set aside; the rest, in deadline order,
//    form a tentative batch from which the longest request is removed until
//    the whole batch's chunked-prefill time meets the earliest deadline
//    (the anchor); the batch is then trimmed to max_requests / max_tokens.
//    Order: the batch, then the other feasible requests, then the ones set
//    aside — all by deadline.
// Aging (promote_after_slo > 0; every policy): a request that has waited
// more than that many times its TTFT SLO (now - arrival > k x (deadline -
// arrival)) is served first, oldest first, ahead of the policy's order,
// which orders the rest as if starting when those end. Without it a
// request Moore-Hodgson or fineserve_batch put behind the others waits
// until no request still on time is queued: under sustained load, without
// bound (a 553-token request waited 20 s in an H200 run at rate 4).
// Ties break by lower id, so results are deterministic. Thread-safe (pure).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace ballast::node_manager {

enum class ArbitrationPolicy { kFcfs, kEdf, kMooreHodgson, kFineServeBatch };

absl::StatusOr<ArbitrationPolicy> ParseArbitrationPolicy(const std::string& name);

// Which of a device's overlapping steps run on a stream of the GPU's
// greatest priority (node.engine.priority_streams), so that their kernels
// are scheduled ahead of the others' (measured in docs/benchmarks.md).
enum class StreamPriorityPolicy {
  kNone,    // "none": every step at the default priority
  kFirst,   // "first": the step of the model holding the request the
            // arbitration policy put first (TTFT-urgent prefill)
  kDecode,  // "decode": every step with no prefill tokens (TPOT), ahead
            // of prefill chunks, which take what is left
};
absl::StatusOr<StreamPriorityPolicy> ParseStreamPriorityPolicy(const std::string& name);

struct PendingRequest {
  uint64_t id = 0;
  double arrival_s = 0;
  double deadline_s = 0;  // arrival + TTFT SLO
  double cost_s = 0;      // estimated prefill time (PrefillCostModel)
  int tokens = 0;         // prompt tokens still to prefill
};

struct Arbitration {
  std::vector<uint64_t> order;  // serve order, all requests exactly once
  int on_time = 0;              // requests expected to meet their deadline
  // kFineServeBatch only: how many leading entries of `order` form the batch.
  int batch = 0;
};

struct BatchLimits {
  int max_requests = 256;
  int max_tokens = 8192;
};

// Chunked-prefill time of a set of requests served together; defaults to
// the sum of their costs.
using BatchCost = std::function<double(absl::Span<const PendingRequest>)>;

// promote_after_slo: aging (above); 0, no aging. The leading requests of
// `order` it promoted are counted in `batch` (kFineServeBatch) too.
Arbitration Arbitrate(ArbitrationPolicy policy, std::vector<PendingRequest> requests, double now_s,
                      const BatchLimits& limits = {}, const BatchCost& batch_cost = {},
                      double promote_after_slo = 0);

// Requests of `order` that finish by their deadline when served back to
// back from `now_s` (the objective Moore-Hodgson maximises).
int CountOnTime(absl::Span<const PendingRequest> requests, absl::Span<const uint64_t> order,
                double now_s);

}  // namespace ballast::node_manager
