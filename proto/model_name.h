// The rule for model names, shared by the scheduler (catalogue, Admin API)
// and the nodes (LoadModel): 1 to 128 characters from [A-Za-z0-9._:/-],
// starting with a letter or digit. Slashes and colons admit Hugging Face
// style ids ("meta-llama/Llama-3.1-8B") and tags ("qwen:7b-fp8"); names
// are opaque keys everywhere, never parsed for meaning.
// Thread-safety: pure function.
#pragma once

#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace ballast {

inline constexpr size_t kMaxModelNameLength = 128;

inline absl::Status ValidateModelName(absl::string_view name) {
  if (name.empty()) return absl::InvalidArgumentError("model name is empty");
  if (name.size() > kMaxModelNameLength) {
    return absl::InvalidArgumentError(
        absl::StrCat("model name is ", name.size(), " characters; at most ", kMaxModelNameLength));
  }
  auto alnum = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
  };
  if (!alnum(name[0])) {
    return absl::InvalidArgumentError(
        absl::StrCat("model name \"", name, "\" must start with a letter or digit"));
  }
  for (char c : name) {
    if (!alnum(c) && c != '.' && c != '_' && c != ':' && c != '/' && c != '-') {
      return absl::InvalidArgumentError(
          absl::StrCat("model name \"", name, "\" has a character outside [A-Za-z0-9._:/-]"));
    }
  }
  return absl::OkStatus();
}

}  // namespace ballast
