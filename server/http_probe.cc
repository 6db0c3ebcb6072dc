#include "server/http_probe.h"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace ballast::server {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

// One GET on an I/O context of its own: resolve, connect, send the
// request, read the status line and headers. Run() drives it for at most
// the timeout; what is still pending then is abandoned with the context
// (closing the socket).
class HttpGet {
 public:
  explicit HttpGet(const HttpUrl& url)
      : url_(url), resolver_(ioc_), stream_(ioc_), request_(http::verb::get, url.target, 10) {
    const bool v6 = url.host.find(':') != std::string::npos;
    const std::string host = v6 ? absl::StrCat("[", url.host, "]") : url.host;
    request_.set(http::field::host, url.port == "80" ? host : absl::StrCat(host, ":", url.port));
    request_.set(http::field::user_agent, "ballast-health");
  }

  // The answer's status, or why there is none (UNAVAILABLE, DEADLINE_EXCEEDED).
  absl::Status Run(absl::Duration timeout) {
    resolver_.async_resolve(url_.host, url_.port,
                            [this](beast::error_code ec, tcp::resolver::results_type found) {
                              if (ec) return Fail(absl::StrCat("cannot resolve ", url_.host), ec);
                              Connect(found);
                            });
    ioc_.run_for(absl::ToChronoNanoseconds(timeout));
    if (!result_) {
      return absl::DeadlineExceededError(
          absl::StrCat("no answer within ", absl::FormatDuration(timeout)));
    }
    return *result_;
  }

 private:
  void Connect(const tcp::resolver::results_type& found) {
    stream_.async_connect(found, [this](beast::error_code ec, const tcp::endpoint&) {
      if (ec) return Fail(absl::StrCat("cannot connect to ", url_.host, ":", url_.port), ec);
      http::async_write(stream_, request_, [this](beast::error_code ec, size_t) {
        if (ec) return Fail("cannot send the request", ec);
        ReadHeader();
      });
    });
  }

  void ReadHeader() {
    http::async_read_header(stream_, buffer_, parser_, [this](beast::error_code ec, size_t) {
      if (ec) return Fail("no answer", ec);
      const auto& head = parser_.get();
      if (head.result_int() == 200) {
        result_ = absl::OkStatus();
      } else {
        result_ = absl::FailedPreconditionError(absl::StrCat(
            "HTTP ", head.result_int(), " ", std::string(head.reason()), " (expected 200)"));
      }
    });
  }

  void Fail(const std::string& what, const beast::error_code& ec) {
    result_ = absl::UnavailableError(absl::StrCat(what, ": ", ec.message()));
  }

  const HttpUrl url_;
  net::io_context ioc_;  // first: destroyed after the objects using it
  tcp::resolver resolver_;
  beast::tcp_stream stream_;
  http::request<http::empty_body> request_;
  beast::flat_buffer buffer_;
  http::response_parser<http::empty_body> parser_;
  std::optional<absl::Status> result_;
};

}  // namespace

absl::StatusOr<HttpUrl> ParseHttpUrl(const std::string& url) {
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("bad URL \"", url, "\": ", why,
                                                   " (expected http://HOST:PORT/PATH, e.g. ",
                                                   "http://localhost:9400/metrics)"));
  };
  absl::string_view rest = url;
  if (absl::StartsWith(rest, "https://")) return bad("https is not supported (/metrics is HTTP)");
  if (!absl::ConsumePrefix(&rest, "http://")) return bad("not an http:// URL");
  HttpUrl out;
  const size_t slash = rest.find('/');
  absl::string_view authority = rest.substr(0, slash);
  out.target = slash == absl::string_view::npos ? "/" : std::string(rest.substr(slash));
  if (authority.find('@') != absl::string_view::npos)
    return bad("user information is not supported");
  absl::string_view port;
  if (absl::ConsumePrefix(&authority, "[")) {  // [IPv6]:port
    const size_t close = authority.find(']');
    if (close == absl::string_view::npos) return bad("no ']' after the IPv6 address");
    out.host = std::string(authority.substr(0, close));
    absl::string_view after = authority.substr(close + 1);
    if (!after.empty() && !absl::ConsumePrefix(&after, ":")) return bad("junk after ']'");
    port = after;
  } else {
    const size_t colon = authority.rfind(':');
    out.host = std::string(authority.substr(0, colon));
    if (colon != absl::string_view::npos) port = authority.substr(colon + 1);
    if (out.host.find(':') != std::string::npos) return bad("an IPv6 host needs [brackets]");
  }
  if (out.host.empty()) return bad("no host");
  int number = 80;
  if (!port.empty() && (!absl::SimpleAtoi(port, &number) || number < 1 || number > 65535)) {
    return bad(absl::StrCat("port \"", port, "\" is not in 1..65535"));
  }
  out.port = absl::StrCat(number);
  return out;
}

absl::Status ProbeHttp(const std::string& url, absl::Duration timeout) {
  absl::StatusOr<HttpUrl> parsed = ParseHttpUrl(url);
  if (!parsed.ok()) return parsed.status();
  absl::Status st = HttpGet(*parsed).Run(timeout);
  if (st.ok()) return st;
  return absl::Status(st.code(), absl::StrCat("GET ", url, ": ", st.message()));
}

}  // namespace ballast::server
