// Per-tenant quotas on a real cluster (issue 19, item 3): a tenant over its
// request rate or flooding Advise is refused with RESOURCE_EXHAUSTED and a
// retry hint (message and `retry-after-ms` trailing metadata), while
// another tenant is served as before.
#include "tests/integration/cluster_fixture.h"

namespace ballast {
namespace {

class QuotaTest : public ClusterTest {
 protected:
  ClusterSetup Cluster() override {
    ClusterSetup s = ClusterTest::Cluster();
    s.scheduler_yaml =
        "scheduler:\n  quotas:\n    tenants:\n"
        "      flood: {requests_per_s: 0.1, request_burst: 2, advisories_per_s: 1, "
        "advisory_burst: 5}\n";
    return s;
  }

  // One Generate of `tenant`, with the server's trailing metadata.
  grpc::Status GenerateAs(const std::string& tenant, std::string* retry_after) {
    v1::GenerateRequest req;
    req.set_model("alpha");
    req.set_prompt("Hello");
    req.set_tenant(tenant);
    req.mutable_sampling()->set_max_tokens(4);
    grpc::ClientContext ctx;
    auto reader = inference_->Generate(&ctx, req);
    v1::GenerateResponse resp;
    while (reader->Read(&resp)) {
    }
    grpc::Status st = reader->Finish();
    const auto& md = ctx.GetServerTrailingMetadata();
    auto it = md.find("retry-after-ms");
    *retry_after = it == md.end() ? "" : std::string(it->second.data(), it->second.size());
    return st;
  }
};

TEST_F(QuotaTest, AFloodingTenantIsRefusedWithARetryHintAndOthersAreServed) {
  std::string retry;
  EXPECT_TRUE(GenerateAs("flood", &retry).ok());
  EXPECT_TRUE(GenerateAs("flood", &retry).ok());
  const grpc::Status over = GenerateAs("flood", &retry);
  EXPECT_EQ(over.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(over.error_message().find("retry in"), std::string::npos) << over.error_message();
  EXPECT_GT(std::atoi(retry.c_str()), 0) << "retry-after-ms: \"" << retry << "\"";

  int refused = 0;
  for (int i = 0; i < 200; ++i) {
    grpc::ClientContext ctx;
    v1::AdviseRequest req;
    req.set_session_id("no-such-session");
    req.set_model("alpha");
    req.set_tenant("flood");
    v1::AdviseResponse resp;
    refused +=
        inference_->Advise(&ctx, req, &resp).error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED;
  }
  EXPECT_GE(refused, 190);  // the burst of 5 (plus what refills meanwhile) passed

  // Another tenant (no quota configured) is served, and exactly.
  for (int i = 0; i < 5; ++i) {
    EXPECT_TRUE(GenerateAs("calm", &retry).ok());
    EXPECT_EQ(retry, "");
  }
  const StreamResult r = Generate("alpha", "The cat sat on", 8);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.ids, Reference("alpha", Bytes("The cat sat on", true), 8));
}

}  // namespace
}  // namespace ballast
