#include "node_manager/arbitration.h"

#include <algorithm>
#include <map>
#include <queue>

#include "absl/strings/str_cat.h"

namespace ballast::node_manager {
namespace {

bool ByDeadline(const PendingRequest& a, const PendingRequest& b) {
  return a.deadline_s < b.deadline_s || (a.deadline_s == b.deadline_s && a.id < b.id);
}

std::vector<uint64_t> Ids(const std::vector<PendingRequest>& v) {
  std::vector<uint64_t> out;
  out.reserve(v.size());
  for (const auto& r : v) out.push_back(r.id);
  return out;
}

// On-time count of `rs` served in its current order from `now`.
int OnTimeInOrder(const std::vector<PendingRequest>& rs, double now) {
  double t = now;
  int n = 0;
  for (const auto& r : rs) {
    t += r.cost_s;
    n += t <= r.deadline_s;
  }
  return n;
}

Arbitration MooreHodgson(std::vector<PendingRequest> rs, double now) {
  std::sort(rs.begin(), rs.end(), ByDeadline);
  // Max-heap of (cost, index) over the accepted set: longest first, and
  // among equal costs the later-deadline one.
  std::priority_queue<std::pair<double, size_t>> longest;
  std::vector<bool> dropped(rs.size(), false);
  double t = now;
  for (size_t i = 0; i < rs.size(); ++i) {
    longest.push({rs[i].cost_s, i});
    t += rs[i].cost_s;
    if (t > rs[i].deadline_s) {
      const auto [cost, j] = longest.top();
      longest.pop();
      dropped[j] = true;
      t -= cost;
    }
  }
  Arbitration a;
  a.order.reserve(rs.size());
  for (size_t i = 0; i < rs.size(); ++i)
    if (!dropped[i]) a.order.push_back(rs[i].id);
  a.on_time = static_cast<int>(a.order.size());
  for (size_t i = 0; i < rs.size(); ++i)
    if (dropped[i]) a.order.push_back(rs[i].id);
  return a;
}

// Removes the longest request from `batch` until the batch's cost meets the
// anchor's (earliest) deadline. With the default additive cost this runs in
// O(n log n) with a heap and a running sum; a custom cost is re-evaluated
// per removal.
std::vector<PendingRequest> TrimToAnchor(const std::vector<PendingRequest>& batch, double now,
                                         const BatchCost& cost,
                                         std::vector<PendingRequest>* removed) {
  std::vector<bool> gone(batch.size(), false);
  std::priority_queue<std::pair<double, int64_t>>
      longest;  // (cost, -index): lower id first on ties
  double sum = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    longest.push({batch[i].cost_s, -static_cast<int64_t>(i)});
    sum += batch[i].cost_s;
  }
  size_t front = 0, left = batch.size();
  auto total = [&]() {
    if (!cost) return sum;
    std::vector<PendingRequest> cur;
    for (size_t i = 0; i < batch.size(); ++i)
      if (!gone[i]) cur.push_back(batch[i]);
    return cost(cur);
  };
  while (left > 0) {
    while (gone[front]) ++front;
    if (now + total() < batch[front].deadline_s) break;
    const size_t j = static_cast<size_t>(-longest.top().second);
    longest.pop();
    gone[j] = true;
    sum -= batch[j].cost_s;
    --left;
    removed->push_back(batch[j]);
  }
  std::vector<PendingRequest> kept;
  for (size_t i = 0; i < batch.size(); ++i)
    if (!gone[i]) kept.push_back(batch[i]);
  return kept;
}

Arbitration FineServe(std::vector<PendingRequest> rs, double now, const BatchLimits& limits,
                      const BatchCost& cost) {
  std::vector<PendingRequest> feasible, hopeless, removed;
  for (const auto& r : rs) (now + r.cost_s < r.deadline_s ? feasible : hopeless).push_back(r);
  std::sort(feasible.begin(), feasible.end(), ByDeadline);
  std::sort(hopeless.begin(), hopeless.end(), ByDeadline);
  const std::vector<PendingRequest> batch = TrimToAnchor(feasible, now, cost, &removed);
  // Trim to the batch limits, keeping deadline order.
  std::vector<PendingRequest> kept;
  int tokens = 0;
  for (const auto& r : batch) {
    if (static_cast<int>(kept.size()) >= limits.max_requests ||
        tokens + r.tokens > limits.max_tokens) {
      removed.push_back(r);
      continue;
    }
    kept.push_back(r);
    tokens += r.tokens;
  }
  std::sort(removed.begin(), removed.end(), ByDeadline);
  std::vector<PendingRequest> served = kept;
  served.insert(served.end(), removed.begin(), removed.end());
  served.insert(served.end(), hopeless.begin(), hopeless.end());
  Arbitration a;
  a.order = Ids(served);
  a.batch = static_cast<int>(kept.size());
  a.on_time = OnTimeInOrder(served, now);
  return a;
}

}  // namespace

absl::StatusOr<ArbitrationPolicy> ParseArbitrationPolicy(const std::string& name) {
  if (name == "fcfs") return ArbitrationPolicy::kFcfs;
  if (name == "edf") return ArbitrationPolicy::kEdf;
  if (name == "moore_hodgson") return ArbitrationPolicy::kMooreHodgson;
  if (name == "fineserve_batch") return ArbitrationPolicy::kFineServeBatch;
  return absl::InvalidArgumentError(absl::StrCat(
      "arbitration policy \"", name, "\" (expected fcfs, edf, moore_hodgson or fineserve_batch)"));
}

absl::StatusOr<StreamPriorityPolicy> ParseStreamPriorityPolicy(const std::string& name) {
  if (name == "none") return StreamPriorityPolicy::kNone;
  if (name == "first") return StreamPriorityPolicy::kFirst;
  if (name == "decode") return StreamPriorityPolicy::kDecode;
  return absl::InvalidArgumentError(
      absl::StrCat("stream priority policy \"", name, "\" (expected none, first or decode)"));
}

int CountOnTime(absl::Span<const PendingRequest> requests, absl::Span<const uint64_t> order,
                double now_s) {
  std::map<uint64_t, const PendingRequest*> by_id;
  for (const auto& r : requests) by_id[r.id] = &r;
  double t = now_s;
  int n = 0;
  for (uint64_t id : order) {
    const PendingRequest* r = by_id.at(id);
    t += r->cost_s;
    n += t <= r->deadline_s;
  }
  return n;
}

namespace {

Arbitration ByPolicy(ArbitrationPolicy policy, std::vector<PendingRequest> rs, double now_s,
                     const BatchLimits& limits, const BatchCost& batch_cost) {
  switch (policy) {
    case ArbitrationPolicy::kMooreHodgson:
      return MooreHodgson(std::move(rs), now_s);
    case ArbitrationPolicy::kFineServeBatch:
      return FineServe(std::move(rs), now_s, limits, batch_cost);
    case ArbitrationPolicy::kEdf:
      std::sort(rs.begin(), rs.end(), ByDeadline);
      break;
    case ArbitrationPolicy::kFcfs:
      std::sort(rs.begin(), rs.end(), [](const PendingRequest& a, const PendingRequest& b) {
        return a.arrival_s < b.arrival_s || (a.arrival_s == b.arrival_s && a.id < b.id);
      });
      break;
  }
  Arbitration a;
  a.order = Ids(rs);
  a.on_time = OnTimeInOrder(rs, now_s);
  return a;
}

}  // namespace

Arbitration Arbitrate(ArbitrationPolicy policy, std::vector<PendingRequest> rs, double now_s,
                      const BatchLimits& limits, const BatchCost& batch_cost,
                      double promote_after_slo) {
  if (!(promote_after_slo > 0)) return ByPolicy(policy, std::move(rs), now_s, limits, batch_cost);
  std::vector<PendingRequest> aged, rest;
  for (PendingRequest& r : rs) {
    const bool old = now_s - r.arrival_s > promote_after_slo * (r.deadline_s - r.arrival_s);
    (old ? aged : rest).push_back(std::move(r));
  }
  if (aged.empty()) return ByPolicy(policy, std::move(rest), now_s, limits, batch_cost);
  std::sort(aged.begin(), aged.end(), [](const PendingRequest& a, const PendingRequest& b) {
    return a.arrival_s < b.arrival_s || (a.arrival_s == b.arrival_s && a.id < b.id);
  });
  double after = now_s;
  for (const PendingRequest& r : aged) after += r.cost_s;
  const Arbitration tail = ByPolicy(policy, rest, after, limits, batch_cost);
  Arbitration a;
  a.order = Ids(aged);
  a.order.insert(a.order.end(), tail.order.begin(), tail.order.end());
  if (policy == ArbitrationPolicy::kFineServeBatch) {
    a.batch = static_cast<int>(aged.size()) + tail.batch;
  }
  std::vector<PendingRequest> all = std::move(aged);
  all.insert(all.end(), rest.begin(), rest.end());
  a.on_time = CountOnTime(all, a.order, now_s);
  return a;
}

}  // namespace ballast::node_manager
