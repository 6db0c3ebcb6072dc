#include "engine/chat/lexer.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>

#include "absl/status/status.h"
#include "engine/chat/cat.h"
#include "engine/chat/unicode.h"

namespace ballast::chat {
namespace {

bool IsDigitChar(char c) { return c >= '0' && c <= '9'; }
bool IsNameStart(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool IsNameChar(char c) { return IsNameStart(c) || IsDigitChar(c); }

// Jinja's newline rules: \r\n, \r and \n all become \n; one trailing
// newline is dropped (keep_trailing_newline=False).
std::string NormalizeNewlines(std::string_view source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out.push_back('\n');
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out.push_back(source[i]);
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

// Length of the Python-whitespace run (\s*) starting at `pos`.
size_t SpaceRun(std::string_view s, size_t pos) {
  size_t i = pos;
  while (i < s.size()) {
    char32_t cp;
    const int n = unicode::DecodeAt(s, i, &cp);
    if (!unicode::IsSpace(cp)) break;
    i += n;
  }
  return i - pos;
}

class Lexer {
 public:
  explicit Lexer(std::string source) : src_(std::move(source)) {
    line_starts_.push_back(0);
    for (size_t i = 0; i < src_.size(); ++i) {
      if (src_[i] == '\n') line_starts_.push_back(i + 1);
    }
  }

  absl::StatusOr<std::vector<Token>> Run();

 private:
  SourcePos PosAt(size_t offset) const;
  absl::Status Error(size_t offset, std::string_view message) const {
    return absl::InvalidArgumentError(
        Cat("chat template ", FormatPos(PosAt(offset)), ": ", message));
  }
  void Emit(Token::Type type, std::string value, size_t offset) {
    Token t;
    t.type = type;
    t.value = std::move(value);
    t.pos = PosAt(offset);
    tokens_.push_back(std::move(t));
  }
  // lstrip_blocks: the text before a `{%`/`{#` loses its last line when that
  // line is only whitespace (Python's \s, as Jinja 3.1.3+ matches it) and
  // starts a line (after a newline, or at a match that ended with one).
  std::string_view LstripBlock(std::string_view text) const {
    const size_t nl = text.rfind('\n');
    const size_t l_pos = nl == std::string_view::npos ? 0 : nl + 1;
    if ((l_pos > 0 || line_starting_) && l_pos < text.size() &&
        SpaceRun(text, l_pos) == text.size() - l_pos) {
      return text.substr(0, l_pos);
    }
    return text;
  }
  void EmitText(std::string_view text, size_t offset) {
    if (!text.empty()) Emit(Token::Type::kText, std::string(text), offset);
  }
  // Matches `{%[-+]?\s*raw\s*(-%}\s*|%})` at `pos`; returns its end or npos.
  size_t MatchRawBegin(size_t pos) const;
  absl::Status LexRaw(size_t body_start);
  absl::Status LexComment(size_t pos);
  // Lexes the expression tokens of a {{ }} or {% %} tag up to its end.
  absl::Status LexTag(size_t pos, bool block);
  // Tries the tag end at `pos`: returns its length (trailing whitespace
  // consumed as Jinja does) or 0.
  size_t MatchTagEnd(size_t pos, bool block) const;
  absl::StatusOr<size_t> LexOne(size_t pos);
  absl::StatusOr<size_t> LexNumber(size_t pos);
  absl::StatusOr<size_t> LexString(size_t pos);

  std::string src_;
  std::vector<size_t> line_starts_;
  std::vector<Token> tokens_;
  std::vector<char> brackets_;
  size_t pos_ = 0;
  // Whether the last match ended with a newline (Jinja's line_starting).
  bool line_starting_ = true;
};

SourcePos Lexer::PosAt(size_t offset) const {
  const auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset);
  const size_t line = static_cast<size_t>(it - line_starts_.begin());
  const size_t start = line_starts_[line - 1];
  return {
      static_cast<int>(line),
      static_cast<int>(unicode::Length(std::string_view(src_).substr(start, offset - start))) + 1};
}

absl::StatusOr<std::vector<Token>> Lexer::Run() {
  const std::string_view s = src_;
  while (pos_ < s.size()) {
    size_t tag = pos_;
    while ((tag = s.find('{', tag)) != std::string_view::npos) {
      if (tag + 1 < s.size() && (s[tag + 1] == '{' || s[tag + 1] == '%' || s[tag + 1] == '#'))
        break;
      ++tag;
    }
    if (tag == std::string_view::npos) {
      EmitText(s.substr(pos_), pos_);
      break;
    }
    const char kind = s[tag + 1];
    const char sign = tag + 2 < s.size() ? s[tag + 2] : '\0';
    std::string_view text = s.substr(pos_, tag - pos_);
    if (sign == '-') {
      text = unicode::Strip(text, unicode::StripSide::kRight);
    } else if (sign != '+' && kind != '{') {
      text = LstripBlock(text);
    }
    EmitText(text, pos_);
    const size_t open_len = (sign == '-' || sign == '+') ? 3 : 2;
    absl::Status status;
    if (kind == '%') {
      if (const size_t raw_end = MatchRawBegin(tag); raw_end != std::string_view::npos) {
        line_starting_ = s[raw_end - 1] == '\n';
        status = LexRaw(raw_end);
      } else {
        Emit(Token::Type::kBlockBegin, "{%", tag);
        status = LexTag(tag + open_len, /*block=*/true);
      }
    } else if (kind == '{') {
      Emit(Token::Type::kVarBegin, "{{", tag);
      status = LexTag(tag + open_len, /*block=*/false);
    } else {
      status = LexComment(tag + open_len);
    }
    if (!status.ok()) return status;
  }
  Emit(Token::Type::kEnd, "", s.size());
  return std::move(tokens_);
}

size_t Lexer::MatchRawBegin(size_t pos) const {
  const std::string_view s = src_;
  size_t i = pos + 2;
  if (i < s.size() && (s[i] == '-' || s[i] == '+')) ++i;
  i += SpaceRun(s, i);
  if (s.substr(i, 3) != "raw") return std::string_view::npos;
  i += 3;
  i += SpaceRun(s, i);
  if (s.substr(i, 3) == "-%}") return i + 3 + SpaceRun(s, i + 3);
  if (s.substr(i, 2) == "%}") return i + 2;
  return std::string_view::npos;
}

absl::Status Lexer::LexRaw(size_t body_start) {
  const std::string_view s = src_;
  for (size_t tag = s.find("{%", body_start); tag != std::string_view::npos;
       tag = s.find("{%", tag + 1)) {
    size_t i = tag + 2;
    const char sign = i < s.size() ? s[i] : '\0';
    if (sign == '-' || sign == '+') ++i;
    i += SpaceRun(s, i);
    if (s.substr(i, 6) != "endraw") continue;
    i += 6;
    i += SpaceRun(s, i);
    size_t end;
    if (s.substr(i, 3) == "+%}") {
      end = i + 3;
    } else if (s.substr(i, 3) == "-%}") {
      end = i + 3 + SpaceRun(s, i + 3);
    } else if (s.substr(i, 2) == "%}") {
      end = i + 2 + (i + 2 < s.size() && s[i + 2] == '\n' ? 1 : 0);
    } else {
      continue;
    }
    std::string_view text = s.substr(body_start, tag - body_start);
    if (sign == '-') {
      text = unicode::Strip(text, unicode::StripSide::kRight);
    } else if (sign != '+') {
      text = LstripBlock(text);
    }
    EmitText(text, body_start);
    pos_ = end;
    line_starting_ = s[end - 1] == '\n';
    return absl::OkStatus();
  }
  return Error(body_start, "missing end of raw directive ({% endraw %})");
}

absl::Status Lexer::LexComment(size_t pos) {
  const std::string_view s = src_;
  if (pos >= s.size()) {  // Jinja drops a `{#` that ends the template
    pos_ = pos;
    return absl::OkStatus();
  }
  for (size_t i = pos; i < s.size(); ++i) {
    size_t end = 0;
    if (s.substr(i, 3) == "+#}") {
      end = i + 3;
    } else if (s.substr(i, 3) == "-#}") {
      end = i + 3 + SpaceRun(s, i + 3);
    } else if (s.substr(i, 2) == "#}") {
      end = i + 2 + (i + 2 < s.size() && s[i + 2] == '\n' ? 1 : 0);
    } else {
      continue;
    }
    pos_ = end;
    line_starting_ = s[end - 1] == '\n';
    return absl::OkStatus();
  }
  return Error(pos, "missing end of comment tag");
}

size_t Lexer::MatchTagEnd(size_t pos, bool block) const {
  const std::string_view s = src_;
  const std::string_view close = block ? "%}" : "}}";
  if (block && s.substr(pos, 3) == "+%}") return 3;
  if (s.substr(pos, 1) == "-" && s.substr(pos + 1, 2) == close) {
    return 3 + SpaceRun(s, pos + 3);
  }
  if (s.substr(pos, 2) == close) {
    return 2 + (block && pos + 2 < s.size() && s[pos + 2] == '\n' ? 1 : 0);
  }
  return 0;
}

absl::Status Lexer::LexTag(size_t pos, bool block) {
  const std::string_view s = src_;
  brackets_.clear();
  while (pos < s.size()) {
    if (brackets_.empty()) {
      if (const size_t n = MatchTagEnd(pos, block); n > 0) {
        Emit(block ? Token::Type::kBlockEnd : Token::Type::kVarEnd, block ? "%}" : "}}", pos);
        pos_ = pos + n;
        line_starting_ = s[pos_ - 1] == '\n';
        return absl::OkStatus();
      }
    }
    if (const size_t ws = SpaceRun(s, pos); ws > 0) {
      pos += ws;
      continue;
    }
    auto next = LexOne(pos);
    if (!next.ok()) return next.status();
    pos = *next;
  }
  return Error(pos, block ? "unexpected end of template: missing '%}'"
                          : "unexpected end of template: missing '}}'");
}

absl::StatusOr<size_t> Lexer::LexOne(size_t pos) {
  const std::string_view s = src_;
  const char c = s[pos];
  if (IsDigitChar(c)) return LexNumber(pos);
  if (IsNameStart(c)) {
    size_t end = pos;
    while (end < s.size() && IsNameChar(s[end])) ++end;
    Emit(Token::Type::kName, std::string(s.substr(pos, end - pos)), pos);
    return end;
  }
  if (c == '\'' || c == '"') return LexString(pos);
  static constexpr std::string_view kTwoChar[] = {"//", "**", "==", "!=", ">=", "<="};
  for (std::string_view op : kTwoChar) {
    if (s.substr(pos, 2) == op) {
      Emit(Token::Type::kOperator, std::string(op), pos);
      return pos + 2;
    }
  }
  if (std::string_view("+-/*%~[](){}><=.:|,;").find(c) == std::string_view::npos) {
    return Error(pos, Cat("unexpected character '", std::string(1, c), "'"));
  }
  if (c == '(' || c == '[' || c == '{') {
    brackets_.push_back(c == '(' ? ')' : (c == '[' ? ']' : '}'));
  } else if (c == ')' || c == ']' || c == '}') {
    if (brackets_.empty()) return Error(pos, Cat("unexpected '", std::string(1, c), "'"));
    if (brackets_.back() != c) {
      return Error(pos, Cat("unexpected '", std::string(1, c), "', expected '",
                            std::string(1, brackets_.back()), "'"));
    }
    brackets_.pop_back();
  }
  Emit(Token::Type::kOperator, std::string(1, c), pos);
  return pos + 1;
}

absl::StatusOr<size_t> Lexer::LexNumber(size_t pos) {
  const std::string_view s = src_;
  auto digits = [&](size_t i) {  // (\d+_)*\d+
    size_t j = i;
    while (j < s.size() && (IsDigitChar(s[j]) ||
                            (s[j] == '_' && j > i && j + 1 < s.size() && IsDigitChar(s[j + 1])))) {
      ++j;
    }
    return j;
  };
  size_t end = digits(pos);
  bool is_float = false;
  if (end + 1 < s.size() && s[end] == '.' && IsDigitChar(s[end + 1])) {
    end = digits(end + 1);
    is_float = true;
  }
  if (end < s.size() && (s[end] == 'e' || s[end] == 'E')) {
    size_t j = end + 1;
    if (j < s.size() && (s[j] == '+' || s[j] == '-')) ++j;
    if (j < s.size() && IsDigitChar(s[j])) {
      end = digits(j);
      is_float = true;
    }
  }
  std::string text;
  for (char ch : s.substr(pos, end - pos)) {
    if (ch != '_') text.push_back(ch);
  }
  Token t;
  t.type = is_float ? Token::Type::kFloat : Token::Type::kInt;
  t.value = text;
  t.pos = PosAt(pos);
  errno = 0;
  if (is_float) {
    t.float_value = std::strtod(text.c_str(), nullptr);
  } else {
    t.int_value = std::strtoll(text.c_str(), nullptr, 10);
  }
  if (errno == ERANGE && !is_float) {
    return absl::UnimplementedError(
        Cat("chat template ", FormatPos(t.pos), ": unsupported integer literal beyond 64 bits"));
  }
  tokens_.push_back(std::move(t));
  return end;
}

// Appends the character that the escape `\e` (after the backslash at
// s[i-2..]) stands for, Python's string-literal rules; advances *i past any
// hex/octal digits. Returns false for a truncated \x/\u/\U escape.
bool AppendEscape(std::string_view s, char e, size_t* i, std::string* value) {
  static constexpr std::string_view kSimple = "ntr\\'\"abfv";
  static constexpr std::string_view kMapped = "\n\t\r\\'\"\a\b\f\v";
  if (const size_t k = kSimple.find(e); k != std::string_view::npos) {
    value->push_back(kMapped[k]);
  } else if (e == '\n') {  // line continuation
  } else if (e == 'x' || e == 'u' || e == 'U') {
    const size_t n = e == 'x' ? 2 : (e == 'u' ? 4 : 8);
    const std::string hex(s.substr(*i, n));
    if (hex.size() != n || hex.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos) {
      return false;
    }
    unicode::Append(static_cast<char32_t>(std::strtoul(hex.c_str(), nullptr, 16)), value);
    *i += n;
  } else if (e >= '0' && e <= '7') {  // octal, up to 3 digits
    unsigned v = e - '0';
    for (int k = 0; k < 2 && *i < s.size() && s[*i] >= '0' && s[*i] <= '7'; ++k) {
      v = v * 8 + (s[(*i)++] - '0');
    }
    unicode::Append(v, value);
  } else {  // unknown escapes keep their backslash, as Python does
    value->push_back('\\');
    value->push_back(e);
  }
  return true;
}

absl::StatusOr<size_t> Lexer::LexString(size_t pos) {
  const std::string_view s = src_;
  const char quote = s[pos];
  std::string value;
  size_t i = pos + 1;
  while (i < s.size() && s[i] != quote) {
    if (s[i] != '\\') {
      value.push_back(s[i++]);
      continue;
    }
    if (i + 1 >= s.size()) break;
    const char e = s[i + 1];
    i += 2;
    if (!AppendEscape(s, e, &i, &value)) {
      return Error(i - 2, Cat("truncated \\", std::string(1, e), " escape in string literal"));
    }
  }
  if (i >= s.size()) return Error(pos, "unterminated string literal");
  Emit(Token::Type::kString, std::move(value), pos);
  return i + 1;
}

}  // namespace

std::string FormatPos(SourcePos pos) { return Cat(pos.line, ":", pos.column); }

absl::StatusOr<std::vector<Token>> Tokenize(std::string_view source) {
  return Lexer(NormalizeNewlines(source)).Run();
}

}  // namespace ballast::chat
