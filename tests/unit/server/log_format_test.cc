// JSON log lines: every line is one JSON object whose "msg" is the message,
// whatever characters it holds.
#include "server/log_format.h"

#include <memory>
#include <string>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "spdlog/details/log_msg.h"

namespace ballast::server {
namespace {

nlohmann::json Format(const std::string& text) {
  auto f = JsonLogFormatter();
  spdlog::details::log_msg msg("ballast", spdlog::level::warn, text);
  spdlog::memory_buf_t out;
  f->format(msg, out);
  std::string line(out.data(), out.size());
  EXPECT_EQ(line.back(), '\n');
  EXPECT_EQ(line.find('\n'), line.size() - 1) << line;  // one line
  return nlohmann::json::parse(line);
}

TEST(LogFormat, JsonLinesCarryTheMessageVerbatim) {
  const std::string text = "request \"a\\b\" for m:\n\ttab \x01 done";
  const nlohmann::json j = Format(text);
  EXPECT_EQ(j.at("msg"), text);
  EXPECT_EQ(j.at("level"), "warning");
  EXPECT_TRUE(j.at("pid").is_number());
  EXPECT_TRUE(j.at("thread").is_number());
  EXPECT_EQ(j.at("time").get<std::string>().size(), 32u) << j;  // 2026-11-27T05:54:05.885128+00:00
}

TEST(LogFormat, InvalidUtf8IsReplacedNotEmittedRaw) {
  const nlohmann::json j = Format("bad \xff\xfe bytes");
  EXPECT_NE(j.at("msg").get<std::string>().find("bytes"), std::string::npos);
}

TEST(LogFormat, UnknownFormatsAreRefused) {
  EXPECT_TRUE(SetLogFormat("text").ok());
  const absl::Status st = SetLogFormat("xml");
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("text or json"), std::string::npos);
}

}  // namespace
}  // namespace ballast::server
