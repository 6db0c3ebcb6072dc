// The cluster over TLS (issue 19, item 1): `ballast scheduler` and two
// `ballast node` processes with certificates from deploy/tls/make-test-ca.sh
// (TLS on the public port, mutual TLS between the daemons). Streams match
// the in-process engine; plaintext clients, clients of another CA and nodes
// without a certificate of the cluster CA are refused, and the cluster
// keeps serving.
#include <cstdlib>

#include "ballast/v1/node.grpc.pb.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_credentials_options.h"
#include "nlohmann/json.hpp"
#include "tests/integration/cluster_fixture.h"

namespace ballast {
namespace {

// Runs deploy/tls/make-test-ca.sh into `dir`.
void MakeCa(const std::filesystem::path& dir) {
  // n9: a node certificate naming one node id (the others name any).
  const std::string cmd = std::string("NODES=n9 bash ") + BALLAST_SOURCE_DIR +
                          "/deploy/tls/make-test-ca.sh " + dir.string() + " > /dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
}

// Client credentials: `ca` verifies the server; `name`.pem/.key in `dir`
// is presented when `name` is not empty.
std::shared_ptr<grpc::ChannelCredentials> Tls(const std::filesystem::path& ca,
                                              const std::filesystem::path& dir = {},
                                              const std::string& name = "") {
  using grpc::experimental::FileWatcherCertificateProvider;
  grpc::experimental::TlsChannelCredentialsOptions o;
  if (name.empty()) {
    o.set_certificate_provider(std::make_shared<FileWatcherCertificateProvider>(ca.string(), 1));
  } else {
    o.set_certificate_provider(std::make_shared<FileWatcherCertificateProvider>(
        (dir / (name + ".key")).string(), (dir / (name + ".pem")).string(), ca.string(), 1));
    o.watch_identity_key_cert_pairs();
  }
  o.watch_root_certs();
  return grpc::experimental::TlsCredentials(o);
}

std::string TlsYaml(const std::string& section, const std::filesystem::path& dir,
                    const std::string& name) {
  return section + ":\n  tls: {cert_file: " + (dir / (name + ".pem")).string() +
         ", key_file: " + (dir / (name + ".key")).string() +
         ", ca_file: " + (dir / "ca.pem").string() + ", reload_interval_s: 1}\n";
}

class TlsTest : public ClusterTest {
 protected:
  ClusterSetup Cluster() override {
    ClusterSetup s = ClusterTest::Cluster();
    MakeCa(Ca());
    MakeCa(OtherCa());
    s.scheduler_yaml = TlsYaml("scheduler", Ca(), "scheduler");
    s.node_yaml = TlsYaml("node", Ca(), "node");
    return s;
  }
  std::shared_ptr<grpc::ChannelCredentials> ClientCredentials() override {
    return Tls(Ca() / "ca.pem");
  }
  std::filesystem::path Ca() const { return dir_ / "ca"; }
  std::filesystem::path OtherCa() const { return dir_ / "other-ca"; }

  // The certificate the scheduler's port presents to a new connection (a
  // channel of its own, not a shared one).
  std::string ServerCert() {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    auto stub = v1::Inference::NewStub(
        grpc::CreateCustomChannel(Addr(sched_port_), Tls(Ca() / "ca.pem"), args));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(3));
    v1::ListModelsResponse resp;
    if (!stub->ListModels(&ctx, v1::ListModelsRequest(), &resp).ok()) return "";
    const auto certs = ctx.auth_context()->FindPropertyValues("x509_pem_cert");
    return certs.empty() ? "" : std::string(certs.front().data(), certs.front().size());
  }

  // ListModels over a fresh channel with `creds`.
  grpc::Status ListWith(const std::shared_ptr<grpc::ChannelCredentials>& creds) {
    auto stub = v1::Inference::NewStub(grpc::CreateChannel(Addr(sched_port_), creds));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(3));
    v1::ListModelsResponse resp;
    return stub->ListModels(&ctx, v1::ListModelsRequest(), &resp);
  }
};

TEST_F(TlsTest, StreamsOverMutualTlsMatchTheInProcessEngine) {
  // Both nodes registered and loaded their models over mTLS (SetUp).
  for (const std::string model : {"alpha", "beta"}) {
    const StreamResult r = Generate(model, "The cat sat on", 16);
    ASSERT_TRUE(r.status.ok()) << r.status.error_message() << Logs();
    EXPECT_EQ(r.ids, Reference(model, Bytes("The cat sat on", true), 16)) << model;
  }
  // A client certificate is optional on the public port, and verified.
  EXPECT_TRUE(ListWith(Tls(Ca() / "ca.pem", Ca(), "client")).ok());
}

TEST_F(TlsTest, PlaintextAndForeignClientsAreRefusedAndTheServerKeepsServing) {
  EXPECT_EQ(ListWith(grpc::InsecureChannelCredentials()).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  // A client that trusts another CA does not accept the scheduler.
  EXPECT_EQ(ListWith(Tls(OtherCa() / "ca.pem")).error_code(), grpc::StatusCode::UNAVAILABLE);
  // A client certificate of another CA is refused in the handshake.
  EXPECT_EQ(ListWith(Tls(Ca() / "ca.pem", OtherCa(), "client")).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  const StreamResult r = Generate("alpha", "Hello", 8);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.ids, Reference("alpha", Bytes("Hello", true), 8));
}

TEST_F(TlsTest, OnlyCertificatesNamingANodeRegisterOrReachNodes) {
  // Register as node "n3" with: no client certificate, a public client's
  // certificate (same CA, no role), and node n9's certificate.
  auto try_register = [&](const std::shared_ptr<grpc::ChannelCredentials>& creds) {
    auto registry = v1::NodeRegistry::NewStub(grpc::CreateChannel(Addr(sched_port_), creds));
    grpc::ClientContext ctx;
    v1::RegisterNodeRequest req;
    req.set_node_id("n3");
    req.set_address("127.0.0.1:1");
    v1::RegisterNodeResponse resp;
    return registry->Register(&ctx, req, &resp);
  };
  for (const auto& [what, creds] :
       std::vector<std::pair<std::string, std::shared_ptr<grpc::ChannelCredentials>>>{
           {"no certificate", Tls(Ca() / "ca.pem")},
           {"client certificate", Tls(Ca() / "ca.pem", Ca(), "client")},
           {"node n9's certificate", Tls(Ca() / "ca.pem", Ca(), "node-n9")}}) {
    const grpc::Status st = try_register(creds);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED) << what;
    EXPECT_NE(st.error_message().find("ballast://node/n3"), std::string::npos)
        << what << ": " << st.error_message();
  }

  // A node's port serves the scheduler and nodes only: a public client's
  // certificate of the same CA is refused there.
  const auto state = State();
  ASSERT_EQ(state.nodes_size(), 2);
  auto call_node = [&](const std::string& name) {
    auto node = v1::Node::NewStub(
        grpc::CreateChannel(state.nodes(0).address(), Tls(Ca() / "ca.pem", Ca(), name)));
    grpc::ClientContext ctx;
    v1::DropSessionRequest req;
    req.set_session_id("nobody");
    v1::DropSessionResponse resp;
    return node->DropSession(&ctx, req, &resp);
  };
  const grpc::Status client = call_node("client");
  EXPECT_EQ(client.error_code(), grpc::StatusCode::PERMISSION_DENIED) << client.error_message();
  EXPECT_TRUE(call_node("scheduler").ok());

  // A node process whose certificates come from another CA never registers.
  const std::filesystem::path yaml = dir_ / "foreign-node.yaml";
  std::ofstream(yaml) << TlsYaml("node", OtherCa(), "node");
  ChildProcess foreign({std::string(BALLAST_BINARY_DIR) + "/server/ballast", "node", "--node-id",
                        "n3", "--listen", Addr(testing::FreePort()), "--scheduler",
                        Addr(sched_port_), "--metrics-listen", "", "--config", yaml.string()},
                       (dir_ / "n3.log").string());
  ASSERT_TRUE(
      WaitFor([&] { return foreign.Log().find("registering with scheduler") != std::string::npos; },
              absl::Seconds(10)))
      << foreign.Log();
  const auto after = State();
  EXPECT_EQ(after.nodes_size(), 2);
  for (const auto& n : after.nodes()) EXPECT_NE(n.node_id(), "n3");
  EXPECT_EQ(AliveNodes(), 2);
}

TEST_F(TlsTest, RotatedCertificatesTakeEffectWithoutARestartOrDroppedConnections) {
  const StreamResult first = Generate("alpha", "Hello", 8);  // opens the test's connection
  ASSERT_TRUE(first.status.ok()) << first.status.error_message();
  grpc::ChannelArguments own;  // a connection opened before the rotation
  own.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  auto old_channel = grpc::CreateCustomChannel(Addr(sched_port_), Tls(Ca() / "ca.pem"), own);
  auto old_stub = v1::Inference::NewStub(old_channel);
  auto cert_on_old = [&] {
    grpc::ClientContext ctx;
    v1::ListModelsResponse resp;
    if (!old_stub->ListModels(&ctx, v1::ListModelsRequest(), &resp).ok()) return std::string();
    const auto certs = ctx.auth_context()->FindPropertyValues("x509_pem_cert");
    return certs.empty() ? std::string() : std::string(certs.front().data(), certs.front().size());
  };
  const std::string before = ServerCert();
  ASSERT_FALSE(before.empty());
  ASSERT_EQ(cert_on_old(), before);
  MakeCa(Ca());  // the same CA, new certificates and keys for every process
  ASSERT_TRUE(WaitFor(
      [&] {
        const std::string now = ServerCert();
        return !now.empty() && now != before;
      },
      absl::Seconds(15)))
      << "the scheduler still presents its old certificate";
  // The connection opened before the rotation is the same one (a new
  // handshake would show the new certificate), and the daemons still reach
  // each other.
  EXPECT_EQ(cert_on_old(), before);
  EXPECT_EQ(old_channel->GetState(false), GRPC_CHANNEL_READY);
  const StreamResult after = Generate("beta", "Hello", 8);
  ASSERT_TRUE(after.status.ok()) << after.status.error_message();
  EXPECT_EQ(after.ids, Reference("beta", Bytes("Hello", true), 8));
  EXPECT_EQ(AliveNodes(), 2);
}

TEST_F(TlsTest, PlaintextOffLoopbackNeedsInsecureAtStart) {
  // A scheduler listening beyond loopback without TLS refuses to start,
  // naming the key; insecure: true starts it (with a warning).
  const std::filesystem::path plain = dir_ / "plain.yaml";
  std::ofstream(plain) << "scheduler:\n  listen: 0.0.0.0:" << testing::FreePort()
                       << "\n  metrics_listen: \"\"\n";
  const std::string bin = std::string(BALLAST_BINARY_DIR) + "/server/ballast";
  ChildProcess refused({bin, "scheduler", "--config", plain.string()},
                       (dir_ / "refused.log").string());
  ASSERT_TRUE(WaitFor([&] { return !refused.running(); }, absl::Seconds(10)));
  const int status = refused.Stop(SIGTERM);  // already reaped: its exit status
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0) << status;
  EXPECT_NE(refused.Log().find("plain.yaml: scheduler.tls"), std::string::npos) << refused.Log();
  EXPECT_NE(refused.Log().find("insecure: true"), std::string::npos) << refused.Log();

  const int port = testing::FreePort();
  const std::filesystem::path insecure = dir_ / "insecure.yaml";
  std::ofstream(insecure) << "scheduler:\n  listen: 0.0.0.0:" << port
                          << "\n  metrics_listen: \"\"\n  tls: {insecure: true}\n";
  ChildProcess started({bin, "scheduler", "--config", insecure.string()},
                       (dir_ / "insecure.log").string());
  ASSERT_TRUE(testing::WaitForPort(port, 20000)) << started.Log();
  EXPECT_NE(started.Log().find("plaintext"), std::string::npos) << started.Log();
}

// The OpenAI gateway on a TLS scheduler serves HTTPS with the scheduler's
// certificate (curl, a real client, checks it against the cluster CA):
// models, completions plain and streamed with the same text as gRPC;
// plain HTTP and client certificates of another CA are refused, and it
// keeps serving.
class GatewayTlsTest : public TlsTest {
 protected:
  ClusterSetup Cluster() override {
    ClusterSetup s = TlsTest::Cluster();
    http_port_ = testing::FreePort();
    s.scheduler_yaml += absl::StrCat("  http_listen: 127.0.0.1:", http_port_, "\n");
    return s;
  }
  // Runs curl on the gateway; returns its output then the HTTP code (000:
  // no HTTP answer) on the last line.
  std::string Curl(const std::string& args, const std::string& scheme, const std::string& path) {
    const std::string cmd = absl::StrCat("curl -s -N -m 20 -w '\\n%{http_code}' ", args, " ",
                                         scheme, "://127.0.0.1:", http_port_, path, " 2>&1");
    std::string out;
    if (FILE* p = popen(cmd.c_str(), "r")) {
      char buf[4096];
      size_t n;
      while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
      pclose(p);
    }
    return out;
  }
  std::string Https(const std::string& path, const std::string& body = "",
                    const std::string& client = "") {
    std::string args = "--cacert " + (Ca() / "ca.pem").string();
    if (!client.empty()) args += " --cert " + client + ".pem --key " + client + ".key";
    if (!body.empty()) args += " -H 'Content-Type: application/json' -d '" + body + "'";
    return Curl(args, "https", path);
  }
  static std::string Code(const std::string& out) { return out.substr(out.rfind('\n') + 1); }
  int http_port_ = 0;
};

TEST_F(GatewayTlsTest, ServesHttpsWithTheSchedulersCertificate) {
  const std::string models = Https("/v1/models");
  EXPECT_EQ(Code(models), "200") << models;
  EXPECT_NE(models.find("\"alpha\""), std::string::npos) << models;
  const StreamResult grpc_result = Generate("alpha", "Hello", 8);
  ASSERT_TRUE(grpc_result.status.ok()) << grpc_result.status.error_message();
  const std::string plain = Https(
      "/v1/completions", R"({"model":"alpha","prompt":"Hello","max_tokens":8,"ignore_eos":true})");
  ASSERT_EQ(Code(plain), "200") << plain;
  const auto json = nlohmann::json::parse(plain.substr(0, plain.rfind('\n')));
  EXPECT_EQ(json["choices"][0]["text"], grpc_result.text);
  const std::string streamed =
      Https("/v1/completions",
            R"({"model":"alpha","prompt":"Hello","max_tokens":8,"ignore_eos":true,"stream":true})",
            (Ca() / "client").string());  // with a client certificate of the cluster CA
  EXPECT_EQ(Code(streamed), "200") << streamed;
  EXPECT_NE(streamed.find("data: [DONE]"), std::string::npos) << streamed;
}

TEST_F(GatewayTlsTest, PlainHttpAndForeignCertificatesAreRefused) {
  EXPECT_EQ(Code(Curl("", "http", "/v1/models")), "000");  // no plain HTTP on a TLS port
  const std::string foreign = Https("/v1/models", "", (OtherCa() / "client").string());
  EXPECT_EQ(Code(foreign), "000") << foreign;
  const std::string untrusted =
      Curl("--cacert " + (OtherCa() / "ca.pem").string(), "https", "/v1/models");
  EXPECT_EQ(Code(untrusted), "000") << untrusted;  // curl does not trust the scheduler
  EXPECT_EQ(Code(Https("/v1/models")), "200");     // still serving
}

}  // namespace
}  // namespace ballast
