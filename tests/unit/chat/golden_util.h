// Helpers shared by the chat-template golden tests: file loading and the
// comparison of a render with a golden record ({"output": ...} or
// {"error": {"type", "message"}} as made by tests/data/chat/make_golden.py).
//
// Thread-safety: test helpers, used from the test's thread only.
#pragma once

#include <fstream>
#include <sstream>
#include <string>

#include "absl/status/statusor.h"
#include "engine/chat/chat_template.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace ballast::chat::testing {

inline std::string DataPath(const std::string& rel) {
  return std::string(BALLAST_SOURCE_DIR) + "/tests/data/chat/" + rel;
}

inline nlohmann::ordered_json ReadJson(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  std::stringstream ss;
  ss << in.rdbuf();
  return nlohmann::ordered_json::parse(ss.str());
}

// Whether `got` matches the golden record; explains a mismatch in *why.
inline bool MatchesGolden(const absl::StatusOr<std::string>& got,
                          const nlohmann::ordered_json& golden, std::string* why) {
  if (golden.contains("output")) {
    const std::string want = golden["output"].get<std::string>();
    if (!got.ok()) {
      *why = "expected a render, got error: " + std::string(got.status().message());
      return false;
    }
    if (*got != want) {
      size_t i = 0;
      while (i < want.size() && i < got->size() && want[i] == (*got)[i]) ++i;
      *why = "render differs at byte " + std::to_string(i) + "\n--- want\n" + want + "\n--- got\n" +
             *got;
      return false;
    }
    return true;
  }
  const auto& error = golden["error"];
  if (got.ok()) {
    *why = "expected error " + error.dump() + ", got render:\n" + *got;
    return false;
  }
  // Other errors read like Python's (TypeError: ..., 'x' is undefined, ...).
  if (error["type"] != "TemplateError" &&
      std::string(got.status().message()).find(error["message"].get<std::string>()) ==
          std::string::npos) {
    *why = "expected an error like " + error.dump() + ", got " + got.status().ToString();
    return false;
  }
  // raise_exception() raises TemplateError: same message, flagged as the template's.
  if (error["type"] == "TemplateError") {
    if (!IsTemplateException(got.status()) ||
        std::string(got.status().message()) != error["message"].get<std::string>()) {
      *why = "expected raise_exception(" + error["message"].dump() + "), got " +
             got.status().ToString();
      return false;
    }
  }
  return true;
}

}  // namespace ballast::chat::testing
