// DeviceWorker's arbitration (device_worker.h): one decision over every
// engine's queue at each pass of the step loop (Prism §6.2): the order in
// which the device's models admit their requests, the requests refused
// for the overload bound, and (node.arbitration.log_decisions) a log line
// for each change in a queued request's state (ArbitrationTracker).
#include <algorithm>
#include <climits>
#include <cstdint>
#include <optional>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "node_manager/device_worker.h"
#include "spdlog/spdlog.h"

namespace ballast::node_manager {
namespace {

// The device's queue at a decision: arbitration's view of each request
// (its id is its index), where it came from, and its log entry.
struct DeviceQueue {
  std::vector<PendingRequest> reqs;
  std::vector<std::pair<size_t, std::string>> owner;  // (engine, request id)
  std::vector<bool> rejectable;
  std::vector<ArbitrationEntry> entries;
};

// Times are seconds relative to `now`: deadline = arrival + TTFT SLO,
// cost = the model's predicted prefill time for the tokens left.
// `log`: each request's log entry too (else `entries` stays empty).
DeviceQueue GatherQueue(const std::vector<std::shared_ptr<engine::ModelEngine>>& engines,
                        std::map<std::string, PrefillCostModel>* costs, double default_ttft_ms,
                        absl::Time now, bool log) {
  DeviceQueue q;
  for (size_t i = 0; i < engines.size(); ++i) {
    if (!engines[i]->HasWork()) continue;
    const PrefillCostModel& cost = costs->try_emplace(engines[i]->name()).first->second;
    for (const engine::QueuedRequest& r : engines[i]->Queued()) {
      if (r.preempted) continue;  // re-admitted first regardless
      PendingRequest p;
      p.id = q.reqs.size();
      p.arrival_s = absl::ToDoubleSeconds(r.arrival - now);
      p.deadline_s = p.arrival_s + (r.ttft_slo_ms > 0 ? r.ttft_slo_ms : default_ttft_ms) / 1e3;
      p.cost_s = cost.PredictMs(r.tokens_left) / 1e3;
      p.tokens = r.tokens_left;
      q.reqs.push_back(p);
      q.owner.emplace_back(i, r.id);
      q.rejectable.push_back(r.reject_if_slo_unmet);
      if (!log) continue;
      ArbitrationEntry e;
      e.id = r.id;
      e.model = engines[i]->name();
      e.tokens = r.tokens_left;
      e.arrival_s = p.arrival_s;
      e.deadline_s = p.deadline_s;
      e.cost_s = p.cost_s;
      e.kv_refused = r.kv_refused;
      e.fit_intercept_ms = cost.intercept_ms();
      e.fit_ms_per_token = cost.ms_per_token();
      e.fit_steps = cost.samples();
      q.entries.push_back(std::move(e));
    }
  }
  return q;
}

}  // namespace

DeviceWorker::StepOrder DeviceWorker::Arbitrate(
    std::vector<std::shared_ptr<engine::ModelEngine>> engines) {
  const absl::Time now = absl::Now();
  const bool log = arbitration_.log_decisions;
  DeviceQueue q = GatherQueue(engines, &costs_, arbitration_.default_ttft_ms, now, log);
  if (q.reqs.empty()) {
    if (log) LogDecision(now, {});
    absl::MutexLock lock(&mu_);
    arb_stats_.expected_late = 0;  // nothing queued: nothing late
    return {std::move(engines), false};
  }
  const absl::Time t0 = absl::Now();
  const node_manager::Arbitration a = node_manager::Arbitrate(
      arbitration_.policy, q.reqs, 0.0, arbitration_.batch, {}, arbitration_.promote_after_slo);
  const double decision_us = absl::ToDoubleMicroseconds(absl::Now() - t0);
  std::vector<absl::flat_hash_map<std::string, int>> ranks(engines.size());
  std::vector<int> first(engines.size(), INT32_MAX);
  std::vector<ArbitrationEntry> logged;  // in the decision's order
  double t = 0;
  int late = 0, rejected = 0;
  for (size_t pos = 0; pos < a.order.size(); ++pos) {
    const uint64_t id = a.order[pos];
    const auto& [e, rid] = q.owner[id];
    // Served back to back in this order, does it start prefilling late?
    const double start = t;
    t += q.reqs[id].cost_s;
    const bool on_time = t <= q.reqs[id].deadline_s;
    const double wait_ms = std::max(0.0, t - q.reqs[id].arrival_s) * 1e3;
    const std::optional<absl::Status> why = Refusal(on_time, q.rejectable[id], wait_ms);
    if (why) {
      t -= q.reqs[id].cost_s;  // it will not take device time
      engines[e]->RejectWaiting(rid, *why);
      ++rejected;
    } else {
      late += !on_time;
      ranks[e][rid] = static_cast<int>(pos);
      first[e] = std::min(first[e], static_cast<int>(pos));
    }
    if (log) {
      ArbitrationEntry& entry = q.entries[id];
      entry.start_s = start;
      entry.late = !on_time;
      entry.rejected = why.has_value();
      logged.push_back(std::move(entry));
    }
  }
  for (size_t i = 0; i < engines.size(); ++i) {
    if (!ranks[i].empty()) engines[i]->SetAdmissionOrder(ranks[i]);
  }
  if (log) LogDecision(now, logged);
  {
    absl::MutexLock lock(&mu_);
    ++arb_stats_.decisions;
    arb_stats_.rejected += rejected;
    arb_stats_.expected_late = late;
    arb_stats_.last_decision_us = decision_us;
  }
  return InStepOrder(std::move(engines), first);
}

DeviceWorker::StepOrder DeviceWorker::InStepOrder(
    std::vector<std::shared_ptr<engine::ModelEngine>> engines, const std::vector<int>& first) {
  // The engine holding the first request in the order steps first.
  std::vector<size_t> idx(engines.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
  std::stable_sort(idx.begin(), idx.end(), [&](size_t x, size_t y) { return first[x] < first[y]; });
  StepOrder out;
  out.first_holds_first = !idx.empty() && first[idx[0]] != INT32_MAX;
  for (size_t i : idx) out.engines.push_back(std::move(engines[i]));
  return out;
}

std::optional<absl::Status> DeviceWorker::Refusal(bool on_time, bool rejectable,
                                                  double wait_ms) const {
  const bool overload =
      arbitration_.max_queue_wait_ms > 0 && wait_ms > arbitration_.max_queue_wait_ms;
  if (overload) {
    return absl::ResourceExhaustedError(
        absl::StrCat("device ", name_, " is overloaded: about ", static_cast<int>(wait_ms),
                     " ms expected before the first token (bound ", arbitration_.max_queue_wait_ms,
                     " ms); retry later"));
  }
  if (!on_time && rejectable) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "TTFT SLO cannot be met on device ", name_, ": about ", static_cast<int>(wait_ms),
        " ms expected before the first token (the request asked to be rejected "
        "rather than served late)"));
  }
  return std::nullopt;
}

void DeviceWorker::LogDecision(absl::Time now, const std::vector<ArbitrationEntry>& queued) {
  const std::vector<ArbitrationEvent> events =
      decisions_.Decide(absl::ToDoubleSeconds(now - absl::UnixEpoch()), queued);
  if (events.empty()) return;
  const int64_t kv_free = balloon_ ? balloon_->arena()->stats().bytes_free : -1;
  for (const ArbitrationEvent& ev : events) {
    const ArbitrationEntry& e = ev.entry;
    // One line per change, for scripts/arbitration-timeline.py.
    spdlog::info(
        "arbitration {} at {:.6f}: {} {} {}; {} tokens, arrived {:.6f} s, start {:.3f} ms, "
        "deadline {:.3f} ms, cost {:.3f} ms, queued {:.3f} ms; fit {:.3f} ms + {:.6f} ms/token "
        "over {} steps; {} queued, KV free {} MiB",
        name_, absl::ToDoubleSeconds(now - absl::UnixEpoch()), e.id, e.model,
        ArbitrationChangeName(ev.change), e.tokens, e.arrival_s, e.start_s * 1e3,
        e.deadline_s * 1e3, e.cost_s * 1e3, ev.queued_s * 1e3, e.fit_intercept_ms,
        e.fit_ms_per_token, e.fit_steps, queued.size(), kv_free >= 0 ? kv_free >> 20 : -1);
  }
}

}  // namespace ballast::node_manager
