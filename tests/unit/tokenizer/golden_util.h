// Test helpers: the real tokenizer files (scripts/fetch-test-tokenizers.sh,
// a ctest fixture fetches them), the corpus and the Hugging Face goldens of
// tests/data/tokenizers/, and the corpus' tokenizer.json variants.
#pragma once

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace ballast::tokenizer::testing {

inline std::string DataDir() { return std::string(BALLAST_SOURCE_DIR) + "/tests/data/tokenizers"; }

// Where fetch-test-tokenizers.sh put the files: $BALLAST_TEST_TOKENIZERS,
// else ~/.cache/ballast/tokenizers.
inline std::string TokenizerDir(const std::string& name) {
  const char* env = std::getenv("BALLAST_TEST_TOKENIZERS");
  const char* home = std::getenv("HOME");
  std::string root = env != nullptr && *env != '\0'
                         ? env
                         : std::string(home != nullptr ? home : "") + "/.cache/ballast/tokenizers";
  return root + "/" + name;
}

inline nlohmann::json ReadJson(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    ADD_FAILURE() << path << " cannot be read (run scripts/fetch-test-tokenizers.sh; ctest "
                  << "runs it as the tokenizer_files fixture)";
    return nlohmann::json();
  }
  std::stringstream buf;
  buf << in.rdbuf();
  return nlohmann::json::parse(buf.str());
}

inline const nlohmann::json& Corpus() {
  static const nlohmann::json* corpus = new nlohmann::json(ReadJson(DataDir() + "/corpus.json"));
  return *corpus;
}

// An entry's input: its text, or the raw bytes of "hex" (maybe invalid UTF-8).
inline std::string EntryBytes(const nlohmann::json& e) {
  if (e.contains("text")) return e["text"].get<std::string>();
  const std::string hex = e["hex"].get<std::string>();
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  return out;
}

// The corpus' variant `spec` applied to `base` (same rules as make_golden.py).
inline nlohmann::json ApplyVariant(nlohmann::json t, const nlohmann::json& spec) {
  if (spec.contains("set")) {
    for (const auto& [path, value] : spec["set"].items()) {
      nlohmann::json* node = &t;
      std::vector<std::string> keys = absl::StrSplit(path, '.');
      for (size_t i = 0; i + 1 < keys.size(); ++i) node = &(*node)[keys[i]];
      (*node)[keys.back()] = value;
    }
  }
  if (spec.contains("added_tokens")) {
    for (const auto& [content, flags] : spec["added_tokens"].items()) {
      for (auto& a : t["added_tokens"]) {
        if (a["content"] == content) a.update(flags);
      }
    }
  }
  return t;
}

}  // namespace ballast::tokenizer::testing
