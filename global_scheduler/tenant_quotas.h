// Per-tenant quotas (issue 19, item 3): token buckets for requests, prompt
// tokens and advisories, a cap on a tenant's sessions and on a prompt's
// size. A refusal is RESOURCE_EXHAUSTED naming the limit, with the time
// after which a retry can pass, in the message and as the status payload
// kRetryAfterPayload (milliseconds, decimal) that the server turns into the
// `retry-after-ms` trailing metadata.
//
// Prompt tokens are counted where they are known, when a request finishes
// (the node tokenizes): the bucket may go into debt, and while it is in
// debt the tenant's next requests are refused until it refills. Requests
// and advisories are taken up front.
//
// A tenant is whatever the request says (with API keys, the key's tenant:
// server/auth.h), validated first (at most 128 bytes). At most
// `max_tracked_tenants` distinct tenants get their own buckets: when the
// table is full, buckets that have refilled completely are dropped (a full
// bucket is what a new one would be, so nothing is forgotten); if none has,
// new tenants share one overflow set, so a client inventing tenant names
// can grow memory no further and gets no fresh bursts.
//
// Thread-safety: TenantQuotas is thread-safe; TokenBucket is not.
#pragma once

#include <functional>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace ballast::global_scheduler {

inline constexpr char kRetryAfterPayload[] = "type.ballast.dev/retry_after_ms";

// `rate` per second, holding at most `burst`; starts full.
class TokenBucket {
 public:
  TokenBucket(double rate, double burst, absl::Time now);
  // Takes `n` if there are (and the bucket is not in debt); else false and
  // `*wait` is how long until it would succeed.
  bool TryTake(double n, absl::Time now, absl::Duration* wait);
  // Takes `n` whatever the level (it may go negative: a debt).
  void Charge(double n, absl::Time now);
  // Whether the level is >= 0; else `*wait` is how long until it is.
  bool Solvent(absl::Time now, absl::Duration* wait);
  double level(absl::Time now);
  // Whether it has refilled to its burst (as good as a new bucket).
  bool Full(absl::Time now);

 private:
  void Refill(absl::Time now);
  double rate_, burst_, level_;
  absl::Time last_;
};

struct QuotaLimits {
  // Requests per second and their burst. 0 (the default): no limit; a
  // burst of 0 is max(1, rate).
  double requests_per_s = 0, request_burst = 0;
  // Prompt tokens per second (counted when requests finish) and burst.
  double prompt_tokens_per_s = 0, prompt_token_burst = 0;
  // Advise calls per second and burst.
  double advisories_per_s = 0, advisory_burst = 0;
  // Sessions the tenant may hold at once; 0: only scheduler.max_sessions.
  int max_sessions = 0;
  // Bytes of prompt text (or messages' content) per request; 0: no limit.
  int64_t max_prompt_bytes = 0;
};

struct QuotaOptions {
  QuotaLimits defaults;  // every tenant not listed
  // Per tenant (keys not set in the config inherit the defaults).
  std::map<std::string, QuotaLimits> tenants;
  // Distinct tenants with their own buckets (default 10,000).
  int max_tracked_tenants = 10000;
};

class TenantQuotas {
 public:
  TenantQuotas(QuotaOptions options, std::function<absl::Time()> clock);

  // A Generate request of `tenant` with `prompt_bytes` of prompt.
  absl::Status AdmitRequest(const std::string& tenant, int64_t prompt_bytes)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Gives back the request token of a request refused after admission.
  void RefundRequest(const std::string& tenant) ABSL_LOCKS_EXCLUDED(mu_);
  // A finished request's prompt tokens (computed, not reused).
  void ChargePromptTokens(const std::string& tenant, int64_t tokens) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status AdmitAdvisory(const std::string& tenant) ABSL_LOCKS_EXCLUDED(mu_);
  // The tenant's session cap (0: none).
  int MaxSessions(const std::string& tenant) const;

 private:
  struct Buckets {
    TokenBucket requests, prompt_tokens, advisories;
  };
  const QuotaLimits& LimitsOf(const std::string& tenant) const;
  // The tenant's buckets (or the shared overflow ones). REQUIRES: mu_ held.
  Buckets& BucketsOf(const std::string& tenant, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const QuotaOptions options_;
  const std::function<absl::Time()> clock_;
  absl::Mutex mu_;
  std::map<std::string, Buckets> buckets_ ABSL_GUARDED_BY(mu_);
};

// RESOURCE_EXHAUSTED for `what`, retryable after `wait` (message and
// payload); the message ends naming `setting`, the config that sets the
// limit.
absl::Status QuotaExceeded(const std::string& what, absl::Duration wait,
                           const std::string& setting = "scheduler.quotas");
// The retry hint of a status (kRetryAfterPayload), or -1.
int64_t RetryAfterMs(const absl::Status& st);

}  // namespace ballast::global_scheduler
