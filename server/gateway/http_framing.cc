#include "server/gateway/http_framing.h"

#include <boost/beast/http.hpp>

#include "absl/strings/str_cat.h"

namespace ballast::server::gateway {

namespace http = boost::beast::http;

std::string HttpResponse(int status, const std::string& body, bool keep_alive,
                         const std::string& request_id, int64_t retry_after_ms) {
  const auto reason = http::obsolete_reason(http::int_to_status(static_cast<unsigned>(status)));
  // Retry-After in whole seconds (HTTP), retry-after-ms exactly (OpenAI's clients read it).
  const std::string retry = retry_after_ms < 0
                                ? ""
                                : absl::StrCat("\r\nRetry-After: ", (retry_after_ms + 999) / 1000,
                                               "\r\nretry-after-ms: ", retry_after_ms);
  return absl::StrCat("HTTP/1.1 ", status, " ", std::string(reason.data(), reason.size()),
                      "\r\nContent-Type: application/json\r\nContent-Length: ", body.size(),
                      "\r\nX-Request-Id: ", request_id, retry,
                      "\r\nConnection: ", keep_alive ? "keep-alive" : "close", "\r\n\r\n", body);
}

std::string SseHeaders(const std::string& request_id) {
  return absl::StrCat(
      "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
      "X-Request-Id: ",
      request_id, "\r\nConnection: close\r\n\r\n");
}

}  // namespace ballast::server::gateway
