// The Hugging Face goldens in tests/data/golden/<model>/ (made by
// tests/gpu/make_golden.py): checkpoint directory and golden.json.
#pragma once

#include <fstream>
#include <string>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace ballast::engine::testing {

inline std::string GoldenDir(const std::string& model) {
  return std::string(BALLAST_SOURCE_DIR) + "/tests/data/golden/" + model;
}

// {"tokens": [...], "logits": [[...]], "greedy": [...], ...}
inline nlohmann::json LoadGolden(const std::string& model) {
  std::ifstream in(GoldenDir(model) + "/golden.json");
  EXPECT_TRUE(in.good()) << "missing golden.json for " << model;
  return nlohmann::json::parse(in);
}

}  // namespace ballast::engine::testing
