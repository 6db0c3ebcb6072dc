// server/tls.h's rules without a network: plaintext only on loopback or
// when the config says insecure, certificates all or none, unreadable
// files named with their key; credentials build from a real test CA.
#include "server/tls.h"

#include <cstdlib>
#include <filesystem>

#include "gtest/gtest.h"

namespace ballast::server {
namespace {

std::string Error(const TlsSettings& tls, const std::vector<std::string>& listen) {
  const absl::Status st = CheckTls(tls, listen, "t.yaml: node.tls");
  EXPECT_FALSE(st.ok());
  return std::string(st.message());
}

TEST(Tls, PlaintextOnlyOnLoopbackUnlessInsecure) {
  const TlsSettings none;
  EXPECT_TRUE(CheckTls(none, {"127.0.0.1:1", "localhost:2", "[::1]:3", ""}, "w").ok());
  const std::string e = Error(none, {"127.0.0.1:1", "0.0.0.0:50061"});
  EXPECT_NE(e.find("t.yaml: node.tls"), std::string::npos) << e;
  EXPECT_NE(e.find("0.0.0.0:50061"), std::string::npos) << e;
  EXPECT_NE(e.find("insecure: true"), std::string::npos) << e;
  TlsSettings insecure;
  insecure.insecure = true;
  EXPECT_TRUE(CheckTls(insecure, {"0.0.0.0:50061"}, "w").ok());
}

TEST(Tls, CertificatesAreAllOrNoneAndReadable) {
  TlsSettings half;
  half.cert_file = "/nonexistent/node.pem";
  EXPECT_NE(Error(half, {}).find("node.tls.cert_file: cannot read \"/nonexistent/node.pem\""),
            std::string::npos);
  const std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) / "ballast_tls_unit";
  std::filesystem::remove_all(dir);
  const std::string cmd = std::string("bash ") + BALLAST_SOURCE_DIR +
                          "/deploy/tls/make-test-ca.sh " + dir.string() + " > /dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  TlsSettings t;
  t.cert_file = (dir / "node.pem").string();
  EXPECT_NE(Error(t, {}).find("node.tls.key_file: missing"), std::string::npos);
  t.key_file = (dir / "node.key").string();
  EXPECT_NE(Error(t, {}).find("node.tls.ca_file: missing"), std::string::npos);
  t.ca_file = (dir / "ca.pem").string();
  EXPECT_TRUE(CheckTls(t, {"0.0.0.0:50061"}, "w").ok());
  t.insecure = true;
  EXPECT_NE(Error(t, {}).find("choose one"), std::string::npos);
  t.insecure = false;
  auto server = ServerCredentialsFor(t, ClientCerts::kRequired);
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_NE(*server, nullptr);
  auto channel = ChannelCredentialsFor(t);
  ASSERT_TRUE(channel.ok()) << channel.status();
  EXPECT_NE(*channel, nullptr);
  std::filesystem::remove_all(dir);
}

TEST(Tls, ClientCredentialsComeFromTheEnvironment) {
  unsetenv("BALLAST_TLS_CA");
  auto plain = ClientCredentialsFromEnv();
  ASSERT_TRUE(plain.ok());
  EXPECT_NE(*plain, nullptr);
  setenv("BALLAST_TLS_CA", "/nonexistent/ca.pem", 1);
  auto missing = ClientCredentialsFromEnv();
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("BALLAST_TLS_CA"), std::string::npos);
  unsetenv("BALLAST_TLS_CA");
}

}  // namespace
}  // namespace ballast::server
