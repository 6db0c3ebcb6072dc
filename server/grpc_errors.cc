#include "server/grpc_errors.h"

#include <grpcpp/support/server_interceptor.h>

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

// The field protobuf last refused on this thread ("ballast.v1.X.prompt"),
// read by the interceptor on the same thread (the synchronous server parses
// a request and sends its status from one thread).
thread_local std::string last_bad_field;

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
  constexpr std::string_view kUtf8 = "String field '";
  if (message.rfind(kUtf8, 0) == 0) {
    const size_t end = message.find('\'', kUtf8.size());
    if (end != std::string::npos) last_bad_field = message.substr(kUtf8.size(), end - kUtf8.size());
  }
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

// Rewrites the status of a request gRPC could not parse (INTERNAL, empty
// message: no handler of ours sends that) into INVALID_ARGUMENT.
class ParseErrorInterceptor : public grpc::experimental::Interceptor {
 public:
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_STATUS)) {
      const grpc::Status st = methods->GetSendStatus();
      if (st.error_code() == grpc::StatusCode::INTERNAL && st.error_message().empty()) {
        const std::string field = std::exchange(last_bad_field, "");
        methods->ModifySendStatus(grpc::Status(
            grpc::StatusCode::INVALID_ARGUMENT,
            absl::StrCat("the request could not be parsed: ",
                         field.empty() ? std::string("a string field")
                                       : absl::StrCat("string field ", field),
                         " is not valid UTF-8 (protobuf string fields must be UTF-8)")));
      }
    }
    methods->Proceed();
  }
};

class ParseErrorFactory : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo*) override {
    return new ParseErrorInterceptor;
  }
};

}  // namespace

void InstallRequestErrors(grpc::ServerBuilder* builder) {
  static std::once_flag once;
  std::call_once(once, [] { google::protobuf::SetLogHandler(&ProtobufLog); });
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> creators;
  creators.push_back(std::make_unique<ParseErrorFactory>());
  builder->experimental().SetInterceptorCreators(std::move(creators));
}

int64_t ProtobufLogLinesWritten() { return lines_written.load(); }

}  // namespace ballast::server
