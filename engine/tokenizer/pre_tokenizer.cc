#include "engine/tokenizer/pre_tokenizer.h"

#include <algorithm>
#include <array>
#include <functional>

#include "absl/strings/str_cat.h"
#include "engine/tokenizer/regex.h"
#include "engine/tokenizer/unicode.h"
#include "engine/tokenizer/utf8.h"

namespace ballast::tokenizer {
namespace {

enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

// A span of a piece's text; `match`: the pattern matched it.
struct Span {
  size_t start, end;
  bool match;
};

// Spans covering `len` bytes, from the pattern's matches (ascending, not
// overlapping): the gaps become non-matching spans.
class SpanBuilder {
 public:
  explicit SpanBuilder(std::vector<Span>* spans) : spans_(spans) { spans_->clear(); }
  void Match(size_t start, size_t end) {
    if (start > last_) spans_->push_back({last_, start, false});
    spans_->push_back({start, end, true});
    last_ = end;
  }
  void Finish(size_t len) {
    if (len > last_) spans_->push_back({last_, len, false});
  }

 private:
  std::vector<Span>* spans_;
  size_t last_ = 0;
};

// NormalizedString::split: turns spans into splits per `b`; appends the
// non-empty ones to `out`.
void EmitSplits(const Piece& in, std::vector<Span>& spans, Behavior b, std::vector<Piece>* out) {
  std::vector<Span> merged;
  bool prev = false;
  switch (b) {
    case Behavior::kIsolated:
      for (auto& s : spans) s.match = false;
      merged = std::move(spans);
      break;
    case Behavior::kRemoved:
      merged = std::move(spans);
      break;
    case Behavior::kContiguous:
      for (const Span& s : spans) {
        if (s.match == prev && !merged.empty()) {
          merged.back().end = s.end;
        } else {
          merged.push_back({s.start, s.end, false});
        }
        prev = s.match;
      }
      break;
    case Behavior::kMergedWithPrevious:
      for (const Span& s : spans) {
        if (s.match && !prev && !merged.empty()) {
          merged.back().end = s.end;
        } else {
          merged.push_back({s.start, s.end, false});
        }
        prev = s.match;
      }
      break;
    case Behavior::kMergedWithNext:
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->match && !prev && !merged.empty()) {
          merged.back().start = it->start;
        } else {
          merged.push_back({it->start, it->end, false});
        }
        prev = it->match;
      }
      std::reverse(merged.begin(), merged.end());
      break;
  }
  for (const Span& s : merged) {
    if (s.match || s.end <= s.start) continue;  // removed, or empty
    out->push_back({in.text.substr(s.start, s.end - s.start), in.at_origin && s.start == 0});
  }
}

// Applies `split_one` to every piece.
void SplitAll(std::vector<Piece>* pieces,
              const std::function<void(const Piece&, std::vector<Piece>*)>& split_one) {
  std::vector<Piece> out;
  out.reserve(pieces->size() * 2);
  for (const Piece& p : *pieces) split_one(p, &out);
  *pieces = std::move(out);
}

// Matches of a char predicate: each matching character alone.
void CharSpans(const std::string& s, bool (*pred)(char32_t), std::vector<Span>* spans) {
  SpanBuilder b(spans);
  size_t pos = 0;
  while (pos < s.size()) {
    const size_t start = pos;
    if (pred(NextCodePoint(s, &pos))) b.Match(start, pos);
  }
  b.Finish(s.size());
}

void LiteralSpans(const std::string& s, const std::string& lit, std::vector<Span>* spans) {
  SpanBuilder b(spans);
  if (!lit.empty()) {
    for (size_t at = s.find(lit); at != std::string::npos; at = s.find(lit, at + lit.size())) {
      b.Match(at, at + lit.size());
    }
  }
  b.Finish(s.size());
}

void RegexSpans(const std::string& s, const Regex& re, std::vector<Span>* spans) {
  SpanBuilder b(spans);
  re.ForEachMatch(s, [&](size_t start, size_t end) { b.Match(start, end); });
  b.Finish(s.size());
}

void Invert(std::vector<Span>* spans) {
  for (auto& s : *spans) s.match = !s.match;
}

class Split final : public PreTokenizer {
 public:
  Split(std::string literal, std::unique_ptr<Regex> regex, Behavior b, bool invert)
      : literal_(std::move(literal)), regex_(std::move(regex)), behavior_(b), invert_(invert) {}
  void PreTokenize(std::vector<Piece>* pieces) const override {
    std::vector<Span> spans;
    SplitAll(pieces, [&](const Piece& p, std::vector<Piece>* out) {
      if (regex_) {
        RegexSpans(p.text, *regex_, &spans);
      } else {
        LiteralSpans(p.text, literal_, &spans);
      }
      if (invert_) Invert(&spans);
      EmitSplits(p, spans, behavior_, out);
    });
  }

 private:
  std::string literal_;
  std::unique_ptr<Regex> regex_;
  Behavior behavior_;
  bool invert_;
};

// Splits on characters for which `pred` holds.
class CharSplit final : public PreTokenizer {
 public:
  CharSplit(bool (*pred)(char32_t), Behavior b) : pred_(pred), behavior_(b) {}
  void PreTokenize(std::vector<Piece>* pieces) const override {
    std::vector<Span> spans;
    SplitAll(pieces, [&](const Piece& p, std::vector<Piece>* out) {
      CharSpans(p.text, pred_, &spans);
      EmitSplits(p, spans, behavior_, out);
    });
  }

 private:
  bool (*pred_)(char32_t);
  Behavior behavior_;
};

class CharDelimiterSplit final : public PreTokenizer {
 public:
  explicit CharDelimiterSplit(char32_t d) { AppendUtf8(d, &delimiter_); }
  void PreTokenize(std::vector<Piece>* pieces) const override {
    std::vector<Span> spans;
    SplitAll(pieces, [&](const Piece& p, std::vector<Piece>* out) {
      LiteralSpans(p.text, delimiter_, &spans);
      EmitSplits(p, spans, Behavior::kRemoved, out);
    });
  }

 private:
  std::string delimiter_;
};

// Whitespace: keeps the matches of \w+|[^\w\s]+ (the regex crate's \w).
class Whitespace final : public PreTokenizer {
 public:
  explicit Whitespace(std::unique_ptr<Regex> re) : re_(std::move(re)) {}
  void PreTokenize(std::vector<Piece>* pieces) const override {
    std::vector<Span> spans;
    SplitAll(pieces, [&](const Piece& p, std::vector<Piece>* out) {
      RegexSpans(p.text, *re_, &spans);
      Invert(&spans);
      EmitSplits(p, spans, Behavior::kRemoved, out);
    });
  }

 private:
  std::unique_ptr<Regex> re_;
};

std::string MapBytes(const std::string& s) {
  std::string out;
  out.reserve(s.size() * 2);
  for (unsigned char c : s) out += ByteLevelChar(c);
  return out;
}

class ByteLevel final : public PreTokenizer {
 public:
  ByteLevel(bool add_prefix_space, std::unique_ptr<Regex> re)
      : add_prefix_space_(add_prefix_space), re_(std::move(re)) {}
  void PreTokenize(std::vector<Piece>* pieces) const override {
    std::vector<Span> spans;
    SplitAll(pieces, [&](const Piece& in, std::vector<Piece>* out) {
      Piece p = in;
      // (insert(begin, ' '): GCC 12's -Wrestrict misfires on insert(0, " ").)
      if (add_prefix_space_ && (p.text.empty() || p.text[0] != ' ')) {
        p.text.insert(p.text.begin(), ' ');
      }
      if (!re_) {
        out->push_back({MapBytes(p.text), p.at_origin});
        return;
      }
      RegexSpans(p.text, *re_, &spans);
      const size_t first = out->size();
      EmitSplits(p, spans, Behavior::kIsolated, out);
      for (size_t i = first; i < out->size(); ++i) (*out)[i].text = MapBytes((*out)[i].text);
    });
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<Regex> re_;
};

enum class Prepend { kAlways, kFirst, kNever };

class Metaspace final : public PreTokenizer {
 public:
  Metaspace(char32_t replacement, Prepend prepend, bool split) : prepend_(prepend), split_(split) {
    AppendUtf8(replacement, &replacement_);
  }
  void PreTokenize(std::vector<Piece>* pieces) const override {
    std::vector<Span> spans;
    SplitAll(pieces, [&](const Piece& in, std::vector<Piece>* out) {
      Piece p{std::string(), in.at_origin};
      p.text.reserve(in.text.size() + 8);
      for (char c : in.text) {
        if (c == ' ') {
          p.text += replacement_;
        } else {
          p.text += c;
        }
      }
      const bool starts = p.text.compare(0, replacement_.size(), replacement_) == 0;
      if (!starts &&
          (prepend_ == Prepend::kAlways || (prepend_ == Prepend::kFirst && p.at_origin))) {
        p.text.insert(0, replacement_);
      }
      if (!split_) {
        if (!p.text.empty()) out->push_back(std::move(p));
        return;
      }
      LiteralSpans(p.text, replacement_, &spans);
      EmitSplits(p, spans, Behavior::kMergedWithNext, out);
    });
  }

 private:
  std::string replacement_;
  Prepend prepend_;
  bool split_;
};

class Sequence final : public PreTokenizer {
 public:
  explicit Sequence(std::vector<std::unique_ptr<PreTokenizer>> parts) : parts_(std::move(parts)) {}
  void PreTokenize(std::vector<Piece>* pieces) const override {
    for (const auto& p : parts_) p->PreTokenize(pieces);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> parts_;
};

class BertPreTokenizer final : public PreTokenizer {
 public:
  void PreTokenize(std::vector<Piece>* pieces) const override {
    CharSplit(IsWhitespace, Behavior::kRemoved).PreTokenize(pieces);
    CharSplit(IsPunctuation, Behavior::kIsolated).PreTokenize(pieces);
  }
};

absl::StatusOr<Behavior> ParseBehavior(const JsonField& j, std::string_view key, Behavior dflt) {
  auto s = j.OptionalString(key);
  if (!s.ok()) return s.status();
  if (!s->has_value()) return dflt;
  const std::string& v = **s;
  if (v == "Removed") return Behavior::kRemoved;
  if (v == "Isolated") return Behavior::kIsolated;
  if (v == "MergedWithPrevious") return Behavior::kMergedWithPrevious;
  if (v == "MergedWithNext") return Behavior::kMergedWithNext;
  if (v == "Contiguous") return Behavior::kContiguous;
  return j[key].Error(absl::StrCat("unknown behavior \"", v,
                                   "\" (expected Removed, Isolated, MergedWithPrevious, "
                                   "MergedWithNext or Contiguous)"));
}

absl::StatusOr<std::unique_ptr<PreTokenizer>> MakeSplit(const JsonField& j) {
  auto behavior = ParseBehavior(j, "behavior", Behavior::kIsolated);
  if (!behavior.ok()) return behavior.status();
  auto invert = j.Bool("invert", false);
  if (!invert.ok()) return invert.status();
  const JsonField pattern = j["pattern"];
  if (pattern.Has("String")) {
    auto lit = pattern.String("String");
    if (!lit.ok()) return lit.status();
    return std::make_unique<Split>(*lit, nullptr, *behavior, *invert);
  }
  auto re = pattern.String("Regex");
  if (!re.ok()) return pattern.Error("expected {\"String\": ...} or {\"Regex\": ...}");
  auto compiled = Regex::Compile(*re);
  if (!compiled.ok()) return pattern["Regex"].Error(compiled.status().message());
  return std::make_unique<Split>("", std::move(*compiled), *behavior, *invert);
}

absl::StatusOr<std::unique_ptr<PreTokenizer>> MakeByteLevel(const JsonField& j) {
  auto prefix = j.Bool("add_prefix_space", true);
  auto use_regex = j.Bool("use_regex", true);
  if (!prefix.ok()) return prefix.status();
  if (!use_regex.ok()) return use_regex.status();
  std::unique_ptr<Regex> re;
  if (*use_regex) {
    auto compiled = Regex::Compile(
        R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)");
    if (!compiled.ok()) return compiled.status();
    re = std::move(*compiled);
  }
  return std::make_unique<ByteLevel>(*prefix, std::move(re));
}

absl::StatusOr<std::unique_ptr<PreTokenizer>> MakeMetaspace(const JsonField& j) {
  auto replacement = j.Char("replacement");
  if (!replacement.ok()) return replacement.status();
  auto split = j.Bool("split", true);
  if (!split.ok()) return split.status();
  Prepend prepend = Prepend::kAlways;
  auto scheme = j.OptionalString("prepend_scheme");
  if (!scheme.ok()) return scheme.status();
  if (scheme->has_value()) {
    if (**scheme == "always") {
      prepend = Prepend::kAlways;
    } else if (**scheme == "first") {
      prepend = Prepend::kFirst;
    } else if (**scheme == "never") {
      prepend = Prepend::kNever;
    } else {
      return j["prepend_scheme"].Error(
          absl::StrCat("unknown value \"", **scheme, "\" (expected always, first or never)"));
    }
  } else {
    auto legacy = j.Bool("add_prefix_space", true);  // before prepend_scheme existed
    if (!legacy.ok()) return legacy.status();
    prepend = *legacy ? Prepend::kAlways : Prepend::kNever;
  }
  return std::make_unique<Metaspace>(*replacement, prepend, *split);
}

absl::StatusOr<std::unique_ptr<PreTokenizer>> MakeSequence(const JsonField& j) {
  const JsonField list = j["pretokenizers"];
  if (auto st = list.ExpectArray(); !st.ok()) return st;
  std::vector<std::unique_ptr<PreTokenizer>> parts;
  for (size_t i = 0; i < list.value().size(); ++i) {
    auto p = PreTokenizer::FromJson(list.at(i));
    if (!p.ok()) return p.status();
    if (*p) parts.push_back(std::move(*p));
  }
  return std::make_unique<Sequence>(std::move(parts));
}

absl::StatusOr<std::unique_ptr<PreTokenizer>> MakeWhitespace() {
  // The regex crate's \w (Alphabetic, M, Nd, Pc, Join_Control) and \s.
  constexpr char kWord[] = R"([\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\x{200C}\x{200D}])";
  constexpr char kNotWordSpace[] = R"([^\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\x{200C}\x{200D}\s])";
  auto re = Regex::Compile(absl::StrCat(kWord, "+|", kNotWordSpace, "+"));
  if (!re.ok()) return re.status();
  return std::make_unique<Whitespace>(std::move(*re));
}

}  // namespace

absl::StatusOr<std::unique_ptr<PreTokenizer>> PreTokenizer::FromJson(const JsonField& j) {
  if (j.is_null()) return nullptr;
  if (auto st = j.ExpectObject(); !st.ok()) return st;
  auto type = j.String("type");
  if (!type.ok()) return type.status();
  if (*type == "Split") return MakeSplit(j);
  if (*type == "ByteLevel") return MakeByteLevel(j);
  if (*type == "Metaspace") return MakeMetaspace(j);
  if (*type == "Sequence") return MakeSequence(j);
  if (*type == "Whitespace") return MakeWhitespace();
  if (*type == "WhitespaceSplit") {
    return std::make_unique<CharSplit>(IsWhitespace, Behavior::kRemoved);
  }
  if (*type == "BertPreTokenizer") return std::make_unique<BertPreTokenizer>();
  if (*type == "Digits") {
    auto individual = j.Bool("individual_digits", false);
    if (!individual.ok()) return individual.status();
    return std::make_unique<CharSplit>(IsNumeric,
                                       *individual ? Behavior::kIsolated : Behavior::kContiguous);
  }
  if (*type == "Punctuation") {
    auto behavior = ParseBehavior(j, "behavior", Behavior::kIsolated);
    if (!behavior.ok()) return behavior.status();
    return std::make_unique<CharSplit>(IsPunctuation, *behavior);
  }
  if (*type == "CharDelimiterSplit") {
    auto d = j.Char("delimiter");
    if (!d.ok()) return d.status();
    return std::make_unique<CharDelimiterSplit>(*d);
  }
  return absl::UnimplementedError(absl::StrCat(
      j.origin(), ": ", j.path(), ".type: pre-tokenizer \"", *type, "\" is not supported"));
}

namespace {

struct ByteTables {
  ByteTables() {
    byte_of.fill(-1);
    std::array<bool, 256> direct{};
    for (int b = 0; b < 256; ++b) {
      direct[b] = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    }
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const char32_t cp = direct[b] ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++);
      AppendUtf8(cp, &chars[b]);
      byte_of[cp] = b;
    }
  }
  std::array<std::string, 256> chars;
  std::array<int, 512> byte_of;
};

const ByteTables& Tables() {
  static const ByteTables* t = new ByteTables();
  return *t;
}

}  // namespace

const std::string& ByteLevelChar(unsigned char b) { return Tables().chars[b]; }

int ByteLevelByte(char32_t cp) { return cp < 512 ? Tables().byte_of[cp] : -1; }

}  // namespace ballast::tokenizer
