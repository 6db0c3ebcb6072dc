// The HTTP/1.1 framing of the gateway's answers: whole responses with a
// Content-Length body, and the headers that open a server-sent-events
// stream. Both name the request they answer (X-Request-Id,
// server/request_id.h).
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>

namespace ballast::server::gateway {

// A complete HTTP/1.1 response with a JSON body. `retry_after_ms` >= 0 adds
// Retry-After (whole seconds) and retry-after-ms (exact; OpenAI's clients
// read it).
std::string HttpResponse(int status, const std::string& body, bool keep_alive,
                         const std::string& request_id, int64_t retry_after_ms = -1);

// The headers of a 200 text/event-stream response (the connection closes
// after the stream).
std::string SseHeaders(const std::string& request_id);

}  // namespace ballast::server::gateway
