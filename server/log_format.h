// The daemon's log format: spdlog's text lines (the default) or one JSON
// object per line, for log pipelines:
//   {"time":"2026-11-27T05:50:46.123456+00:00","level":"info","pid":12,
//    "thread":34,"msg":"request cmpl-... for m: OK after 12.0 ms"}
// Requests' log lines name their request id (server/request_id.h).
//
// Thread-safety: SetLogFormat replaces the formatter of every registered
// logger; call it at startup, before other threads log.
#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "spdlog/formatter.h"

namespace ballast::server {

// "text" or "json"; anything else is INVALID_ARGUMENT.
absl::Status SetLogFormat(const std::string& format);

// The JSON-lines formatter SetLogFormat("json") installs (tests).
std::unique_ptr<spdlog::formatter> JsonLogFormatter();

}  // namespace ballast::server
