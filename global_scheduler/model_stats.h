// ModelStats: per-model load over a sliding window (Prism §6.1's inputs to
// KVPR placement): requests, prompt tokens and decode tokens per second,
// counted in one-second buckets over the last `window` (default 60 s). The
// caller passes the time, so tests and replays control the clock.
//
// Thread-safety: thread-safe (one mutex).
#pragma once

#include <cstdint>
#include <deque>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace ballast::global_scheduler {

struct ModelRates {
  double requests_per_s = 0;
  double prompt_tokens_per_s = 0;
  double decode_tokens_per_s = 0;
};

class ModelStats {
 public:
  explicit ModelStats(absl::Duration window = absl::Seconds(60));

  // One finished request of `model` at `now`.
  void Record(const std::string& model, absl::Time now, int64_t prompt_tokens,
              int64_t decode_tokens);
  // Rates over (now - window, now]; all zero for a model never seen.
  ModelRates Rates(const std::string& model, absl::Time now) const;
  void Forget(const std::string& model);
  absl::Duration window() const { return window_; }

 private:
  struct Bucket {
    int64_t second = 0;  // absl::ToUnixSeconds of the bucket's start
    int64_t requests = 0, prompt_tokens = 0, decode_tokens = 0;
  };
  // REQUIRES: mu_ held. Drops buckets at or before `now - window`.
  void Trim(std::deque<Bucket>* b, int64_t now_s) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const absl::Duration window_;
  mutable absl::Mutex mu_;
  mutable absl::flat_hash_map<std::string, std::deque<Bucket>> buckets_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ballast::global_scheduler
