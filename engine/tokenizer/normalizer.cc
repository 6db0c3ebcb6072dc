#include "engine/tokenizer/normalizer.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "engine/tokenizer/regex.h"
#include "engine/tokenizer/unicode.h"
#include "engine/tokenizer/utf8.h"

namespace ballast::tokenizer {
namespace {

class UnicodeForm final : public Normalizer {
 public:
  explicit UnicodeForm(NormalForm form) : form_(form) {}
  void Normalize(std::string* s) const override { (void)tokenizer::Normalize(form_, s); }

 private:
  NormalForm form_;
};

class Lowercase final : public Normalizer {
 public:
  void Normalize(std::string* s) const override { LowercaseEachChar(s); }
};

class Strip final : public Normalizer {
 public:
  Strip(bool left, bool right) : left_(left), right_(right) {}
  void Normalize(std::string* s) const override {
    size_t begin = 0, end = s->size();
    if (left_) {
      while (begin < end) {
        size_t pos = begin;
        if (!IsWhitespace(NextCodePoint(*s, &pos))) break;
        begin = pos;
      }
    }
    if (right_) {
      while (end > begin) {
        size_t start = end - 1;
        while (start > begin && (static_cast<unsigned char>((*s)[start]) & 0xC0) == 0x80) --start;
        size_t pos = start;
        if (!IsWhitespace(NextCodePoint(*s, &pos))) break;
        end = start;
      }
    }
    *s = s->substr(begin, end - begin);
  }

 private:
  bool left_, right_;
};

class StripAccents final : public Normalizer {
 public:
  void Normalize(std::string* s) const override {
    std::string out;
    out.reserve(s->size());
    size_t pos = 0;
    while (pos < s->size()) {
      const size_t start = pos;
      if (!IsNonspacingMark(NextCodePoint(*s, &pos))) out.append(*s, start, pos - start);
    }
    *s = std::move(out);
  }
};

class Replace final : public Normalizer {
 public:
  Replace(std::string literal, std::unique_ptr<Regex> regex, std::string content)
      : literal_(std::move(literal)), regex_(std::move(regex)), content_(std::move(content)) {}
  void Normalize(std::string* s) const override {
    if (!regex_) {
      if (!literal_.empty()) *s = absl::StrReplaceAll(*s, {{literal_, content_}});
      return;
    }
    std::string out;
    size_t last = 0;
    regex_->ForEachMatch(*s, [&](size_t start, size_t end) {
      out.append(*s, last, start - last);
      out += content_;
      last = end;
    });
    out.append(*s, last, std::string::npos);
    *s = std::move(out);
  }

 private:
  std::string literal_;
  std::unique_ptr<Regex> regex_;
  std::string content_;
};

class Prepend final : public Normalizer {
 public:
  explicit Prepend(std::string prefix) : prefix_(std::move(prefix)) {}
  void Normalize(std::string* s) const override {
    if (!s->empty()) s->insert(0, prefix_);
  }

 private:
  std::string prefix_;
};

class Sequence final : public Normalizer {
 public:
  explicit Sequence(std::vector<std::unique_ptr<Normalizer>> parts) : parts_(std::move(parts)) {}
  void Normalize(std::string* s) const override {
    for (const auto& p : parts_) p->Normalize(s);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> parts_;
};

absl::StatusOr<std::unique_ptr<Normalizer>> MakeReplace(const JsonField& j) {
  auto content = j.String("content");
  if (!content.ok()) return content.status();
  const JsonField pattern = j["pattern"];
  if (pattern.Has("String")) {
    auto lit = pattern.String("String");
    if (!lit.ok()) return lit.status();
    return std::make_unique<Replace>(*lit, nullptr, *content);
  }
  auto re = pattern.String("Regex");
  if (!re.ok()) return pattern.Error("expected {\"String\": ...} or {\"Regex\": ...}");
  auto compiled = Regex::Compile(*re);
  if (!compiled.ok()) return pattern["Regex"].Error(compiled.status().message());
  return std::make_unique<Replace>("", std::move(*compiled), *content);
}

absl::StatusOr<std::unique_ptr<Normalizer>> MakeSequence(const JsonField& j) {
  const JsonField list = j["normalizers"];
  if (auto st = list.ExpectArray(); !st.ok()) return st;
  std::vector<std::unique_ptr<Normalizer>> parts;
  for (size_t i = 0; i < list.value().size(); ++i) {
    auto n = Normalizer::FromJson(list.at(i));
    if (!n.ok()) return n.status();
    if (*n) parts.push_back(std::move(*n));
  }
  return std::make_unique<Sequence>(std::move(parts));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Normalizer>> Normalizer::FromJson(const JsonField& j) {
  if (j.is_null()) return nullptr;
  if (auto st = j.ExpectObject(); !st.ok()) return st;
  auto type = j.String("type");
  if (!type.ok()) return type.status();
  if (*type == "NFC") return std::make_unique<UnicodeForm>(NormalForm::kNfc);
  if (*type == "NFD") return std::make_unique<UnicodeForm>(NormalForm::kNfd);
  if (*type == "NFKC") return std::make_unique<UnicodeForm>(NormalForm::kNfkc);
  if (*type == "NFKD") return std::make_unique<UnicodeForm>(NormalForm::kNfkd);
  if (*type == "Lowercase") return std::make_unique<Lowercase>();
  if (*type == "StripAccents") return std::make_unique<StripAccents>();
  if (*type == "Strip") {
    auto left = j.Bool("strip_left", true);
    auto right = j.Bool("strip_right", true);
    if (!left.ok()) return left.status();
    if (!right.ok()) return right.status();
    return std::make_unique<Strip>(*left, *right);
  }
  if (*type == "Prepend") {
    auto p = j.String("prepend");
    if (!p.ok()) return p.status();
    return std::make_unique<Prepend>(*p);
  }
  if (*type == "Replace") return MakeReplace(j);
  if (*type == "Sequence") return MakeSequence(j);
  return absl::UnimplementedError(absl::StrCat(j.origin(), ": ", j.path(), ".type: normalizer \"",
                                               *type, "\" is not supported"));
}

}  // namespace ballast::tokenizer
