#include "engine/tokenizer/json_field.h"

#include "absl/strings/str_cat.h"
#include "engine/tokenizer/utf8.h"

namespace ballast::tokenizer {
namespace {
const nlohmann::json& Null() {
  static const nlohmann::json kNull;
  return kNull;
}
}  // namespace

std::string JsonField::ChildPath(std::string_view key) const {
  return path_.empty() ? std::string(key) : absl::StrCat(path_, ".", Sv(key));
}

bool JsonField::Has(std::string_view key) const {
  if (!value_->is_object()) return false;
  auto it = value_->find(key);
  return it != value_->end() && !it->is_null();
}

JsonField JsonField::operator[](std::string_view key) const {
  if (value_->is_object()) {
    auto it = value_->find(key);
    if (it != value_->end()) return JsonField(*it, ChildPath(key), origin_);
  }
  return JsonField(Null(), ChildPath(key), origin_);
}

JsonField JsonField::at(size_t i) const {
  return JsonField((*value_)[i], absl::StrCat(path_, "[", i, "]"), origin_);
}

absl::Status JsonField::Error(absl::string_view what) const {
  return absl::InvalidArgumentError(
      absl::StrCat(origin_, ": ", path_.empty() ? "(top level)" : path_, ": ", what));
}

absl::Status JsonField::ExpectObject() const {
  return value_->is_object() ? absl::OkStatus() : Error("expected an object");
}

absl::Status JsonField::ExpectArray() const {
  return value_->is_array() ? absl::OkStatus() : Error("expected an array");
}

absl::StatusOr<std::string> JsonField::String(std::string_view key) const {
  JsonField f = (*this)[key];
  if (f.is_null()) return f.Error("missing (a string is required)");
  if (!f.value().is_string()) return f.Error("expected a string");
  return f.value().get<std::string>();
}

absl::StatusOr<std::optional<std::string>> JsonField::OptionalString(std::string_view key) const {
  JsonField f = (*this)[key];
  if (f.is_null()) return std::optional<std::string>();
  if (!f.value().is_string()) return f.Error("expected a string or null");
  return std::optional<std::string>(f.value().get<std::string>());
}

absl::StatusOr<bool> JsonField::Bool(std::string_view key, bool dflt) const {
  JsonField f = (*this)[key];
  if (f.is_null()) return dflt;
  if (!f.value().is_boolean()) return f.Error("expected true or false");
  return f.value().get<bool>();
}

absl::StatusOr<int64_t> JsonField::Int(std::string_view key, int64_t dflt) const {
  JsonField f = (*this)[key];
  if (f.is_null()) return dflt;
  if (!f.value().is_number_integer()) return f.Error("expected an integer");
  return f.value().get<int64_t>();
}

absl::StatusOr<char32_t> JsonField::Char(std::string_view key) const {
  auto s = String(key);
  if (!s.ok()) return s.status();
  size_t pos = 0;
  if (s->empty() || (NextCodePoint(*s, &pos), pos != s->size())) {
    return (*this)[key].Error("expected a single character");
  }
  pos = 0;
  return NextCodePoint(*s, &pos);
}

}  // namespace ballast::tokenizer
