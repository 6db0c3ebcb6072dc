// Jinja's value and string filters, the filter registry, and HF's tojson.
#include <algorithm>
#include <cerrno>
#include <cfenv>
#include <cmath>
#include <cstdlib>

#include "absl/status/status.h"
#include "engine/chat/builtins.h"
#include "engine/chat/filters_internal.h"
#include "engine/chat/operators.h"
#include "engine/chat/unicode.h"

namespace ballast::chat {
namespace {

using internal::FilterFn;

// Filters Jinja 3.1 ships; the ones not in kFilters below fail as
// unsupported.
constexpr std::string_view kJinjaFilters[] = {
    "abs",    "attr",       "batch",       "capitalize", "center",   "count",
    "d",      "default",    "dictsort",    "e",          "escape",   "filesizeformat",
    "first",  "float",      "forceescape", "format",     "groupby",  "indent",
    "int",    "items",      "join",        "last",       "length",   "list",
    "lower",  "map",        "max",         "min",        "pprint",   "random",
    "reject", "rejectattr", "replace",     "reverse",    "round",    "safe",
    "select", "selectattr", "slice",       "sort",       "string",   "striptags",
    "sum",    "title",      "tojson",      "trim",       "truncate", "unique",
    "upper",  "urlencode",  "urlize",      "wordcount",  "wordwrap", "xmlattr",
};

#define BIND(name, ...)                           \
  ArgBinder b(name, args, kwargs, {__VA_ARGS__}); \
  if (!b.status().ok()) return b.status()

absl::StatusOr<Value> FilterTrim(const Value& in, const ValueList& args, const Kwargs& kwargs) {
  BIND("trim", "chars");
  auto text = TextOf(in);
  if (!text.ok()) return text.status();
  const std::string& s = *text;
  if (!b.Has(0) || b.Get(0).is_none()) {
    return Value::String(std::string(unicode::Strip(s, unicode::StripSide::kBoth)));
  }
  if (!b.Get(0).is_string()) return TypeErrorStatus("strip arg must be None or str");
  const std::string_view chars = b.Get(0).AsString();
  return Value::String(std::string(unicode::Strip(s, unicode::StripSide::kBoth, &chars)));
}

absl::StatusOr<Value> FilterUpper(const Value& in, const ValueList& args, const Kwargs& kwargs) {
  BIND("upper");
  auto text = TextOf(in);
  if (!text.ok()) return text.status();
  return Value::String(unicode::Upper(*text));
}

absl::StatusOr<Value> FilterLower(const Value& in, const ValueList& args, const Kwargs& kwargs) {
  BIND("lower");
  auto text = TextOf(in);
  if (!text.ok()) return text.status();
  return Value::String(unicode::Lower(*text));
}

absl::StatusOr<Value> FilterCapitalize(const Value& in, const ValueList& args,
                                       const Kwargs& kwargs) {
  BIND("capitalize");
  auto text = TextOf(in);
  if (!text.ok()) return text.status();
  return Value::String(unicode::Capitalize(*text));
}

// Jinja's title: words start after '-', whitespace or an opening bracket.
absl::StatusOr<Value> FilterTitle(const Value& in, const ValueList& args, const Kwargs& kwargs) {
  BIND("title");
  auto text = TextOf(in);
  if (!text.ok()) return text.status();
  const std::string& s = *text;
  std::string out;
  bool word_start = true;
  for (size_t i = 0; i < s.size();) {
    char32_t cp;
    const int n = unicode::DecodeAt(s, i, &cp);
    const bool sep =
        cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || unicode::IsSpace(cp);
    const std::string piece = s.substr(i, n);
    out += sep ? piece : (word_start ? unicode::Upper(piece) : unicode::Lower(piece));
    word_start = sep;
    i += n;
  }
  return Value::String(std::move(out));
}

absl::StatusOr<Value> FilterString(const Value& in, const ValueList& args, const Kwargs& kwargs) {
  BIND("string");
  if (in.is_string()) return in;
  auto text = TextOf(in);
  if (!text.ok()) return text.status();
  return Value::String(std::move(*text));
}

absl::StatusOr<Value> FilterSafe(const Value& in, const ValueList& args, const Kwargs& kwargs) {
  BIND("safe");
  return in;
}

absl::StatusOr<Value> FilterLength(const Value& in, const ValueList& args, const Kwargs& kwargs) {
  BIND("length");
  auto n = Length(in);
  if (!n.ok()) return n.status();
  return Value::Int(*n);
}

absl::StatusOr<Value> FilterDefault(const Value& in, const ValueList& args, const Kwargs& kwargs) {
  BIND("default", "default_value", "boolean");
  const bool boolean = b.Get(1).Truthy();
  if (in.is_undefined() || (boolean && !in.Truthy())) {
    return b.Has(0) ? b.Get(0) : Value::String("");
  }
  return in;
}

absl::StatusOr<Value> FilterReplace(const Value& in, const ValueList& args, const Kwargs& kwargs) {
  BIND("replace", "old", "new", "count");
  auto text = TextOf(in);
  if (!text.ok()) return text.status();
  auto method = GetAttr(Value::String(std::move(*text)), "replace");
  if (!method.ok()) return method.status();
  auto old_text = TextOf(b.Get(0));
  if (!old_text.ok()) return old_text.status();
  auto new_text = TextOf(b.Get(1));
  if (!new_text.ok()) return new_text.status();
  ValueList call_args = {Value::String(std::move(*old_text)), Value::String(std::move(*new_text))};
  if (b.Has(2) && !b.Get(2).is_none()) call_args.push_back(b.Get(2));
  return method->AsCallable().fn(call_args, {});
}

absl::StatusOr<Value> FilterIndent(const Value& in, const ValueList& args, const Kwargs& kwargs) {
  BIND("indent", "width", "first", "blank");
  if (in.is_undefined()) return absl::InvalidArgumentError(in.UndefinedHint());
  if (!in.is_string()) {
    return TypeErrorStatus(
        Cat("unsupported operand type(s) for +=: '", in.TypeName(), "' and 'str'"));
  }
  if (b.Has(0) && !b.Get(0).is_string() && !b.Get(0).is_int() && !b.Get(0).is_bool()) {
    return TypeErrorStatus(
        Cat("can't multiply sequence by non-int of type '", b.Get(0).TypeName(), "'"));
  }
  const int64_t spaces = b.Get(0).is_string() ? 0 : (b.Has(0) ? b.Get(0).AsInt() : 4);
  if (auto st = CheckStringBytes(std::max<int64_t>(spaces, 0)); !st.ok()) return st;
  std::string indention =
      b.Get(0).is_string() ? b.Get(0).AsString() : std::string(std::max<int64_t>(spaces, 0), ' ');
  auto text = TextOf(in);
  if (!text.ok()) return text.status();
  const std::string s = *text + "\n";  // Jinja appends a newline before splitlines()
  const auto lines = unicode::SplitLines(s);
  // Every line but the first may take the indention.
  if (auto st = CheckStringBytes(s.size() + lines.size() * (indention.size() + 1)); !st.ok()) {
    return st;
  }
  std::string rv;
  if (b.Get(2).Truthy()) {  // blank: indent empty lines too
    for (size_t i = 0; i < lines.size(); ++i) rv += (i > 0 ? "\n" + indention : "") + lines[i];
  } else {
    rv = lines.empty() ? "" : lines[0];
    for (size_t i = 1; i < lines.size(); ++i) {
      rv += "\n" + (lines[i].empty() ? lines[i] : indention + lines[i]);
    }
  }
  if (b.Get(1).Truthy()) rv = indention + rv;
  return Value::String(std::move(rv));
}

absl::StatusOr<Value> FilterCenter(const Value& in, const ValueList& args, const Kwargs& kwargs) {
  BIND("center", "width");
  auto text = TextOf(in);
  if (!text.ok()) return text.status();
  const std::string& s = *text;
  const int64_t width = b.Has(0) ? b.Get(0).AsInt() : 80;
  const int64_t len = static_cast<int64_t>(unicode::Length(s));
  if (width <= len) return Value::String(s);
  if (auto st = CheckStringBytes(s.size() + static_cast<uint64_t>(width - len)); !st.ok()) {
    return st;
  }
  const int64_t marg = width - len;
  const int64_t left = marg / 2 + (marg & width & 1);  // CPython's pad()
  return Value::String(std::string(left, ' ') + s + std::string(marg - left, ' '));
}

absl::StatusOr<Value> FilterWordcount(const Value& in, const ValueList& args,
                                      const Kwargs& kwargs) {
  BIND("wordcount");
  auto text = TextOf(in);
  if (!text.ok()) return text.status();
  const std::string& s = *text;
  int64_t words = 0;
  bool in_word = false;
  for (size_t i = 0; i < s.size();) {
    char32_t cp;
    i += unicode::DecodeAt(s, i, &cp);
    const bool w = cp == '_' || unicode::IsAlpha(cp) || unicode::IsDigit(cp) || cp >= 0x80;
    const bool word_char = w && !unicode::IsSpace(cp);
    if (word_char && !in_word) ++words;
    in_word = word_char;
  }
  return Value::Int(words);
}

absl::StatusOr<Value> FilterEscape(const Value& in, const ValueList& args, const Kwargs& kwargs) {
  BIND("escape");
  std::string out;
  auto text = TextOf(in);
  if (!text.ok()) return text.status();
  for (char c : *text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out.push_back(c);
    }
  }
  return Value::String(std::move(out));
}

absl::StatusOr<Value> FilterAbs(const Value& in, const ValueList& args, const Kwargs& kwargs) {
  BIND("abs");
  if (in.is_float()) return Value::Float(std::fabs(in.AsDouble()));
  if (in.is_int() || in.is_bool()) return Value::Int(std::llabs(in.AsInt()));
  return TypeErrorStatus(Cat("bad operand type for abs(): '", in.TypeName(), "'"));
}

// Python's float(str) for the forms templates use.
bool ParseFloat(std::string_view s, double* out) {
  const std::string t(unicode::Strip(s, unicode::StripSide::kBoth));
  if (t.empty()) return false;
  char* end = nullptr;
  *out = std::strtod(t.c_str(), &end);
  return end == t.c_str() + t.size();
}

absl::StatusOr<Value> FilterInt(const Value& in, const ValueList& args, const Kwargs& kwargs) {
  BIND("int", "default", "base");
  if (in.is_undefined()) return absl::InvalidArgumentError(in.UndefinedHint());
  const Value fallback = b.Has(0) ? b.Get(0) : Value::Int(0);
  if (in.is_int() || in.is_bool()) return Value::Int(in.AsInt());
  // Python ints are unbounded; beyond 64 bits is a clear error, not a wrapped value.
  auto to_int = [](double d) -> absl::StatusOr<Value> {
    if (std::fabs(d) >= 9.2e18)
      return absl::UnimplementedError("unsupported: integer beyond 64 bits");
    return Value::Int(static_cast<int64_t>(std::trunc(d)));
  };
  if (in.is_float()) {
    if (!std::isfinite(in.AsDouble())) return fallback;
    return to_int(in.AsDouble());
  }
  if (in.is_string()) {
    const std::string t(unicode::Strip(in.AsString(), unicode::StripSide::kBoth));
    const int base = b.Has(1) ? static_cast<int>(b.Get(1).AsInt()) : 10;
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(t.c_str(), &end, base);
    if (!t.empty() && end == t.c_str() + t.size() && errno != ERANGE) return Value::Int(v);
    double d;
    if (ParseFloat(t, &d) && std::isfinite(d)) return to_int(d);
  }
  return fallback;
}

absl::StatusOr<Value> FilterFloat(const Value& in, const ValueList& args, const Kwargs& kwargs) {
  BIND("float", "default");
  if (in.is_undefined()) return absl::InvalidArgumentError(in.UndefinedHint());
  if (in.is_number()) return Value::Float(in.AsDouble());
  double d;
  if (in.is_string() && ParseFloat(in.AsString(), &d)) return Value::Float(d);
  return b.Has(0) ? b.Get(0) : Value::Float(0.0);
}

absl::StatusOr<Value> FilterRound(const Value& in, const ValueList& args, const Kwargs& kwargs) {
  BIND("round", "precision", "method");
  if (!in.is_number()) return TypeErrorStatus("round() needs a number");
  const int64_t precision = b.Has(0) ? b.Get(0).AsInt() : 0;
  const std::string method = b.Has(1) ? b.Get(1).Str() : "common";
  const double scale = std::pow(10.0, static_cast<double>(precision));
  const double x = in.AsDouble() * scale;
  double r;
  if (method == "common") {
    if (!in.is_float()) return Value::Int(in.AsInt());  // Python's round(int, n) is the int
    std::fesetround(FE_TONEAREST);
    r = std::nearbyint(x);  // Python's round(): half to even
  } else if (method == "floor") {
    r = std::floor(x);
  } else if (method == "ceil") {
    r = std::ceil(x);
  } else {
    return absl::InvalidArgumentError("FilterArgumentError: method must be common, ceil or floor");
  }
  return Value::Float(r / scale);
}

absl::StatusOr<Value> FilterToJson(const Value& in, const ValueList& args, const Kwargs& kwargs) {
  BIND("tojson", "ensure_ascii", "indent", "separators", "sort_keys");
  JsonOptions options;
  options.ensure_ascii = b.Get(0).Truthy();
  const Value& indent = b.Get(1);
  if (indent.is_int() && !indent.is_bool()) {
    const int64_t spaces = std::max<int64_t>(indent.AsInt(), 0);
    if (auto st = CheckStringBytes(spaces); !st.ok()) return st;  // indent=10**14 aborted
    options.indent = std::string(spaces, ' ');
  } else if (indent.is_string()) {
    options.indent = indent.AsString();
  } else if (!indent.is_undefined() && !indent.is_none()) {
    return TypeErrorStatus("tojson indent must be an int, a str or None");
  }
  if (options.indent) options.item_separator.assign(1, ',');
  const Value& sep = b.Get(2);
  if (sep.is_sequence() && sep.AsList().size() == 2 && sep.AsList()[0].is_string() &&
      sep.AsList()[1].is_string()) {
    options.item_separator = sep.AsList()[0].AsString();
    options.key_separator = sep.AsList()[1].AsString();
  } else if (!sep.is_undefined() && !sep.is_none()) {
    return TypeErrorStatus("tojson separators must be a (item, key) pair of str");
  }
  options.sort_keys = b.Get(3).Truthy();
  auto json = ToJson(in, options);
  if (!json.ok()) return json.status();
  return Value::String(std::move(*json));
}

// Jinja's format filter: `fmt|format(args...)` is Python's `fmt % args`.
absl::StatusOr<Value> FilterFormat(const Value& in, const ValueList& args, const Kwargs& kwargs) {
  if (!kwargs.empty()) return absl::UnimplementedError("unsupported: format filter with keywords");
  auto format = TextOf(in);
  if (!format.ok()) return format.status();
  auto text = PercentFormat(*format, args);
  if (!text.ok()) return text.status();
  return Value::String(std::move(*text));
}

#undef BIND

struct FilterEntry {
  std::string_view name;
  FilterFn fn;
};

constexpr FilterEntry kFilters[] = {
    {"trim", FilterTrim},
    {"upper", FilterUpper},
    {"lower", FilterLower},
    {"capitalize", FilterCapitalize},
    {"title", FilterTitle},
    {"string", FilterString},
    {"safe", FilterSafe},
    {"length", FilterLength},
    {"count", FilterLength},
    {"default", FilterDefault},
    {"d", FilterDefault},
    {"replace", FilterReplace},
    {"indent", FilterIndent},
    {"center", FilterCenter},
    {"wordcount", FilterWordcount},
    {"escape", FilterEscape},
    {"e", FilterEscape},
    {"forceescape", FilterEscape},
    {"abs", FilterAbs},
    {"int", FilterInt},
    {"float", FilterFloat},
    {"round", FilterRound},
    {"tojson", FilterToJson},
    {"format", FilterFormat},
};

FilterFn FindFilter(std::string_view name) {
  for (const auto& f : kFilters) {
    if (f.name == name) return f.fn;
  }
  return internal::FindSequenceFilter(name);
}

}  // namespace

bool IsKnownFilter(std::string_view name) { return FindFilter(name) != nullptr; }

bool IsJinjaFilter(std::string_view name) {
  return std::find(std::begin(kJinjaFilters), std::end(kJinjaFilters), name) !=
         std::end(kJinjaFilters);
}

absl::StatusOr<Value> ApplyFilter(std::string_view name, const Value& input, const ValueList& args,
                                  const Kwargs& kwargs) {
  const FilterFn fn = FindFilter(name);
  if (fn == nullptr) return absl::UnimplementedError(Cat("unsupported filter '", name, "'"));
  return fn(input, args, kwargs);
}

}  // namespace ballast::chat
