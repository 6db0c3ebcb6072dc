#include "engine/chat/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "engine/chat/unicode.h"

namespace ballast::chat {
namespace {

// Python's str.isprintable() for one code point, for the ranges that occur
// in text (controls, format characters, separators other than ' ').
bool Printable(char32_t cp) {
  if (cp < 0x20 || (cp >= 0x7F && cp <= 0xA0) || cp == 0xAD) return false;
  if (cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200F) || (cp >= 0x2028 && cp <= 0x202F))
    return false;
  if ((cp >= 0x205F && cp <= 0x206F) || cp == 0x3000 || cp == 0xFEFF) return false;
  if ((cp >= 0xFFF9 && cp <= 0xFFFB) || (cp >= 0xE000 && cp <= 0xF8FF)) return false;
  return true;
}

// Python's \xhh, \uhhhh or \Uhhhhhhhh escape of a code point, appended
// at once (one append, not a byte at a time: escaping 16 MiB of control
// bytes is the costliest thing a template can print).
void AppendEscape(char32_t cp, std::string* out) {
  static constexpr char kHex[] = "0123456789abcdef";
  const int digits = cp < 0x100 ? 2 : (cp < 0x10000 ? 4 : 8);
  char buf[10] = {'\\', digits == 2 ? 'x' : (digits == 4 ? 'u' : 'U')};
  for (int k = 0; k < digits; ++k) buf[2 + k] = kHex[(cp >> (4 * (digits - 1 - k))) & 0xF];
  out->append(buf, 2 + digits);
}

// Python's repr() of a str appended to `out`, stopping once `out` holds
// more than `limit` bytes (the caller then sees a cut, over-long text).
void AppendStringRepr(std::string_view s, size_t limit, std::string* out) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char quote = (has_single && !has_double) ? '"' : '\'';
  out->reserve(out->size() + std::min(s.size(), limit) + 2);
  out->push_back(quote);
  for (size_t i = 0; i < s.size() && out->size() <= limit;) {
    if (unicode::AppendPlainRun(s, quote, limit, &i, out)) continue;
    char32_t cp;
    const int n = unicode::DecodeAt(s, i, &cp);
    if (cp == static_cast<char32_t>(quote) || cp == '\\') {
      out->push_back('\\');
      out->push_back(static_cast<char>(cp));
    } else if (cp == '\n') {
      out->append("\\n");
    } else if (cp == '\r') {
      out->append("\\r");
    } else if (cp == '\t') {
      out->append("\\t");
    } else if ((n == 1 && cp >= 0x80) || !Printable(cp)) {
      AppendEscape(cp, out);  // n == 1 && cp >= 0x80: an invalid byte (Python: a surrogate escape)
    } else {
      out->append(s.substr(i, n));
    }
    i += n;
  }
  out->push_back(quote);
}

// Where a Repr is: the objects on the path from the outermost value, and
// how deep it is. Objects are the only mutable values, so every cycle
// (`set ns.self = ns`, or `set ns.l = [ns]`) passes through one: its second
// visit prints as "...", as Python prints a recursive container. Past
// kMaxReprDepth nested containers, "..." too: a deep value cannot overflow
// the stack. After kMaxReprValues values, "..." for the rest: a value that
// shares its parts (`set ns.x = [ns.x, ns.x]` in a loop) is exponentially
// large printed, and could otherwise hold the render for hours. Past
// kMaxStringBytes written, the text is cut (Value::Repr).
constexpr int kMaxReprDepth = 200;
constexpr int64_t kMaxReprValues = 1 << 20;
struct ReprGuard {
  std::vector<const Object*> objects;
  int depth = 0;
  int64_t values_left = kMaxReprValues;
  size_t max_bytes = kMaxStringBytes;
  // Whether the text is already longer than max_bytes.
  bool Full(const std::string& out) const { return out.size() > max_bytes; }
};

void AppendRepr(const Value& v, ReprGuard* g, std::string* out);

void AppendItems(const ValueList& items, ReprGuard* g, std::string* out) {
  for (size_t i = 0; i < items.size() && !g->Full(*out); ++i) {
    if (i > 0) out->append(", ");
    AppendRepr(items[i], g, out);
  }
}

void AppendDict(const ValueDict& dict, ReprGuard* g, std::string* out) {
  out->push_back('{');
  for (size_t i = 0; i < dict.items.size() && !g->Full(*out); ++i) {
    if (i > 0) out->append(", ");
    AppendRepr(dict.items[i].first, g, out);
    out->append(": ");
    AppendRepr(dict.items[i].second, g, out);
  }
  out->push_back('}');
}

void AppendObject(const Object& o, ReprGuard* g, std::string* out) {
  if (std::find(g->objects.begin(), g->objects.end(), &o) != g->objects.end()) {
    out->append(Cat("<", o.type_name, " {...}>"));  // Python: the recursive dict as {...}
    return;
  }
  g->objects.push_back(&o);
  out->append(Cat("<", o.type_name, " "));
  AppendDict(o.attrs, g, out);
  out->push_back('>');
  g->objects.pop_back();
}

// A container's repr, one level deeper.
void AppendContainer(const Value& v, ReprGuard* g, std::string* out) {
  if (g->depth >= kMaxReprDepth) {
    out->append("...");
    return;
  }
  ++g->depth;
  switch (v.kind()) {
    case Value::Kind::kList:
      out->push_back('[');
      AppendItems(v.AsList(), g, out);
      out->push_back(']');
      break;
    case Value::Kind::kTuple:
      out->push_back('(');
      AppendItems(v.AsList(), g, out);
      out->append(v.AsList().size() == 1 ? ",)" : ")");
      break;
    case Value::Kind::kDict:
      AppendDict(v.AsDict(), g, out);
      break;
    default:
      AppendObject(v.AsObject(), g, out);
  }
  --g->depth;
}

void AppendRepr(const Value& v, ReprGuard* g, std::string* out) {
  if (g->values_left <= 0) {
    out->append("...");
    return;
  }
  --g->values_left;
  switch (v.kind()) {
    case Value::Kind::kList:
    case Value::Kind::kTuple:
    case Value::Kind::kDict:
    case Value::Kind::kObject:
      AppendContainer(v, g, out);
      return;
    case Value::Kind::kUndefined:
      out->append("Undefined");
      return;
    case Value::Kind::kNone:
      out->append("None");
      return;
    case Value::Kind::kBool:
      out->append(v.AsBool() ? "True" : "False");
      return;
    case Value::Kind::kInt:
      out->append(std::to_string(v.AsInt()));
      return;
    case Value::Kind::kFloat:
      out->append(FloatRepr(v.AsDouble()));
      return;
    case Value::Kind::kString:
      AppendStringRepr(v.AsString(), g->max_bytes, out);
      return;
    case Value::Kind::kCallable:
      out->append(Cat("<function ", v.AsCallable().name, ">"));
      return;
  }
}

// One more than the deepest item.
int DepthOf(const ValueList& items) {
  int deepest = 0;
  for (const Value& v : items) deepest = std::max(deepest, v.depth());
  return deepest + 1;
}
int DepthOf(const ValueDict& dict) {
  int deepest = 0;
  for (const auto& [k, v] : dict.items) deepest = std::max({deepest, k.depth(), v.depth()});
  return deepest + 1;
}

int Sign(double d) { return d < 0 ? -1 : (d > 0 ? 1 : 0); }

}  // namespace

const Value* ValueDict::Find(const Value& key) const {
  if (key.is_string()) return Find(std::string_view(key.AsString()));
  for (const auto& [k, v] : items) {
    if (Equals(k, key)) return &v;
  }
  return nullptr;
}

const Value* ValueDict::Find(std::string_view key) const {
  for (const auto& [k, v] : items) {
    if (k.is_string() && k.AsString() == key) return &v;
  }
  return nullptr;
}

void ValueDict::Set(Value key, Value value) {
  for (auto& [k, v] : items) {
    if (Equals(k, key)) {
      v = std::move(value);
      return;
    }
  }
  items.emplace_back(std::move(key), std::move(value));
}

Value Value::Undefined(std::string hint) {
  return Value(Kind::kUndefined, std::make_shared<const std::string>(std::move(hint)));
}
Value Value::None() { return Value(Kind::kNone, std::monostate{}); }
Value Value::Bool(bool b) { return Value(Kind::kBool, b); }
Value Value::Int(int64_t i) { return Value(Kind::kInt, i); }
Value Value::Float(double d) { return Value(Kind::kFloat, d); }
Value Value::String(std::string s) {
  return Value(Kind::kString, std::make_shared<const std::string>(std::move(s)));
}
Value Value::List(ValueList items) {
  const int depth = DepthOf(items);
  return Value(Kind::kList, std::make_shared<const ValueList>(std::move(items)), depth);
}
Value Value::Tuple(ValueList items) {
  const int depth = DepthOf(items);
  return Value(Kind::kTuple, std::make_shared<const ValueList>(std::move(items)), depth);
}
Value Value::Dict(ValueDict dict) {
  const int depth = DepthOf(dict);
  return Value(Kind::kDict, std::make_shared<const ValueDict>(std::move(dict)), depth);
}
Value Value::MakeObject(std::shared_ptr<Object> object) {
  const int depth = DepthOf(object->attrs);
  return Value(Kind::kObject, std::move(object), depth);
}
Value Value::MakeCallable(std::string name, decltype(Callable::fn) fn, bool reads_args) {
  return Value(Kind::kCallable, std::make_shared<const Callable>(
                                    Callable{std::move(name), std::move(fn), reads_args}));
}

Value Value::FromJson(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return None();
    case nlohmann::ordered_json::value_t::boolean:
      return Bool(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Int(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const auto u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Float(static_cast<double>(u));
      return Int(static_cast<int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float:
      return Float(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return String(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      ValueList items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(FromJson(e));
      return List(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      ValueDict dict;
      dict.items.reserve(j.size());
      for (const auto& [k, v] : j.items()) dict.items.emplace_back(String(k), FromJson(v));
      return Dict(std::move(dict));
    }
    default:
      return None();  // binary / discarded: not produced by JSON parsing
  }
}

int64_t Value::AsInt() const {
  if (is_bool()) return static_cast<int64_t>(AsBool());
  if (is_int()) return std::get<int64_t>(data_);
  if (is_float()) {  // toward zero, saturating; NaN gives 0
    const double d = std::get<double>(data_);
    if (std::isnan(d)) return 0;
    if (d >= 9.2233720368547758e18) return std::numeric_limits<int64_t>::max();
    if (d <= -9.2233720368547758e18) return std::numeric_limits<int64_t>::min();
    return static_cast<int64_t>(d);
  }
  return 0;
}

double Value::AsDouble() const {
  if (is_float()) return std::get<double>(data_);
  return static_cast<double>(AsInt());
}

const std::string& Value::AsString() const {
  return *std::get<std::shared_ptr<const std::string>>(data_);
}
const ValueList& Value::AsList() const {
  return *std::get<std::shared_ptr<const ValueList>>(data_);
}
const ValueDict& Value::AsDict() const {
  return *std::get<std::shared_ptr<const ValueDict>>(data_);
}
Object& Value::AsObject() const { return *std::get<std::shared_ptr<Object>>(data_); }
const Callable& Value::AsCallable() const {
  return *std::get<std::shared_ptr<const Callable>>(data_);
}

const std::string& Value::UndefinedHint() const {
  static const std::string* const kEmpty = new std::string("value is undefined");
  if (auto* p = std::get_if<std::shared_ptr<const std::string>>(&data_)) return **p;
  return *kEmpty;
}

bool Value::Truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return AsBool();
    case Kind::kInt:
      return AsInt() != 0;
    case Kind::kFloat:
      return AsDouble() != 0.0;
    case Kind::kString:
      return !AsString().empty();
    case Kind::kList:
    case Kind::kTuple:
      return !AsList().empty();
    case Kind::kDict:
      return !AsDict().items.empty();
    case Kind::kObject:
    case Kind::kCallable:
      return true;
  }
  return false;
}

bool Value::Unshared() const {
  return std::visit(
      [](const auto& d) {
        if constexpr (std::is_same_v<std::decay_t<decltype(d)>, std::monostate> ||
                      std::is_arithmetic_v<std::decay_t<decltype(d)>>) {
          return false;
        } else {
          return d.use_count() == 1;
        }
      },
      data_);
}

std::string Value::Str() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "";
    case Kind::kString:
      return AsString();
    default:
      return Repr();
  }
}

std::string Value::Repr() const {
  ReprGuard guard;
  std::string out;
  AppendRepr(*this, &guard, &out);
  return out;
}

std::string Value::ReprPrefix(size_t max_bytes) const {
  ReprGuard guard;
  guard.max_bytes = max_bytes;
  std::string out;
  AppendRepr(*this, &guard, &out);
  return out;
}

std::string Value::ShortRepr(size_t max_bytes) const {
  std::string out = ReprPrefix(max_bytes);
  if (out.size() <= max_bytes) return out;
  out.resize(max_bytes);
  return out + "...";
}

std::string Value::TypeName() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kList:
      return "list";
    case Kind::kTuple:
      return "tuple";
    case Kind::kDict:
      return "dict";
    case Kind::kObject:
      return AsObject().type_name;
    case Kind::kCallable:
      return "function";
  }
  return "object";
}

namespace {

// Pairs of containers (list or dict storage) found equal during one
// comparison: a value that shares its parts compares each pair once, not
// once per path to it (two towers of 40 `[x, x]` doublings: 2^40 paths).
using EqualPairs = absl::flat_hash_set<std::pair<const void*, const void*>>;

bool EqualsIn(const Value& a, const Value& b, EqualPairs* seen) {
  using K = Value::Kind;
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.AsDouble() == b.AsDouble();
    return a.AsInt() == b.AsInt();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case K::kUndefined:
    case K::kNone:
      return true;
    case K::kString:  // one shared string is equal to itself without a scan
      return &a.AsString() == &b.AsString() || a.AsString() == b.AsString();
    case K::kList:
    case K::kTuple: {
      const auto &x = a.AsList(), &y = b.AsList();
      // One shared (immutable) list is equal to itself, as Python's
      // comparison finds by identity first.
      if (&x == &y || seen->contains({&x, &y})) return true;
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i) {
        if (!EqualsIn(x[i], y[i], seen)) return false;
      }
      seen->insert({&x, &y});
      return true;
    }
    case K::kDict: {
      const auto &x = a.AsDict(), &y = b.AsDict();
      if (&x == &y || seen->contains({&x, &y})) return true;
      if (x.items.size() != y.items.size()) return false;
      for (const auto& [k, v] : x.items) {
        const Value* other = y.Find(k);
        if (other == nullptr || !EqualsIn(v, *other, seen)) return false;
      }
      seen->insert({&x, &y});
      return true;
    }
    case K::kObject:
      return &a.AsObject() == &b.AsObject();
    case K::kCallable:
      return &a.AsCallable() == &b.AsCallable();
    default:
      return false;
  }
}

}  // namespace

bool Equals(const Value& a, const Value& b) {
  EqualPairs seen;
  return EqualsIn(a, b, &seen);
}

absl::StatusOr<int> Compare(const Value& a, const Value& b, std::string_view op) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return Sign(a.AsDouble() - b.AsDouble());
    return a.AsInt() < b.AsInt() ? -1 : (a.AsInt() > b.AsInt() ? 1 : 0);
  }
  if (a.is_string() && b.is_string()) {
    if (&a.AsString() == &b.AsString()) return 0;  // one shared string
    const int c = a.AsString().compare(b.AsString());
    return c < 0 ? -1 : (c > 0 ? 1 : 0);
  }
  if (a.is_sequence() && a.kind() == b.kind()) {
    const auto &x = a.AsList(), &y = b.AsList();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (Equals(x[i], y[i])) continue;
      return Compare(x[i], y[i], op);
    }
    return x.size() < y.size() ? -1 : (x.size() > y.size() ? 1 : 0);
  }
  if (a.is_undefined() || b.is_undefined()) {
    return absl::InvalidArgumentError(a.is_undefined() ? a.UndefinedHint() : b.UndefinedHint());
  }
  return absl::InvalidArgumentError(Cat("TypeError: '", std::string(op),
                                        "' not supported between instances of '", a.TypeName(),
                                        "' and '", b.TypeName(), "'"));
}

std::string FloatRepr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  // Shortest round-trip digits, then Python's layout: fixed notation when the
  // decimal exponent is in [-4, 16), else d.ddde[+-]XX.
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  const size_t e = sci.find('e');
  std::string mantissa = sci.substr(0, e);
  const int exp = std::stoi(sci.substr(e + 1));
  const bool negative = mantissa[0] == '-';
  if (negative) mantissa.erase(0, 1);
  std::string digits;
  for (char c : mantissa) {
    if (c != '.') digits.push_back(c);
  }
  std::string out = negative ? "-" : "";
  if (exp < -4 || exp >= 16) {
    out += digits.substr(0, 1);
    if (digits.size() > 1) {
      out += '.';
      out += digits.substr(1);
    }
    char ebuf[16];
    std::snprintf(ebuf, sizeof(ebuf), "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    return out + ebuf;
  }
  if (exp < 0) return out + "0." + std::string(-exp - 1, '0') + digits;
  const size_t int_len = static_cast<size_t>(exp) + 1;
  if (digits.size() <= int_len)
    return out + digits + std::string(int_len - digits.size(), '0') + ".0";
  return out + digits.substr(0, int_len) + "." + digits.substr(int_len);
}

std::string StringRepr(std::string_view s) {
  std::string out;
  AppendStringRepr(s, std::string::npos - 1, &out);
  return out;
}

}  // namespace ballast::chat
