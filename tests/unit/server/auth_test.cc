// server/auth.h without a network: SHA-256 against its published test
// vector, key files (hashes only; errors name the file and entry), bearer
// parsing, tenants and allow-lists, and keys added and revoked by editing
// the file while the store is live.
#include "server/auth.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace ballast::server {
namespace {

std::string Error(const std::string& yaml) {
  auto k = ParseKeyFile(yaml, "keys.yaml");
  EXPECT_FALSE(k.ok()) << yaml;
  return k.ok() ? "" : std::string(k.status().message());
}

TEST(Auth, Sha256AndNewKeys) {
  EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  const std::string a = NewApiKey(), b = NewApiKey();
  EXPECT_EQ(a.rfind("bk_", 0), 0u);
  EXPECT_EQ(a.size(), 46u);  // "bk_" + 43 base64url characters (256 bits)
  EXPECT_NE(a, b);
}

TEST(Auth, KeyFileErrorsNameTheEntry) {
  const std::string h(64, 'a');
  auto ok = ParseKeyFile("keys:\n  - {sha256: " + h + ", tenant: acme, models: [m1, m2]}\n", "k");
  ASSERT_TRUE(ok.ok()) << ok.status();
  ASSERT_EQ(ok->count(h), 1u);
  EXPECT_EQ(ok->at(h).role, Role::kUser);
  EXPECT_EQ(ok->at(h).models.size(), 2u);
  EXPECT_NE(Error("keys:\n  - {sha256: abc, tenant: t}\n").find("keys.yaml: keys[0].sha256"),
            std::string::npos);
  EXPECT_NE(Error("keys:\n  - {sha256: " + h + ", tenant: t, role: root}\n").find("keys[0].role"),
            std::string::npos);
  EXPECT_NE(Error("keys:\n  - {sha256: " + h + ", tenant: t, colour: red}\n")
                .find("keys[0].colour: unknown key"),
            std::string::npos);
  EXPECT_NE(Error("keys:\n  - {sha256: " + h + "}\n").find("keys[0].tenant"), std::string::npos);
  EXPECT_NE(Error("keys:\n  - {sha256: " + h + ", tenant: a}\n  - {sha256: " + h + ", tenant: b}\n")
                .find("keys[1].sha256: listed twice"),
            std::string::npos);
  EXPECT_NE(Error("users: []\n").find("keys.yaml"), std::string::npos);
}

TEST(Auth, PrincipalsDecideTenantsAndModels) {
  Principal user{"acme", Role::kUser, {"alpha"}};
  EXPECT_TRUE(user.AllowsModel("alpha"));
  EXPECT_FALSE(user.AllowsModel("beta"));
  EXPECT_EQ(*user.TenantFor(""), "acme");
  EXPECT_EQ(*user.TenantFor("acme"), "acme");
  EXPECT_EQ(user.TenantFor("globex").status().code(), absl::StatusCode::kPermissionDenied);
  Principal admin{"ops", Role::kAdmin, {}};
  EXPECT_TRUE(admin.AllowsModel("anything"));
  EXPECT_EQ(*admin.TenantFor("globex"), "globex");
}

TEST(Auth, StoreAuthenticatesBearersAndFollowsTheFile) {
  const std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) / "ballast_auth_unit";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string file = (dir / "keys.yaml").string();
  auto k1 = AddKey(file, Principal{"acme", Role::kUser, {}});
  ASSERT_TRUE(k1.ok()) << k1.status();
  EXPECT_EQ(std::filesystem::status(file).permissions() & std::filesystem::perms::others_read,
            std::filesystem::perms::none);
  auto store = KeyStore::Load(file);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ((*store)->Authenticate("").status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ((*store)->Authenticate(*k1).status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ((*store)->Authenticate("Bearer nope").status().code(),
            absl::StatusCode::kUnauthenticated);
  auto p = (*store)->Authenticate("Bearer " + *k1);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->tenant, "acme");

  // A key added to the file is accepted within about a second; a broken
  // file is ignored (the previous keys stay); a revoked key is refused.
  auto k2 = AddKey(file, Principal{"globex", Role::kAdmin, {"m"}});
  ASSERT_TRUE(k2.ok()) << k2.status();
  absl::SleepFor(absl::Milliseconds(1100));
  auto p2 = (*store)->Authenticate("Bearer " + *k2);
  ASSERT_TRUE(p2.ok()) << p2.status();
  EXPECT_EQ(p2->role, Role::kAdmin);
  std::ofstream(file, std::ios::trunc) << "keys: [this is not an entry]\n";
  absl::SleepFor(absl::Milliseconds(1100));
  EXPECT_TRUE((*store)->Authenticate("Bearer " + *k1).ok());
  std::ofstream(file, std::ios::trunc)
      << "keys:\n  - {sha256: " << Sha256Hex(*k2) << ", tenant: globex, role: admin}\n";
  absl::SleepFor(absl::Milliseconds(1100));
  EXPECT_EQ((*store)->Authenticate("Bearer " + *k1).status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE((*store)->Authenticate("Bearer " + *k2).ok());
  EXPECT_EQ((*store)->size(), 1);
  std::filesystem::remove_all(dir);
}

// `ballast keys add` keeps what the operator wrote in the file (comments,
// layout) and falls back to rewriting only a layout it cannot append to.
TEST(AuthKeys, AddingAKeyKeepsTheFilesComments) {
  const auto dir = std::filesystem::path(::testing::TempDir()) / "keys_comments";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string file = (dir / "keys.yaml").string();
  std::ofstream(file) << "# production keys: rotate every 90 days\n"
                         "keys:\n"
                         "    # the billing service\n"
                         "    - sha256: "
                      << std::string(64, 'a')
                      << "\n"
                         "      tenant: billing\n"
                         "      role: user\n";
  auto k = AddKey(file, Principal{"acme", Role::kUser, {"m1", "m2"}});
  ASSERT_TRUE(k.ok()) << k.status();
  std::stringstream text;
  text << std::ifstream(file).rdbuf();
  EXPECT_NE(text.str().find("# production keys: rotate every 90 days"), std::string::npos)
      << text.str();
  EXPECT_NE(text.str().find("    # the billing service"), std::string::npos) << text.str();
  auto store = KeyStore::Load(file);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ((*store)->size(), 2);
  auto p = (*store)->Authenticate("Bearer " + *k);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->models, (std::vector<std::string>{"m1", "m2"}));
  // A flow-style list cannot take an appended line: rewritten, still valid.
  std::ofstream(file, std::ios::trunc)
      << "keys: [{sha256: " << std::string(64, 'b') << ", tenant: t, role: admin}]\n";
  auto k2 = AddKey(file, Principal{"acme", Role::kAdmin, {}});
  ASSERT_TRUE(k2.ok()) << k2.status();
  auto again = KeyStore::Load(file);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ((*again)->size(), 2);
  EXPECT_TRUE((*again)->Authenticate("Bearer " + *k2).ok());
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ballast::server
