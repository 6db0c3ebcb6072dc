#include "server/model_tokenizer.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "engine/tokenizer/hf_tokenizer.h"
#include "nlohmann/json.hpp"

namespace ballast::server {
namespace fs = std::filesystem;

absl::StatusOr<int> TokenizerVocabSize(const std::string& dir) {
  if (!fs::exists(fs::path(dir) / "tokenizer.json")) {
    return absl::NotFoundError(absl::StrCat(dir, " has no tokenizer.json"));
  }
  auto t = tokenizer::HfTokenizer::Load(dir);
  if (!t.ok()) return t.status();
  return (*t)->vocab_size();
}

absl::Status AttachTokenizer(const std::string& tokenizer_dir, const std::string& model_dir) {
  auto t = tokenizer::HfTokenizer::Load(tokenizer_dir);
  if (!t.ok()) return t.status();
  for (const char* name : {"tokenizer.json", "tokenizer_config.json", "generation_config.json",
                           "special_tokens_map.json", "chat_template.jinja"}) {
    const fs::path from = fs::path(tokenizer_dir) / name;
    if (!fs::exists(from)) continue;
    std::error_code ec;
    fs::copy_file(from, fs::path(model_dir) / name, fs::copy_options::overwrite_existing, ec);
    if (ec) {
      return absl::InternalError(
          absl::StrCat("cannot copy ", from.string(), " to ", model_dir, ": ", ec.message()));
    }
  }
  const fs::path config_path = fs::path(model_dir) / "config.json";
  std::ifstream in(config_path);
  std::stringstream text;
  text << in.rdbuf();
  auto config = nlohmann::ordered_json::parse(text.str(), nullptr, false);
  if (config.is_discarded() || !config.is_object()) {
    return absl::InternalError(absl::StrCat(config_path.string(), " is not a JSON object"));
  }
  const std::vector<int>& eos = (*t)->eos_ids();
  if (eos.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        tokenizer_dir, "/tokenizer_config.json names no eos_token: generation could not end"));
  }
  config["eos_token_id"] =
      eos.size() == 1 ? nlohmann::ordered_json(eos[0]) : nlohmann::ordered_json(eos);
  if ((*t)->bos_id() >= 0) {
    config["bos_token_id"] = (*t)->bos_id();
  } else {
    config.erase("bos_token_id");
  }
  std::ofstream(config_path) << config.dump(2);
  return absl::OkStatus();
}

}  // namespace ballast::server
