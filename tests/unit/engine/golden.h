// The Hugging Face goldens in tests/data/golden/<model>/ (made by
// tests/gpu/make_golden.py): checkpoint directory and golden.json.
#pragma once

#include <fstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace ballast::engine::testing {

inline std::string GoldenDir(const std::string& model) {
  return std::string(BALLAST_SOURCE_DIR) + "/tests/data/golden/" + model;
}

// {"tokens": [...], "logits": [[...]], "greedy": [...], ...}; `file` is
// golden.json, or golden-fp8.json (make_golden.py --fp8: the model with
// quantization: fp8's rounding of linear weights and inputs).
inline nlohmann::json LoadGolden(const std::string& model,
                                 const std::string& file = "golden.json") {
  std::ifstream in(GoldenDir(model) + "/" + file);
  EXPECT_TRUE(in.good()) << "missing " << file << " for " << model;
  return nlohmann::json::parse(in);
}

// The prompt positions golden["logits"] holds rows for: every position, or
// golden["logit_positions"] (large vocabularies keep a subset).
inline std::vector<int> GoldenPositions(const nlohmann::json& golden) {
  if (golden.contains("logit_positions")) return golden["logit_positions"].get<std::vector<int>>();
  std::vector<int> all(golden["tokens"].size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int>(i);
  return all;
}

// Rows `positions` of logits [n][vocab], flattened.
inline std::vector<float> SelectRows(const std::vector<float>& logits,
                                     const std::vector<int>& positions, size_t vocab) {
  std::vector<float> out;
  for (int p : positions) {
    if ((static_cast<size_t>(p) + 1) * vocab > logits.size()) break;
    out.insert(out.end(), logits.begin() + p * vocab, logits.begin() + (p + 1) * vocab);
  }
  return out;
}

}  // namespace ballast::engine::testing
