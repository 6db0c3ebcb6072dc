#include "global_scheduler/tenant_quotas.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "global_scheduler/request_validation.h"

namespace ballast::global_scheduler {
namespace {

// The key the tenants beyond max_tracked_tenants share (not a valid tenant:
// tenants are at most 128 bytes and this one is longer).
const std::string& OverflowKey() {
  static const std::string* key = new std::string(200, '\x01');
  return *key;
}

double BurstOf(double rate, double burst) { return burst > 0 ? burst : std::max(1.0, rate); }

std::string TenantName(const std::string& tenant) {
  return tenant.empty() ? "the default tenant" : absl::StrCat("tenant \"", tenant, "\"");
}

}  // namespace

TokenBucket::TokenBucket(double rate, double burst, absl::Time now)
    : rate_(rate), burst_(burst), level_(burst), last_(now) {}

void TokenBucket::Refill(absl::Time now) {
  if (now > last_) {
    level_ = std::min(burst_, level_ + rate_ * absl::ToDoubleSeconds(now - last_));
    last_ = now;
  }
}

bool TokenBucket::Full(absl::Time now) {
  Refill(now);
  return level_ >= burst_;
}

double TokenBucket::level(absl::Time now) {
  Refill(now);
  return level_;
}

bool TokenBucket::TryTake(double n, absl::Time now, absl::Duration* wait) {
  Refill(now);
  if (level_ >= n) {
    level_ -= n;
    return true;
  }
  const double missing = n - level_;
  *wait = rate_ > 0 ? absl::Seconds(missing / rate_) : absl::InfiniteDuration();
  return false;
}

void TokenBucket::Charge(double n, absl::Time now) {
  Refill(now);
  level_ = std::min(burst_, level_ - n);  // a refund never lifts it past the burst
}

bool TokenBucket::Solvent(absl::Time now, absl::Duration* wait) {
  Refill(now);
  if (level_ >= 0) return true;
  *wait = rate_ > 0 ? absl::Seconds(-level_ / rate_) : absl::InfiniteDuration();
  return false;
}

TenantQuotas::TenantQuotas(QuotaOptions options, std::function<absl::Time()> clock)
    : options_(std::move(options)), clock_(std::move(clock)) {}

const QuotaLimits& TenantQuotas::LimitsOf(const std::string& tenant) const {
  auto it = options_.tenants.find(tenant);
  return it == options_.tenants.end() ? options_.defaults : it->second;
}

int TenantQuotas::MaxSessions(const std::string& tenant) const {
  return LimitsOf(tenant).max_sessions;
}

TenantQuotas::Buckets& TenantQuotas::BucketsOf(const std::string& tenant, absl::Time now) {
  auto it = buckets_.find(tenant);
  if (it != buckets_.end()) return it->second;
  const bool listed = options_.tenants.count(tenant) > 0;
  if (!listed && static_cast<int>(buckets_.size()) >= options_.max_tracked_tenants) {
    for (auto b = buckets_.begin(); b != buckets_.end();) {  // refilled: as good as new
      Buckets& k = b->second;
      const bool full = b->first != OverflowKey() && k.requests.Full(now) &&
                        k.prompt_tokens.Full(now) && k.advisories.Full(now);
      b = full ? buckets_.erase(b) : std::next(b);
    }
  }
  const std::string& key =
      listed || static_cast<int>(buckets_.size()) < options_.max_tracked_tenants ? tenant
                                                                                 : OverflowKey();
  const QuotaLimits& l = LimitsOf(tenant);
  return buckets_
      .try_emplace(
          key,
          Buckets{
              TokenBucket(l.requests_per_s, BurstOf(l.requests_per_s, l.request_burst), now),
              TokenBucket(l.prompt_tokens_per_s,
                          BurstOf(l.prompt_tokens_per_s, l.prompt_token_burst), now),
              TokenBucket(l.advisories_per_s, BurstOf(l.advisories_per_s, l.advisory_burst), now)})
      .first->second;
}

absl::Status TenantQuotas::AdmitRequest(const std::string& tenant, int64_t prompt_bytes) {
  if (auto st = ValidateTenant(tenant); !st.ok()) return st;
  const QuotaLimits& l = LimitsOf(tenant);
  if (l.max_prompt_bytes > 0 && prompt_bytes > l.max_prompt_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("the prompt is ", prompt_bytes, " bytes; ",
                                                     TenantName(tenant), " may send at most ",
                                                     l.max_prompt_bytes, " (scheduler.quotas)"));
  }
  if (l.requests_per_s <= 0 && l.prompt_tokens_per_s <= 0) return absl::OkStatus();
  const absl::Time now = clock_();
  absl::MutexLock lock(&mu_);
  Buckets& b = BucketsOf(tenant, now);
  absl::Duration wait;
  if (l.prompt_tokens_per_s > 0 && !b.prompt_tokens.Solvent(now, &wait)) {
    return QuotaExceeded(
        absl::StrCat(TenantName(tenant), " used its prompt tokens (", l.prompt_tokens_per_s, "/s)"),
        wait);
  }
  if (l.requests_per_s > 0 && !b.requests.TryTake(1, now, &wait)) {
    return QuotaExceeded(
        absl::StrCat(TenantName(tenant), " is over its request rate (", l.requests_per_s, "/s)"),
        wait);
  }
  return absl::OkStatus();
}

void TenantQuotas::ChargePromptTokens(const std::string& tenant, int64_t tokens) {
  if (LimitsOf(tenant).prompt_tokens_per_s <= 0 || tokens <= 0) return;
  const absl::Time now = clock_();
  absl::MutexLock lock(&mu_);
  BucketsOf(tenant, now).prompt_tokens.Charge(static_cast<double>(tokens), now);
}

void TenantQuotas::RefundRequest(const std::string& tenant) {
  if (LimitsOf(tenant).requests_per_s <= 0 || !ValidateTenant(tenant).ok()) return;
  const absl::Time now = clock_();
  absl::MutexLock lock(&mu_);
  BucketsOf(tenant, now).requests.Charge(-1, now);
}

absl::Status TenantQuotas::AdmitAdvisory(const std::string& tenant) {
  if (auto st = ValidateTenant(tenant); !st.ok()) return st;
  const QuotaLimits& l = LimitsOf(tenant);
  if (l.advisories_per_s <= 0) return absl::OkStatus();
  const absl::Time now = clock_();
  absl::MutexLock lock(&mu_);
  absl::Duration wait;
  if (!BucketsOf(tenant, now).advisories.TryTake(1, now, &wait)) {
    return QuotaExceeded(
        absl::StrCat(TenantName(tenant), " is over its advisory rate (", l.advisories_per_s, "/s)"),
        wait);
  }
  return absl::OkStatus();
}

absl::Status QuotaExceeded(const std::string& what, absl::Duration wait,
                           const std::string& setting) {
  const int64_t ms = static_cast<int64_t>(std::ceil(absl::ToDoubleMilliseconds(wait)));
  absl::Status st =
      absl::ResourceExhaustedError(absl::StrCat(what, "; retry in ", ms, " ms (", setting, ")"));
  st.SetPayload(kRetryAfterPayload, absl::Cord(absl::StrCat(ms)));
  return st;
}

int64_t RetryAfterMs(const absl::Status& st) {
  auto p = st.GetPayload(kRetryAfterPayload);
  int64_t ms = -1;
  if (!p || !absl::SimpleAtoi(std::string(*p), &ms)) return -1;
  return ms;
}

}  // namespace ballast::global_scheduler
