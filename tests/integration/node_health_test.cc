// A node whose scheduler is unreachable: its grpc health says NOT_SERVING
// (it is not part of any cluster), and its registration attempts, each
// logging a line, back off instead of repeating every 500 ms.
#include <grpcpp/grpcpp.h>

#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "tests/integration/process.h"

namespace ballast {
namespace {

using grpc::health::v1::HealthCheckResponse;

HealthCheckResponse::ServingStatus Health(int port) {
  auto stub = grpc::health::v1::Health::NewStub(
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  HealthCheckResponse resp;
  if (!stub->Check(&ctx, grpc::health::v1::HealthCheckRequest(), &resp).ok()) {
    return HealthCheckResponse::UNKNOWN;
  }
  return resp.status();
}

TEST(NodeWithoutScheduler, IsNotServingAndBacksOff) {
  const std::string dir = ::testing::TempDir();
  const std::string log = absl::StrCat(dir, "/node_health_", getpid(), ".log");
  const int node_port = testing::FreePort();
  const int nobody = testing::FreePort();  // nothing listens here
  const std::string bin = std::string(BALLAST_BINARY_DIR) + "/server/ballast";
  testing::ChildProcess node(
      {bin, "node", "--node-id", "lonely", "--listen", absl::StrCat("127.0.0.1:", node_port),
       "--scheduler", absl::StrCat("127.0.0.1:", nobody), "--metrics-listen", ""},
      log);
  ASSERT_TRUE(testing::WaitForPort(node_port, 20000)) << node.Log();
  absl::SleepFor(absl::Seconds(4));
  EXPECT_EQ(Health(node_port), HealthCheckResponse::NOT_SERVING);
  int failures = 0;
  for (absl::string_view line : absl::StrSplit(node.Log(), '\n')) {
    failures += absl::StrContains(line, "registering with scheduler");
  }
  // 500 ms, 1 s, 2 s ... apart: at most 4 attempts in 4 s (every 500 ms: 8).
  EXPECT_GE(failures, 1) << node.Log();
  EXPECT_LE(failures, 5) << node.Log();
  node.Stop(SIGTERM);
  std::filesystem::remove(log);
}

}  // namespace
}  // namespace ballast
