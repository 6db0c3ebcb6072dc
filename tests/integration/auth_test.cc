// API keys, tenants and roles (issue 19, item 2) on a real cluster: keys
// made by `ballast keys add` (the file holds only their hashes), a
// scheduler with scheduler.auth.keys_file, and calls that carry
// "authorization: Bearer <key>". The key decides the tenant (so sessions
// and KV are isolated per key), the models and the Admin API.
#include <cstdio>

#include "absl/strings/ascii.h"
#include "server/auth.h"
#include "tests/integration/cluster_fixture.h"

namespace ballast {
namespace {

class AuthTest : public ClusterTest {
 protected:
  ClusterSetup Cluster() override {
    ClusterSetup s = ClusterTest::Cluster();
    admin_key_ = AddKey("ops", "admin", "");
    acme_key_ = AddKey("acme", "user", "alpha");
    globex_key_ = AddKey("globex", "user", "");
    key_ = admin_key_;  // the fixture's own calls (state, registration)
    s.scheduler_yaml = "scheduler:\n  auth: {keys_file: " + KeysFile() + "}\n";
    return s;
  }
  void Decorate(grpc::ClientContext* ctx) override {
    if (!key_.empty()) ctx->AddMetadata("authorization", "Bearer " + key_);
  }

  std::string KeysFile() const { return (dir_ / "keys.yaml").string(); }

  // `ballast keys add`; returns the key it printed.
  std::string AddKey(const std::string& tenant, const std::string& role,
                     const std::string& models) {
    std::string cmd = std::string(BALLAST_BINARY_DIR) + "/server/ballast keys add --file " +
                      KeysFile() + " --tenant " + tenant + " --role " + role;
    if (!models.empty()) cmd += " --models " + models;
    FILE* p = popen((cmd + " 2> /dev/null").c_str(), "r");
    EXPECT_NE(p, nullptr) << cmd;
    if (p == nullptr) return "";
    char buf[256] = {};
    const size_t n = fread(buf, 1, sizeof(buf) - 1, p);
    EXPECT_EQ(pclose(p), 0) << cmd;
    return std::string(absl::StripAsciiWhitespace(std::string(buf, n)));
  }

  grpc::Status List(std::vector<std::string>* names) {
    grpc::ClientContext ctx;
    Decorate(&ctx);
    v1::ListModelsResponse resp;
    grpc::Status st = inference_->ListModels(&ctx, v1::ListModelsRequest(), &resp);
    for (const auto& m : resp.models()) names->push_back(m.name());
    return st;
  }

  std::string admin_key_, acme_key_, globex_key_, key_;
};

TEST_F(AuthTest, KeysDecideTenantsModelsAndRoles) {
  // The file holds hashes only.
  std::ifstream in(KeysFile());
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_EQ(text.str().find(acme_key_), std::string::npos);
  EXPECT_NE(text.str().find("sha256"), std::string::npos);

  key_ = "";
  StreamResult r = Generate("alpha", "Hello", 4);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_NE(r.status.error_message().find("API key"), std::string::npos);
  key_ = "bk_not-a-key";
  EXPECT_EQ(Generate("alpha", "Hello", 4).status.error_code(), grpc::StatusCode::UNAUTHENTICATED);

  key_ = acme_key_;
  r = Generate("alpha", "Hello", 8);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.ids, Reference("alpha", Bytes("Hello", true), 8));
  r = Generate("beta", "Hello", 8);  // outside acme's allow-list
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_NE(r.status.error_message().find("\"beta\""), std::string::npos);
  std::vector<std::string> names;
  ASSERT_TRUE(List(&names).ok());
  EXPECT_EQ(names, std::vector<std::string>{"alpha"});
  v1::GenerateRequest other;  // a user key cannot act as another tenant
  other.set_model("alpha");
  other.set_prompt("Hello");
  other.set_tenant("globex");
  EXPECT_EQ(Run(other).status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  {
    grpc::ClientContext ctx;
    Decorate(&ctx);
    v1::ClusterState state;
    EXPECT_EQ(admin_->GetClusterState(&ctx, v1::GetClusterStateRequest(), &state).error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
  }

  // The tenant comes from the key: acme's session is not globex's.
  r = Generate("alpha", "Hello", 4, "shared-session");
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  key_ = globex_key_;
  r = Generate("alpha", " again", 4, "shared-session");
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::PERMISSION_DENIED) << r.status.error_message();
  {  // nor end it, nor advise it
    grpc::ClientContext ctx;
    Decorate(&ctx);
    v1::EndSessionRequest end;
    end.set_session_id("shared-session");
    v1::EndSessionResponse resp;
    EXPECT_EQ(inference_->EndSession(&ctx, end, &resp).error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
  }
  {
    grpc::ClientContext ctx;
    Decorate(&ctx);
    v1::AdviseRequest adv;
    adv.set_session_id("shared-session");
    v1::AdviseResponse resp;
    EXPECT_EQ(inference_->Advise(&ctx, adv, &resp).error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
  }
  names.clear();
  ASSERT_TRUE(List(&names).ok());
  EXPECT_EQ(names.size(), 2u);  // no allow-list: every model

  key_ = acme_key_;
  {  // an advisory's next hops are models too: the allow-list applies
    grpc::ClientContext ctx;
    Decorate(&ctx);
    v1::AdviseRequest adv;
    adv.set_session_id("shared-session");
    adv.add_next_hops("beta");
    v1::AdviseResponse resp;
    EXPECT_EQ(inference_->Advise(&ctx, adv, &resp).error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
  }
  {  // the owner ends its session
    grpc::ClientContext ctx;
    Decorate(&ctx);
    v1::EndSessionRequest end;
    end.set_session_id("shared-session");
    v1::EndSessionResponse resp;
    ASSERT_TRUE(inference_->EndSession(&ctx, end, &resp).ok());
    EXPECT_TRUE(resp.existed());
  }

  key_ = admin_key_;
  EXPECT_EQ(AliveNodes(), 2);  // the Admin API with an admin key
}

TEST_F(AuthTest, KeysAreAddedAndRevokedWithoutARestart) {
  key_ = AddKey("initech", "user", "");
  ASSERT_TRUE(WaitFor([&] { return Generate("beta", "Hi", 2).status.ok(); }, absl::Seconds(10)))
      << "a key added to the file was not accepted";
  // Revoke every key but the admin's: rewrite the file with only its entry.
  {
    std::ifstream in(KeysFile());
    std::stringstream text;
    text << in.rdbuf();
    const std::string all = text.str();
    EXPECT_NE(all.find("initech"), std::string::npos);
  }
  const std::string kept = (dir_ / "admin-only.yaml").string();
  const std::string admin = admin_key_;
  std::ofstream(kept) << "keys:\n  - {sha256: " << server::Sha256Hex(admin)
                      << ", tenant: ops, role: admin}\n";
  std::filesystem::rename(kept, KeysFile());
  ASSERT_TRUE(WaitFor(
      [&] {
        return Generate("beta", "Hi", 2).status.error_code() == grpc::StatusCode::UNAUTHENTICATED;
      },
      absl::Seconds(10)))
      << "a revoked key still works";
  key_ = admin_key_;
  EXPECT_TRUE(Generate("beta", "Hi", 2).status.ok());
}

}  // namespace
}  // namespace ballast
