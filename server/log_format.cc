#include "server/log_format.h"

#include "nlohmann/json.hpp"
#include "spdlog/pattern_formatter.h"
#include "spdlog/spdlog.h"

namespace ballast::server {
namespace {

// %* : the message as a JSON string body (quotes, backslashes, control
// characters and invalid UTF-8 escaped or replaced).
class JsonMessageFlag final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&,
              spdlog::memory_buf_t& dest) override {
    const std::string quoted = nlohmann::json(std::string(msg.payload.data(), msg.payload.size()))
                                   .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    dest.append(quoted.data() + 1, quoted.data() + quoted.size() - 1);  // without the quotes
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<JsonMessageFlag>();
  }
};

}  // namespace

std::unique_ptr<spdlog::formatter> JsonLogFormatter() {
  auto f = std::make_unique<spdlog::pattern_formatter>();
  f->add_flag<JsonMessageFlag>('*').set_pattern(
      R"({"time":"%Y-%m-%dT%H:%M:%S.%f%z","level":"%l","pid":%P,"thread":%t,"msg":"%*"})");
  return f;
}

absl::Status SetLogFormat(const std::string& format) {
  if (format == "text") return absl::OkStatus();
  if (format != "json") {
    return absl::InvalidArgumentError("log_format: expected text or json, got \"" + format + "\"");
  }
  spdlog::set_formatter(JsonLogFormatter());
  return absl::OkStatus();
}

}  // namespace ballast::server
