// HttpProbe (`ballast health --metrics-url`): URLs it accepts and refuses,
// and each way a GET of a metrics endpoint ends: 200, another status,
// refused, closed without an answer, and no answer in time. Every error
// names the URL.
#include "server/http_probe.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "server/metrics.h"

namespace ballast::server {
namespace {

TEST(HttpProbe, ParsesHttpUrls) {
  auto u = ParseHttpUrl("http://localhost:9400/metrics");
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_EQ(u->host, "localhost");
  EXPECT_EQ(u->port, "9400");
  EXPECT_EQ(u->target, "/metrics");
  u = ParseHttpUrl("http://10.0.0.5");
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_EQ(u->port, "80");
  EXPECT_EQ(u->target, "/");
  u = ParseHttpUrl("http://[::1]:9400/metrics?x=1");
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_EQ(u->host, "::1");
  EXPECT_EQ(u->port, "9400");
  EXPECT_EQ(u->target, "/metrics?x=1");
}

TEST(HttpProbe, RefusesOtherUrlsNamingThem) {
  for (const auto& [url, why] : std::vector<std::pair<std::string, std::string>>{
           {"https://localhost:9400/metrics", "https is not supported"},
           {"localhost:9400/metrics", "not an http:// URL"},
           {"http://:9400/metrics", "no host"},
           {"http://localhost:0/metrics", "not in 1..65535"},
           {"http://localhost:99999/metrics", "not in 1..65535"},
           {"http://localhost:x/metrics", "not in 1..65535"},
           {"http://::1:9400/metrics", "[brackets]"},
           {"http://[::1/metrics", "no ']'"},
           {"http://user@localhost:9400/", "user information"}}) {
    const absl::Status st = ProbeHttp(url, absl::Seconds(1));
    EXPECT_TRUE(absl::IsInvalidArgument(st)) << url << ": " << st;
    EXPECT_NE(st.message().find(absl::StrCat("bad URL \"", url, "\": ")), std::string::npos) << st;
    EXPECT_NE(st.message().find(why), std::string::npos) << st;
  }
}

// A loopback TCP socket on a port of the kernel's choosing; listening or
// only bound (then connections to it are refused).
class Socket {
 public:
  explicit Socket(bool listening) : fd_(socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    socklen_t len = sizeof(addr);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    if (listening) {
      EXPECT_EQ(listen(fd_, 4), 0);
    }
  }
  ~Socket() { close(fd_); }
  int fd() const { return fd_; }
  std::string Url() const { return absl::StrCat("http://127.0.0.1:", port_, "/metrics"); }

 private:
  int fd_;
  int port_ = 0;
};

TEST(HttpProbe, AMetricsEndpointAnswers200AndAnotherPath404) {
  Metrics metrics;
  metrics.SetLeader(false);
  auto exposer = StartExposer("127.0.0.1:0", metrics.registry());
  ASSERT_TRUE(exposer.ok()) << exposer.status();
  const std::string base = absl::StrCat("http://127.0.0.1:", (*exposer)->GetListeningPorts()[0]);
  EXPECT_TRUE(ProbeHttp(base + "/metrics", absl::Seconds(3)).ok());
  const absl::Status st = ProbeHttp(base + "/nothing-here", absl::Seconds(3));
  EXPECT_TRUE(absl::IsFailedPrecondition(st)) << st;
  EXPECT_NE(st.message().find(absl::StrCat("GET ", base, "/nothing-here: HTTP 404")),
            std::string::npos)
      << st;
}

TEST(HttpProbe, AClosedPortIsUnavailableNamingTheUrl) {
  Socket bound(false);  // holds the port; nothing listens
  const absl::Status st = ProbeHttp(bound.Url(), absl::Seconds(3));
  EXPECT_TRUE(absl::IsUnavailable(st)) << st;
  EXPECT_NE(st.message().find(absl::StrCat("GET ", bound.Url(), ": cannot connect to 127.0.0.1:")),
            std::string::npos)
      << st;
}

TEST(HttpProbe, AConnectionClosedWithoutAnAnswerIsUnavailable) {
  Socket server(true);
  std::thread closer([&] { close(accept(server.fd(), nullptr, nullptr)); });
  const absl::Status st = ProbeHttp(server.Url(), absl::Seconds(3));
  closer.join();
  EXPECT_TRUE(absl::IsUnavailable(st)) << st;
  EXPECT_NE(st.message().find(absl::StrCat("GET ", server.Url(), ": no answer")), std::string::npos)
      << st;
}

// A process that accepts (the kernel does, into the backlog) and never
// answers: the probe gives up at its timeout.
TEST(HttpProbe, NoAnswerInTimeIsDeadlineExceeded) {
  Socket server(true);
  const absl::Time start = absl::Now();
  const absl::Status st = ProbeHttp(server.Url(), absl::Milliseconds(300));
  const absl::Duration took = absl::Now() - start;
  EXPECT_TRUE(absl::IsDeadlineExceeded(st)) << st;
  EXPECT_NE(st.message().find(absl::StrCat("GET ", server.Url(), ": no answer within 300ms")),
            std::string::npos)
      << st;
  EXPECT_GE(took, absl::Milliseconds(300));
  EXPECT_LT(took, absl::Seconds(2));
}

}  // namespace
}  // namespace ballast::server
