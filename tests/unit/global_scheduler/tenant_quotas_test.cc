// Per-tenant quotas on a hand-moved clock: token buckets (burst, refill,
// debt), each limit's refusal with its retry hint, tenants kept apart, the
// bound on tracked tenants, and sessions per tenant.
#include "global_scheduler/tenant_quotas.h"

#include "global_scheduler/session_directory.h"
#include "gtest/gtest.h"
#include "tests/unit/global_scheduler/fake_clock.h"

namespace ballast::global_scheduler {
namespace {

TEST(TokenBucket, BurstRefillAndDebt) {
  absl::Time now = absl::FromUnixSeconds(1000);
  TokenBucket b(/*rate=*/2, /*burst=*/3, now);
  absl::Duration wait;
  EXPECT_TRUE(b.TryTake(3, now, &wait));  // starts full
  EXPECT_FALSE(b.TryTake(1, now, &wait));
  EXPECT_EQ(wait, absl::Milliseconds(500));
  now += absl::Milliseconds(500);
  EXPECT_TRUE(b.TryTake(1, now, &wait));
  now += absl::Seconds(60);
  EXPECT_DOUBLE_EQ(b.level(now), 3);  // never above the burst
  b.Charge(7, now);                   // a debt of 4
  EXPECT_FALSE(b.Solvent(now, &wait));
  EXPECT_EQ(wait, absl::Seconds(2));
  EXPECT_FALSE(b.TryTake(0.5, now + absl::Seconds(1), &wait));
  EXPECT_TRUE(b.Solvent(now + absl::Seconds(2), &wait));
}

TEST(TenantQuotas, EachLimitRefusesWithARetryHintAndTenantsStayApart) {
  FakeClock clock;
  QuotaOptions o;
  o.defaults.requests_per_s = 2;
  o.defaults.request_burst = 2;
  o.defaults.prompt_tokens_per_s = 100;
  o.defaults.advisories_per_s = 10;
  o.defaults.max_prompt_bytes = 1000;
  QuotaLimits big = o.defaults;
  big.requests_per_s = 100;
  big.request_burst = 100;
  o.tenants["big"] = big;
  TenantQuotas q(o, clock.fn());

  EXPECT_TRUE(q.AdmitRequest("a", 10).ok());
  EXPECT_TRUE(q.AdmitRequest("a", 10).ok());
  const absl::Status st = q.AdmitRequest("a", 10);
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(st.message().find("tenant \"a\" is over its request rate (2/s)"), std::string::npos)
      << st;
  EXPECT_EQ(RetryAfterMs(st), 500);
  EXPECT_TRUE(q.AdmitRequest("b", 10).ok());  // another tenant is not touched
  for (int i = 0; i < 50; ++i) EXPECT_TRUE(q.AdmitRequest("big", 10).ok());
  clock.now += absl::Milliseconds(500);
  EXPECT_TRUE(q.AdmitRequest("a", 10).ok());

  // Prompt tokens are charged after the fact; the debt refuses until repaid.
  q.ChargePromptTokens("b", 250);  // 100 in the bucket: a debt of 150
  const absl::Status debt = q.AdmitRequest("b", 10);
  EXPECT_EQ(debt.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(debt.message().find("prompt tokens"), std::string::npos) << debt;
  EXPECT_EQ(RetryAfterMs(debt), 1500);
  clock.now += absl::Milliseconds(1500);
  EXPECT_TRUE(q.AdmitRequest("b", 10).ok());

  const absl::Status size = q.AdmitRequest("a", 1001);
  EXPECT_EQ(size.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(size.message().find("at most 1000"), std::string::npos) << size;
  EXPECT_EQ(RetryAfterMs(size), -1);  // retrying the same prompt cannot pass

  for (int i = 0; i < 10; ++i) EXPECT_TRUE(q.AdmitAdvisory("a").ok());
  const absl::Status adv = q.AdmitAdvisory("a");
  EXPECT_EQ(adv.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(RetryAfterMs(adv), 100);
  EXPECT_TRUE(q.AdmitAdvisory("b").ok());
}

TEST(TenantQuotas, TenantsBeyondTheTrackedBoundShareOneSetOfBuckets) {
  FakeClock clock;
  QuotaOptions o;
  o.defaults.advisories_per_s = 1;
  o.defaults.advisory_burst = 2;
  o.max_tracked_tenants = 2;
  TenantQuotas q(o, clock.fn());
  EXPECT_TRUE(q.AdmitAdvisory("a").ok());
  EXPECT_TRUE(q.AdmitAdvisory("b").ok());
  // "x" and "y" are past the bound: they share one bucket of 2.
  EXPECT_TRUE(q.AdmitAdvisory("x").ok());
  EXPECT_TRUE(q.AdmitAdvisory("y").ok());
  EXPECT_FALSE(q.AdmitAdvisory("z").ok());
  EXPECT_TRUE(q.AdmitAdvisory("a").ok());  // tracked tenants keep their own
  // Once a tracked tenant's buckets have refilled, a new tenant takes its
  // place (a full bucket is what a new one would be).
  clock.now += absl::Seconds(10);
  EXPECT_TRUE(q.AdmitAdvisory("w").ok());
  EXPECT_TRUE(q.AdmitAdvisory("w").ok());
  EXPECT_FALSE(q.AdmitAdvisory("w").ok());  // w's own burst of 2, not the overflow's
  // Tenant names are validated before any bucket is made.
  EXPECT_EQ(q.AdmitAdvisory(std::string(129, 't')).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(q.AdmitRequest(std::string(129, 't'), 1).code(), absl::StatusCode::kInvalidArgument);
}

TEST(TenantQuotas, ARefundedRequestIsNotCharged) {
  FakeClock clock;
  QuotaOptions o;
  o.defaults.requests_per_s = 1;
  o.defaults.request_burst = 1;
  TenantQuotas q(o, clock.fn());
  ASSERT_TRUE(q.AdmitRequest("a", 1).ok());
  EXPECT_FALSE(q.AdmitRequest("a", 1).ok());
  q.RefundRequest("a");  // the admitted one was refused afterwards
  EXPECT_TRUE(q.AdmitRequest("a", 1).ok());
  q.RefundRequest("a");
  q.RefundRequest("a");  // never above the burst
  EXPECT_TRUE(q.AdmitRequest("a", 1).ok());
  EXPECT_FALSE(q.AdmitRequest("a", 1).ok());
}

TEST(TenantQuotas, SessionsPerTenantAreCapped) {
  FakeClock clock;
  SessionDirectory d(clock.fn());
  ASSERT_TRUE(d.Begin("a1", "m", false, "a", 2).ok());
  ASSERT_TRUE(d.Begin("a2", "m", false, "a", 2).ok());
  const auto third = d.Begin("a3", "m", false, "a", 2);
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(d.Begin("b1", "m", false, "b", 2).ok());  // per tenant
  d.Abort("a1");  // a first turn that failed leaves nothing behind
  EXPECT_TRUE(d.Begin("a3", "m", false, "a", 2).ok());
  bool existed = false;
  ASSERT_TRUE(d.End("a2", &existed).ok());
  EXPECT_TRUE(existed);
  EXPECT_TRUE(d.Begin("a4", "m", false, "a", 2).ok());
  EXPECT_EQ(d.Begin("a5", "m", false, "a", 2).status().code(),
            absl::StatusCode::kResourceExhausted);
  // Ending needs the owner when a tenant is given, checked with the erase.
  EXPECT_EQ(d.End("a3", &existed, std::string("b")).status().code(),
            absl::StatusCode::kPermissionDenied);
  ASSERT_TRUE(d.End("a3", &existed, std::string("a")).ok());
  EXPECT_TRUE(existed);
  // Expired sessions stay counted as tombstones until erased.
  TurnRecord turn;
  turn.prompt_tokens = {1};
  turn.output_tokens = {2};
  EXPECT_TRUE(d.Commit("a4", "n", turn).ok());
  clock.now += absl::Hours(1);
  d.Expire(absl::Minutes(30));  // a4 lost, still held
  EXPECT_TRUE(d.Begin("a6", "m", false, "a", 2).ok());
  EXPECT_FALSE(d.Begin("a7", "m", false, "a", 2).ok());
  clock.now += absl::Hours(1);
  d.Expire(absl::Minutes(30));  // a4 and a6's tombstones go
  EXPECT_TRUE(d.Begin("a7", "m", false, "a", 2).ok());
}

}  // namespace
}  // namespace ballast::global_scheduler
