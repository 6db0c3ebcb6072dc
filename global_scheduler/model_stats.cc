#include "global_scheduler/model_stats.h"

#include <algorithm>

namespace ballast::global_scheduler {

ModelStats::ModelStats(absl::Duration window) : window_(std::max(window, absl::Seconds(1))) {}

void ModelStats::Trim(std::deque<Bucket>* b, int64_t now_s) const {
  const int64_t first = now_s - absl::ToInt64Seconds(window_) + 1;  // oldest second kept
  while (!b->empty() && b->front().second < first) b->pop_front();
}

void ModelStats::Record(const std::string& model, absl::Time now, int64_t prompt_tokens,
                        int64_t decode_tokens) {
  const int64_t s = absl::ToUnixSeconds(now);
  absl::MutexLock lock(&mu_);
  std::deque<Bucket>& b = buckets_[model];
  if (b.empty() || b.back().second < s) b.push_back(Bucket{s});
  // A late record (clock skew between callers) lands in the newest bucket.
  Bucket& last = b.back();
  ++last.requests;
  last.prompt_tokens += prompt_tokens;
  last.decode_tokens += decode_tokens;
  Trim(&b, std::max(s, last.second));
}

ModelRates ModelStats::Rates(const std::string& model, absl::Time now) const {
  absl::MutexLock lock(&mu_);
  auto it = buckets_.find(model);
  if (it == buckets_.end()) return {};
  Trim(&it->second, absl::ToUnixSeconds(now));
  ModelRates r;
  for (const Bucket& b : it->second) {
    r.requests_per_s += static_cast<double>(b.requests);
    r.prompt_tokens_per_s += static_cast<double>(b.prompt_tokens);
    r.decode_tokens_per_s += static_cast<double>(b.decode_tokens);
  }
  const double w = absl::ToDoubleSeconds(window_);
  r.requests_per_s /= w;
  r.prompt_tokens_per_s /= w;
  r.decode_tokens_per_s /= w;
  return r;
}

void ModelStats::Forget(const std::string& model) {
  absl::MutexLock lock(&mu_);
  buckets_.erase(model);
}

}  // namespace ballast::global_scheduler
