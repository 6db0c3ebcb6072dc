// JsonField: a value of a tokenizer's JSON files together with its file and
// key path, so that every parse error names both ("<dir>/tokenizer.json:
// pre_tokenizer.pretokenizers[1].behavior: unknown value \"Foo\"").
//
// Thread-safety: a view over a json value; thread-compatible.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace ballast::tokenizer {

class JsonField {
 public:
  JsonField(const nlohmann::json& value, std::string path, std::string origin)
      : value_(&value), path_(std::move(path)), origin_(std::move(origin)) {}

  const nlohmann::json& value() const { return *value_; }
  const std::string& path() const { return path_; }
  const std::string& origin() const { return origin_; }
  bool is_null() const { return value_->is_null(); }

  // Whether the object has `key` with a non-null value.
  bool Has(std::string_view key) const;
  // The member `key` (a null value if absent).
  JsonField operator[](std::string_view key) const;
  // Element `i` of an array.
  JsonField at(size_t i) const;

  // INVALID_ARGUMENT "<origin>: <path>: <what>".
  absl::Status Error(absl::string_view what) const;

  // Typed members. Required ones fail when absent; optional ones return the
  // default when absent or null; all fail on a wrong type.
  absl::StatusOr<std::string> String(std::string_view key) const;
  absl::StatusOr<std::optional<std::string>> OptionalString(std::string_view key) const;
  absl::StatusOr<bool> Bool(std::string_view key, bool dflt) const;
  absl::StatusOr<int64_t> Int(std::string_view key, int64_t dflt) const;
  // The single code point of a one-character string member.
  absl::StatusOr<char32_t> Char(std::string_view key) const;
  // Checks that this value is an object / array.
  absl::Status ExpectObject() const;
  absl::Status ExpectArray() const;

 private:
  std::string ChildPath(std::string_view key) const;
  const nlohmann::json* value_;
  std::string path_;
  std::string origin_;
};

}  // namespace ballast::tokenizer
