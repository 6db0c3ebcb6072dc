#include "server/grpc_errors.h"

#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "google/protobuf/stubs/logging.h"
#include "spdlog/spdlog.h"

namespace ballast::server {
namespace {

std::atomic<int64_t> lines_written{0};

struct LogLimiter {
  absl::Mutex mu;
  // source line -> (last written, lines suppressed since)
  std::map<std::pair<std::string, int>, std::pair<absl::Time, int64_t>> seen ABSL_GUARDED_BY(mu);
};

LogLimiter& Limiter() {
  static auto* l = new LogLimiter;
  return *l;
}

void ProtobufLog(google::protobuf::LogLevel level, const char* file, int line,
                 const std::string& message) {
  int64_t suppressed = 0;
  {
    LogLimiter& l = Limiter();
    absl::MutexLock lock(&l.mu);
    auto& [last, count] = l.seen[{file, line}];
    const absl::Time now = absl::Now();
    if (now - last < absl::Minutes(1)) {
      ++count;
      return;
    }
    last = now;
    suppressed = std::exchange(count, 0);
  }
  ++lines_written;
  const std::string text =
      suppressed > 0 ? absl::StrCat(message, " (", suppressed, " similar suppressed)") : message;
  if (level >= google::protobuf::LOGLEVEL_ERROR) {
    spdlog::error("protobuf: {}", text);
  } else {
    spdlog::warn("protobuf: {}", text);
  }
}

}  // namespace

void InstallRequestErrors(grpc::ServerBuilder* builder) {
  static std::once_flag once;
  std::call_once(once, [] { google::protobuf::SetLogHandler(&ProtobufLog); });
}

int64_t ProtobufLogLinesWritten() { return lines_written.load(); }

}  // namespace ballast::server
