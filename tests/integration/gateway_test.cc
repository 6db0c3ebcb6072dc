// The OpenAI-compatible gateway end to end: `ballast serve` with the gateway
// on a free loopback port, driven by a minimal HTTP/1.1 client over raw
// sockets: /v1/models, completions (plain and SSE), OpenAI-shaped errors
// with their HTTP codes, limits, and a client disconnect mid-stream that
// cancels the request on the scheduler and the node (seen in /metrics).
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "server/auth.h"
#include "tests/integration/process.h"

namespace ballast {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
const std::string kBin = std::string(BALLAST_BINARY_DIR) + "/server/ballast";

struct HttpResult {
  int status = 0;
  std::string head, body;
};

int Connect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  timeval tv{30, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

std::string RequestText(const std::string& method, const std::string& path, const std::string& body,
                        int64_t content_length = -1, const std::string& extra_headers = "") {
  return absl::StrCat(method, " ", path, " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n",
                      extra_headers, "Content-Type: application/json\r\nContent-Length: ",
                      content_length >= 0 ? content_length : static_cast<int64_t>(body.size()),
                      "\r\n\r\n", body);
}

// One request on its own connection; reads until the server closes.
HttpResult Http(int port, const std::string& method, const std::string& path,
                const std::string& body = "", int64_t content_length = -1,
                const std::string& extra_headers = "") {
  HttpResult r;
  const int fd = Connect(port);
  if (fd < 0) return r;
  const std::string req = RequestText(method, path, body, content_length, extra_headers);
  send(fd, req.data(), req.size(), MSG_NOSIGNAL);
  std::string resp;
  char buf[8192];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) resp.append(buf, static_cast<size_t>(n));
  close(fd);
  const auto split = resp.find("\r\n\r\n");
  if (split == std::string::npos || resp.size() < 12) return r;
  r.head = resp.substr(0, split);
  r.body = resp.substr(split + 4);
  r.status = std::atoi(resp.c_str() + 9);
  return r;
}

// The JSON payloads of an SSE body ("data: X\n\n" events), in order.
std::vector<std::string> SseData(const std::string& body) {
  std::vector<std::string> out;
  for (absl::string_view ev : absl::StrSplit(body, "\n\n", absl::SkipEmpty())) {
    if (absl::StartsWith(ev, "data: ")) out.emplace_back(ev.substr(6));
  }
  return out;
}

class GatewayTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           absl::StrCat("ballast_gateway_", getpid(), "_",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    std::ofstream(dir_ / "serve.yaml")
        << "log_level: debug\nlog_format: json\n"
           "scheduler: {listen: 127.0.0.1:50051, slo: {ttft_ms: 5000, tpot_ms: 500}"
        << SchedulerExtra()
        << "}\n"
           "node:\n  node_id: gw\n  listen: 127.0.0.1:0\n  metrics_listen: ''\n"
           "  engine: {block_tokens: 16, kv_cache_mib: 16, max_batch_tokens: 128}\n"
           "serve:\n  cache_dir: "
        << (dir_ / "cache").string()
        << "\n  models:\n"
           "    - {name: a, architecture: llama, layers: 2, hidden: 64, heads: 4, kv_heads: 2,"
           " intermediate: 128, max_position: 4096, seed: 1}\n";
    grpc_port_ = testing::FreePort();
    http_port_ = testing::FreePort();
    metrics_port_ = testing::FreePort();
    serve_ = std::make_unique<testing::ChildProcess>(
        std::vector<std::string>{kBin, "serve", "--config", (dir_ / "serve.yaml").string(),
                                 "--listen", absl::StrCat("127.0.0.1:", grpc_port_),
                                 "--http-listen", absl::StrCat("127.0.0.1:", http_port_),
                                 "--metrics-listen", absl::StrCat("127.0.0.1:", metrics_port_)},
        (dir_ / "serve.log").string());
    ASSERT_TRUE(testing::WaitForPort(http_port_, 30000)) << serve_->Log();
    // Ready once a tiny completion succeeds (the model is loaded).
    const absl::Time end = absl::Now() + absl::Seconds(60);
    while (absl::Now() < end) {
      if (Http(http_port_, "POST", "/v1/completions",
               R"({"model":"a","prompt":"x","max_tokens":1})", -1, ReadyHeaders())
              .status == 200) {
        return;
      }
      absl::SleepFor(absl::Milliseconds(100));
    }
    FAIL() << "serve not ready\n" << serve_->Log();
  }
  // More of the scheduler's YAML mapping (", key: value"), and the headers
  // SetUp's readiness probe sends.
  virtual std::string SchedulerExtra() { return ""; }
  virtual std::string ReadyHeaders() { return ""; }

  void TearDown() override {
    if (serve_) serve_->Stop(SIGTERM);
    if (HasFailure()) std::cerr << serve_->Log();
    fs::remove_all(dir_);
  }

  // The value of one Prometheus series ("" if absent).
  std::string Metric(const std::string& series) {
    const std::string text = testing::HttpGet(metrics_port_, "/metrics");
    for (absl::string_view line : absl::StrSplit(text, '\n')) {
      if (absl::StartsWith(line, series + " ")) return std::string(line.substr(series.size() + 1));
    }
    return "";
  }

  fs::path dir_;
  int grpc_port_ = 0, http_port_ = 0, metrics_port_ = 0;
  std::unique_ptr<testing::ChildProcess> serve_;
};

TEST_F(GatewayTest, ModelsAndCompletionsPlainAndStreamed) {
  HttpResult models = Http(http_port_, "GET", "/v1/models");
  ASSERT_EQ(models.status, 200) << models.body;
  const json m = json::parse(models.body);
  EXPECT_EQ(m["object"], "list");
  ASSERT_EQ(m["data"].size(), 1u);
  EXPECT_EQ(m["data"][0]["id"], "a");
  EXPECT_EQ(m["data"][0]["object"], "model");

  const std::string req =
      R"({"model":"a","prompt":"Hello","max_tokens":8,"temperature":0,"ignore_eos":true,)"
      R"("user":"u1","n":1,"logprobs":null)";
  HttpResult plain = Http(http_port_, "POST", "/v1/completions", req + "}");
  ASSERT_EQ(plain.status, 200) << plain.body;
  EXPECT_TRUE(absl::StrContains(plain.head, "application/json")) << plain.head;
  const json p = json::parse(plain.body);
  EXPECT_EQ(p["object"], "text_completion");
  EXPECT_TRUE(absl::StartsWith(p["id"].get<std::string>(), "cmpl-"));
  EXPECT_EQ(p["model"], "a");
  ASSERT_EQ(p["choices"].size(), 1u);
  EXPECT_EQ(p["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(p["choices"][0]["index"], 0);
  EXPECT_EQ(p["usage"]["completion_tokens"], 8);
  EXPECT_GT(p["usage"]["prompt_tokens"].get<int>(), 0);
  EXPECT_EQ(p["usage"]["total_tokens"].get<int>(), p["usage"]["prompt_tokens"].get<int>() + 8);

  HttpResult streamed = Http(http_port_, "POST", "/v1/completions",
                             req + R"(,"stream":true,"stream_options":{"include_usage":true}})");
  ASSERT_EQ(streamed.status, 200) << streamed.body;
  EXPECT_TRUE(absl::StrContains(streamed.head, "text/event-stream")) << streamed.head;
  const auto events = SseData(streamed.body);
  ASSERT_GE(events.size(), 3u) << streamed.body;
  EXPECT_EQ(events.back(), "[DONE]");
  std::string text, finish;
  for (size_t i = 0; i + 2 < events.size(); ++i) {
    const json c = json::parse(events[i]);
    EXPECT_EQ(c["object"], "text_completion");
    EXPECT_TRUE(c.contains("usage") && c["usage"].is_null());
    text += c["choices"][0]["text"].get<std::string>();
    if (!c["choices"][0]["finish_reason"].is_null()) finish = c["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(finish, "length");
  EXPECT_EQ(text, p["choices"][0]["text"].get<std::string>()) << "greedy: same text both ways";
  const json usage = json::parse(events[events.size() - 2]);
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["completion_tokens"], 8);
}

// The header line `name: value` of a response head ("" if absent).
std::string Header(const std::string& head, const std::string& name) {
  for (absl::string_view line : absl::StrSplit(head, "\r\n")) {
    if (absl::StartsWithIgnoreCase(line, name + ": "))
      return std::string(line.substr(name.size() + 2));
  }
  return "";
}

// A request id chosen by the client (X-Request-Id) comes back in the
// response and names the request in the scheduler's and the node's log
// lines; without one (or with an invalid one) the completion's id is used.
// The daemon's log lines (log_format: json) are JSON objects.
TEST_F(GatewayTest, RequestIdsComeBackAndNameTheRequestInEveryProcessLog) {
  const std::string body = R"({"model":"a","prompt":"Hi","max_tokens":2})";
  HttpResult chosen =
      Http(http_port_, "POST", "/v1/completions", body, -1, "X-Request-Id: trace-42.a:b_c\r\n");
  ASSERT_EQ(chosen.status, 200) << chosen.body;
  EXPECT_EQ(Header(chosen.head, "X-Request-Id"), "trace-42.a:b_c") << chosen.head;

  HttpResult own = Http(http_port_, "POST", "/v1/completions", body);
  ASSERT_EQ(own.status, 200) << own.body;
  EXPECT_EQ(Header(own.head, "X-Request-Id"), json::parse(own.body)["id"]) << own.head;

  HttpResult invalid = Http(http_port_, "POST", "/v1/completions",
                            body.substr(0, body.size() - 1) + R"(,"stream":true})", -1,
                            "X-Request-Id: has space\r\n");
  ASSERT_EQ(invalid.status, 200) << invalid.body;
  EXPECT_TRUE(absl::StartsWith(Header(invalid.head, "X-Request-Id"), "cmpl-")) << invalid.head;

  HttpResult unknown = Http(http_port_, "GET", "/nowhere", "", -1, "X-Request-Id: lost-1\r\n");
  EXPECT_EQ(unknown.status, 404);
  EXPECT_EQ(Header(unknown.head, "X-Request-Id"), "lost-1") << unknown.head;

  // The node and the scheduler log the request when it ends (debug).
  int scheduler_lines = 0, node_lines = 0;
  const absl::Time end = absl::Now() + absl::Seconds(10);
  while ((scheduler_lines == 0 || node_lines == 0) && absl::Now() < end) {
    scheduler_lines = node_lines = 0;
    for (absl::string_view line : absl::StrSplit(serve_->Log(), '\n', absl::SkipEmpty())) {
      if (!absl::StartsWith(line, "{")) continue;  // gRPC core's own lines keep their format
      const json j = json::parse(line, nullptr, false);
      ASSERT_TRUE(j.is_object() && j.contains("msg") && j.contains("level")) << line;
      const std::string msg = j["msg"];
      if (!absl::StrContains(msg, "request trace-42.a:b_c for a: OK")) continue;
      (absl::StrContains(msg, "on this node") ? node_lines : scheduler_lines)++;
    }
    if (scheduler_lines == 0 || node_lines == 0) absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_EQ(scheduler_lines, 1) << serve_->Log();
  EXPECT_EQ(node_lines, 1) << serve_->Log();
}

TEST_F(GatewayTest, ErrorsAreOpenAiShapedWithHttpCodes) {
  auto expect_error = [&](const HttpResult& r, int status, const std::string& param) {
    EXPECT_EQ(r.status, status) << r.body;
    const json e = json::parse(r.body, nullptr, false);
    ASSERT_TRUE(e.is_object() && e.contains("error")) << r.body;
    EXPECT_TRUE(e["error"]["message"].is_string());
    EXPECT_TRUE(e["error"]["type"].is_string());
    EXPECT_TRUE(e["error"].contains("code"));
    if (!param.empty()) {
      EXPECT_EQ(e["error"]["param"], param) << r.body;
    }
  };
  const std::string c = "/v1/completions";
  expect_error(Http(http_port_, "POST", c, R"({"model":"nope","prompt":"x"})"), 404, "model");
  // Streamed: the error comes before the first token, so it is a plain 404.
  expect_error(Http(http_port_, "POST", c, R"({"model":"nope","prompt":"x","stream":true})"), 404,
               "model");
  expect_error(Http(http_port_, "POST", c, R"({"model":"a", "prompt": )"), 400, "");
  expect_error(Http(http_port_, "POST", c, R"({"model":"a","prompt":"x","n":2})"), 400, "n");
  expect_error(Http(http_port_, "POST", c, R"({"model":"a","prompt":"x","logprobs":9})"), 400,
               "logprobs");
  expect_error(Http(http_port_, "POST", c, R"({"model":"a","prompt":"x","frequency_penalty":3})"),
               400, "frequency_penalty");
  expect_error(Http(http_port_, "POST", c, R"({"model":"a","prompt":"x","bogus":1})"), 400,
               "bogus");
  expect_error(Http(http_port_, "POST", c, R"({"model":"a","prompt":"x","temperature":9})"), 400,
               "temperature");
  expect_error(Http(http_port_, "POST", c, R"({"model":"a","prompt":""})"), 400, "prompt");
  // Beyond the context window: the scheduler's INVALID_ARGUMENT becomes 400.
  expect_error(Http(http_port_, "POST", c, R"({"model":"a","prompt":"x","max_tokens":100000})"),
               400, "");
  // Oversize body: refused from its Content-Length (413), before it is read.
  expect_error(Http(http_port_, "POST", c, "", 2 << 20), 413, "");
  // Model "a" is synthetic, with no chat template: not something to retry.
  expect_error(Http(http_port_, "POST", "/v1/chat/completions",
                    R"({"model":"a","messages":[{"role":"user","content":"hi"}]})"),
               400, "");
  expect_error(Http(http_port_, "GET", c), 405, "");
  expect_error(Http(http_port_, "GET", "/v2/nothing"), 404, "");
}

TEST_F(GatewayTest, ClientDisconnectMidStreamCancelsUpstream) {
  const int fd = Connect(http_port_);
  ASSERT_GE(fd, 0);
  const std::string req = RequestText(
      "POST", "/v1/completions",
      R"({"model":"a","prompt":"Hi","max_tokens":3000,"ignore_eos":true,"stream":true})");
  send(fd, req.data(), req.size(), MSG_NOSIGNAL);
  std::string got;
  char buf[4096];
  ssize_t n;
  while (!absl::StrContains(got, "data: {") && (n = read(fd, buf, sizeof(buf))) > 0) {
    got.append(buf, static_cast<size_t>(n));
  }
  ASSERT_TRUE(absl::StrContains(got, "data: {")) << got;
  close(fd);  // mid-stream: 3000 tokens are far from done
  const std::string sched = R"(ballast_scheduler_requests_total{model="a",status="CANCELLED"})";
  const std::string node = R"(ballast_node_requests_total{model="a",status="CANCELLED"})";
  const absl::Time end = absl::Now() + absl::Seconds(20);
  while (absl::Now() < end && (Metric(sched).empty() || Metric(node).empty())) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_EQ(Metric(sched), "1");
  EXPECT_EQ(Metric(node), "1");
  // The gateway still serves.
  EXPECT_EQ(Http(http_port_, "GET", "/v1/models").status, 200);
}

// API keys through the gateway: the HTTP Authorization header reaches the
// scheduler as the call's bearer token, and refusals are OpenAI's 401/403.
class GatewayAuthTest : public GatewayTest {
 protected:
  std::string SchedulerExtra() override {
    const std::string file = (dir_ / "keys.yaml").string();
    admin_ = *server::AddKey(file, server::Principal{"ops", server::Role::kAdmin, {}});
    other_ = *server::AddKey(file, server::Principal{"acme", server::Role::kUser, {"b"}});
    return ", auth: {keys_file: " + file + "}";
  }
  std::string ReadyHeaders() override { return "Authorization: Bearer " + admin_ + "\r\n"; }
  std::string admin_, other_;
};

TEST_F(GatewayAuthTest, TheAuthorizationHeaderIsTheApiKey) {
  const std::string body = R"({"model":"a","prompt":"Hello","max_tokens":2})";
  HttpResult none = Http(http_port_, "POST", "/v1/completions", body);
  EXPECT_EQ(none.status, 401) << none.body;
  EXPECT_EQ(json::parse(none.body)["error"]["code"], "invalid_api_key") << none.body;
  HttpResult wrong =
      Http(http_port_, "POST", "/v1/completions", body, -1, "Authorization: Bearer bk_wrong\r\n");
  EXPECT_EQ(wrong.status, 401) << wrong.body;
  HttpResult denied = Http(http_port_, "POST", "/v1/completions", body, -1,
                           "Authorization: Bearer " + other_ + "\r\n");
  EXPECT_EQ(denied.status, 403) << denied.body;
  HttpResult models =
      Http(http_port_, "GET", "/v1/models", "", -1, "Authorization: Bearer " + other_ + "\r\n");
  ASSERT_EQ(models.status, 200) << models.body;
  EXPECT_TRUE(json::parse(models.body)["data"].empty()) << models.body;  // "a" is not acme's
  HttpResult ok = Http(http_port_, "POST", "/v1/completions", body, -1, ReadyHeaders());
  EXPECT_EQ(ok.status, 200) << ok.body;
}

// A quota's refusal through the gateway: 429 with the retry hint as
// Retry-After (seconds) and retry-after-ms (what OpenAI's clients read).
class GatewayQuotaTest : public GatewayTest {
 protected:
  // One request per 100 s: SetUp's readiness probe takes the burst of 1.
  std::string SchedulerExtra() override {
    return ", quotas: {requests_per_s: 0.01, request_burst: 1}";
  }
};

TEST_F(GatewayQuotaTest, ARefusalCarriesRetryAfter) {
  HttpResult r = Http(http_port_, "POST", "/v1/completions",
                      R"({"model":"a","prompt":"Hello","max_tokens":2})");
  ASSERT_EQ(r.status, 429) << r.head << r.body;
  EXPECT_EQ(json::parse(r.body)["error"]["code"], "rate_limit_exceeded") << r.body;
  EXPECT_NE(r.head.find("Retry-After: "), std::string::npos) << r.head;
  const auto ms = r.head.find("retry-after-ms: ");
  ASSERT_NE(ms, std::string::npos) << r.head;
  EXPECT_GT(std::atoi(r.head.c_str() + ms + 16), 1000) << r.head;
}

}  // namespace
}  // namespace ballast
