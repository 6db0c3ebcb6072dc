#include "engine/chat/operators.h"

#include <cmath>
#include <optional>

#include "absl/status/status.h"
#include "engine/chat/builtins.h"
#include "engine/chat/unicode.h"

namespace ballast::chat {
namespace {

absl::Status TypeError(std::string message) {
  return absl::InvalidArgumentError("TypeError: " + message);
}

absl::Status Unsupported(std::string_view op, const Value& a, const Value& b) {
  return TypeError(Cat("unsupported operand type(s) for ", std::string(op), ": '", a.TypeName(),
                       "' and '", b.TypeName(), "'"));
}

absl::Status Overflow() { return absl::OutOfRangeError("OverflowError: integer overflow"); }

absl::StatusOr<Value> Repeat(const Value& seq, int64_t n) {
  const bool empty = seq.is_string() ? seq.AsString().empty() : seq.AsList().empty();
  if (n <= 0 || empty) {  // '' * 3000000000 is '' at once
    if (seq.is_string()) return Value::String("");
    return seq.kind() == Value::Kind::kTuple ? Value::Tuple({}) : Value::List({});
  }
  // size x n, checked without overflowing (n may be near 2^63).
  const auto over = [n](uint64_t size, uint64_t cap) {
    return size > 0 && static_cast<uint64_t>(n) > cap / size;
  };
  if (seq.is_string()) {
    if (over(seq.AsString().size(), kMaxStringBytes)) {
      return CheckStringBytes(kMaxStringBytes + 1);
    }
    std::string out;
    out.reserve(seq.AsString().size() * n);
    for (int64_t i = 0; i < n; ++i) out += seq.AsString();
    return Value::String(std::move(out));
  }
  if (over(seq.AsList().size(), kMaxListItems)) return CheckListItems(kMaxListItems + 1);
  ValueList out;
  out.reserve(seq.AsList().size() * n);
  for (int64_t i = 0; i < n; ++i) out.insert(out.end(), seq.AsList().begin(), seq.AsList().end());
  return seq.kind() == Value::Kind::kTuple ? Value::Tuple(std::move(out))
                                           : Value::List(std::move(out));
}

absl::StatusOr<Value> FloatOp(std::string_view op, double x, double y);

absl::StatusOr<Value> IntOp(std::string_view op, int64_t x, int64_t y) {
  int64_t r = 0;
  if (op == "+") {
    if (__builtin_add_overflow(x, y, &r)) return Overflow();
  } else if (op == "-") {
    if (__builtin_sub_overflow(x, y, &r)) return Overflow();
  } else if (op == "*") {
    if (__builtin_mul_overflow(x, y, &r)) return Overflow();
  } else if (op == "/") {
    if (y == 0) return absl::InvalidArgumentError("ZeroDivisionError: division by zero");
    return Value::Float(static_cast<double>(x) / static_cast<double>(y));
  } else if (op == "//" || op == "%") {
    if (y == 0) {
      return absl::InvalidArgumentError(
          op == "//" ? "ZeroDivisionError: integer division or modulo by zero"
                     : "ZeroDivisionError: integer modulo by zero");
    }
    int64_t q = x / y, m = x % y;
    if (m != 0 && ((m < 0) != (y < 0))) --q, m += y;  // Python floors
    r = op == "//" ? q : m;
  } else if (op == "**") {
    if (y < 0) return FloatOp(op, static_cast<double>(x), static_cast<double>(y));
    r = 1;  // square and multiply: 1 ** 3000000000 is 32 squarings, not 3e9 products
    int64_t base = x;
    for (int64_t e = y; e > 0; e >>= 1) {
      if ((e & 1) != 0 && __builtin_mul_overflow(r, base, &r)) return Overflow();
      if (e > 1 && __builtin_mul_overflow(base, base, &base)) {
        // base overflows: the result does too unless it is 0 or ±1 already
        // (a base of 0 or ±1 never overflows, so x is beyond them here).
        return Overflow();
      }
    }
  }
  return Value::Int(r);
}

absl::StatusOr<Value> FloatOp(std::string_view op, double x, double y) {
  if (op == "+") return Value::Float(x + y);
  if (op == "-") return Value::Float(x - y);
  if (op == "*") return Value::Float(x * y);
  if (op == "**") {
    if (x == 0 && y < 0) {
      return absl::InvalidArgumentError(
          "ZeroDivisionError: 0.0 cannot be raised to a negative power");
    }
    return Value::Float(std::pow(x, y));
  }
  if (y == 0) return absl::InvalidArgumentError("ZeroDivisionError: float division by zero");
  if (op == "/") return Value::Float(x / y);
  // CPython's float_divmod.
  const double m = std::fmod(x, y);
  const bool adjust = m != 0 && ((m < 0) != (y < 0));
  if (op == "%") return Value::Float(adjust ? m + y : m);
  const double div = (x - m) / y - (adjust ? 1.0 : 0.0);
  double floordiv = std::floor(div);
  if (div - floordiv > 0.5) floordiv += 1.0;
  return Value::Float(div == 0 ? std::copysign(0.0, x / y) : floordiv);
}

// Normalizes a Python slice bound (None → default) against `len`.
int64_t SliceBound(const Value& v, int64_t len, int64_t step, bool is_start) {
  if (v.is_undefined() || v.is_none()) {
    if (step > 0) return is_start ? 0 : len;
    return is_start ? len - 1 : -1;
  }
  int64_t i = v.AsInt();
  if (i < 0) i += len;
  if (step > 0) return std::clamp<int64_t>(i, 0, len);
  return std::clamp<int64_t>(i, -1, len - 1);
}

}  // namespace

absl::StatusOr<Value> BinaryOp(std::string_view op, const Value& a, const Value& b) {
  if (a.is_undefined()) return absl::InvalidArgumentError(a.UndefinedHint());
  if (b.is_undefined()) return absl::InvalidArgumentError(b.UndefinedHint());
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return FloatOp(op, a.AsDouble(), b.AsDouble());
    return IntOp(op, a.AsInt(), b.AsInt());
  }
  if (op == "+") {
    if (a.is_string() && b.is_string()) {
      if (auto st = CheckStringBytes(a.AsString().size() + b.AsString().size()); !st.ok()) {
        return st;
      }
      return Value::String(a.AsString() + b.AsString());
    }
    if (a.is_sequence() && a.kind() == b.kind()) {
      if (auto st = CheckListItems(a.AsList().size() + b.AsList().size()); !st.ok()) return st;
      ValueList out = a.AsList();
      out.insert(out.end(), b.AsList().begin(), b.AsList().end());
      return a.kind() == Value::Kind::kTuple ? Value::Tuple(std::move(out))
                                             : Value::List(std::move(out));
    }
    if (a.is_string()) {
      return TypeError(Cat("can only concatenate str (not \"", b.TypeName(), "\") to str"));
    }
    if (a.kind() == Value::Kind::kList) {
      return TypeError(Cat("can only concatenate list (not \"", b.TypeName(), "\") to list"));
    }
  }
  if (op == "*") {
    if ((a.is_string() || a.is_sequence()) && (b.is_int() || b.is_bool())) {
      return Repeat(a, b.AsInt());
    }
    if ((b.is_string() || b.is_sequence()) && (a.is_int() || a.is_bool())) {
      return Repeat(b, a.AsInt());
    }
  }
  if (op == "%" && a.is_string()) {
    // Python: a single non-tuple argument with __getitem__ (list, dict) may go unused.
    const bool lenient = b.kind() == Value::Kind::kList || b.is_dict();
    auto text = PercentFormat(a.AsString(),
                              b.kind() == Value::Kind::kTuple ? b.AsList() : ValueList{b}, lenient);
    if (!text.ok()) return text.status();
    return Value::String(std::move(*text));
  }
  return Unsupported(op, a, b);
}

namespace {

// One %-conversion of PercentFormat: `spec` is the flags/width/precision
// between '%' and `conv`.
constexpr uint64_t kMaxNumberWidth = 4096;

absl::StatusOr<std::string> FormatOne(std::string_view spec, char conv, const Value& v) {
  char buf[2 * kMaxNumberWidth + 512];  // a float's 309 integer digits, sign, precision, width
  if (conv == 's' || conv == 'r') {
    size_t k = 0;
    bool left = false;
    for (; k < spec.size() && std::string_view("-+ #0").find(spec[k]) != std::string_view::npos;
         ++k) {
      left = left || spec[k] == '-';
    }
    uint64_t width = 0;
    for (; k < spec.size() && spec[k] >= '0' && spec[k] <= '9'; ++k) {
      width = width * 10 + (spec[k] - '0');
      if (auto st = CheckStringBytes(width); !st.ok()) return st;  // before it can wrap
    }
    std::optional<uint64_t> keep;  // the precision: code points kept
    if (k < spec.size() && spec[k] == '.') {
      uint64_t p = 0;
      for (++k; k < spec.size() && spec[k] >= '0' && spec[k] <= '9'; ++k) {
        p = std::min<uint64_t>(p * 10 + (spec[k] - '0'), kMaxStringBytes + 1);
      }
      keep = p;
    }
    std::string s;
    if (keep && (conv == 'r' || !v.is_string()) && !v.is_undefined()) {
      // Only `keep` code points are printed: a repr is made that far (4 bytes
      // a code point at most), not in full ('%.1s' % (x,) on a value that
      // shares its parts made 2^20 values each time).
      s = v.ReprPrefix(4 * *keep + 4);
    } else {
      auto text = TextOf(v, /*repr=*/conv == 'r');
      if (!text.ok()) return text.status();
      s = std::move(*text);
    }
    if (keep) {
      size_t at = 0;  // the byte offset of code point `keep` (scanning no further)
      for (uint64_t i = 0; i < *keep && at < s.size(); ++i) {
        char32_t cp;
        at += unicode::DecodeAt(s, at, &cp);
      }
      s.resize(std::min(at, s.size()));
    }
    const size_t len = unicode::Length(s);
    if (len >= width) return s;
    const std::string pad(width - len, ' ');
    return left ? s + pad : pad + s;
  }
  if (!v.is_number()) {
    return TypeError(
        Cat("%", std::string(1, conv), " format: a real number is required, not ", v.TypeName()));
  }
  // Width and precision: at most kMaxNumberWidth digits' worth, so that the
  // text fits `buf` and glibc never formats a billion digits.
  for (size_t k = 0; k < spec.size();) {
    uint64_t n = 0;
    for (; k < spec.size() && spec[k] >= '0' && spec[k] <= '9'; ++k) {
      n = n * 10 + (spec[k] - '0');
      if (n > kMaxNumberWidth) {
        return absl::OutOfRangeError(Cat("OverflowError: a %-format width or precision over ",
                                         kMaxNumberWidth, " for a number"));
      }
    }
    if (k < spec.size() && (spec[k] < '0' || spec[k] > '9')) ++k;
  }
  const std::string f = Cat("%", spec);
  if (conv == 'd' || conv == 'i' || conv == 'x' || conv == 'X' || conv == 'o') {
    const long long n = v.is_float() ? static_cast<long long>(std::trunc(v.AsDouble())) : v.AsInt();
    std::snprintf(buf, sizeof(buf), (f + "ll" + (conv == 'i' ? 'd' : conv)).c_str(), n);
  } else {
    std::snprintf(buf, sizeof(buf), (f + conv).c_str(), v.AsDouble());
  }
  return std::string(buf);
}

}  // namespace

absl::StatusOr<std::string> PercentFormat(std::string_view fmt, const ValueList& args,
                                          bool allow_unused) {
  std::string out;
  size_t next = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out.push_back(fmt[i]);
      continue;
    }
    size_t j = i + 1;
    while (j < fmt.size() &&
           std::string_view("-+ #0123456789.").find(fmt[j]) != std::string_view::npos) {
      ++j;
    }
    if (j >= fmt.size()) return absl::InvalidArgumentError("ValueError: incomplete format");
    const char conv = fmt[j];
    const std::string_view spec = fmt.substr(i + 1, j - i - 1);
    i = j;
    if (conv == '%') {
      out.push_back('%');
      continue;
    }
    if (std::string_view("srdixXofFeEgG").find(conv) == std::string_view::npos) {
      return absl::UnimplementedError(
          Cat("unsupported %-format conversion '%", std::string(spec), std::string(1, conv), "'"));
    }
    if (next >= args.size()) return TypeError("not enough arguments for format string");
    auto piece = FormatOne(spec, conv, args[next++]);
    if (!piece.ok()) return piece.status();
    out += *piece;
  }
  if (next < args.size() && !(allow_unused && next == 0)) {
    return TypeError("not all arguments converted during string formatting");
  }
  return out;
}

absl::StatusOr<Value> UnaryOp(std::string_view op, const Value& a) {
  if (a.is_undefined()) return absl::InvalidArgumentError(a.UndefinedHint());
  if (a.is_float()) return Value::Float(op == "-" ? -a.AsDouble() : a.AsDouble());
  if (a.is_int() || a.is_bool()) {
    if (op == "+") return Value::Int(a.AsInt());
    if (a.AsInt() == INT64_MIN) return Overflow();
    return Value::Int(-a.AsInt());
  }
  return TypeError(Cat("bad operand type for unary ", std::string(op), ": '", a.TypeName(), "'"));
}

absl::StatusOr<bool> Contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::kUndefined:
      return false;
    case Value::Kind::kString:
      if (!item.is_string()) {
        return TypeError(
            Cat("'in <string>' requires string as left operand, not ", item.TypeName()));
      }
      return unicode::Find(container.AsString(), item.AsString()) != std::string::npos;
    case Value::Kind::kList:
    case Value::Kind::kTuple:
      for (const Value& v : container.AsList()) {
        if (Equals(v, item)) return true;
      }
      return false;
    case Value::Kind::kDict:
      if (item.is_sequence() && item.kind() == Value::Kind::kList)
        return TypeError("unhashable type: 'list'");
      if (item.is_dict()) return TypeError("unhashable type: 'dict'");
      return container.AsDict().Find(item) != nullptr;
    default:
      return TypeError(Cat("argument of type '", container.TypeName(), "' is not iterable"));
  }
}

std::optional<Value> IndexSequence(const Value& container, int64_t index) {
  if (container.is_sequence()) {
    const auto& items = container.AsList();
    const int64_t n = static_cast<int64_t>(items.size());
    if (index < 0) index += n;
    if (index < 0 || index >= n) return std::nullopt;
    return items[index];
  }
  if (container.is_string()) {
    const std::string& s = container.AsString();
    if (unicode::IsAscii(s)) {
      const int64_t n = static_cast<int64_t>(s.size());
      if (index < 0) index += n;
      if (index < 0 || index >= n) return std::nullopt;
      return Value::String(s.substr(index, 1));
    }
    const auto offsets = unicode::Offsets(s);
    const int64_t n = static_cast<int64_t>(offsets.size()) - 1;
    if (index < 0) index += n;
    if (index < 0 || index >= n) return std::nullopt;
    return Value::String(s.substr(offsets[index], offsets[index + 1] - offsets[index]));
  }
  return std::nullopt;
}

absl::StatusOr<Value> Slice(const Value& container, const Value& start, const Value& stop,
                            const Value& step_value) {
  for (const Value* v : {&start, &stop, &step_value}) {
    if (!v->is_undefined() && !v->is_none() && !v->is_int() && !v->is_bool()) {
      return TypeError("slice indices must be integers or None");
    }
  }
  const int64_t step = (step_value.is_undefined() || step_value.is_none()) ? 1 : step_value.AsInt();
  if (step == 0) return absl::InvalidArgumentError("ValueError: slice step cannot be zero");
  if (container.is_sequence() || container.is_string()) {
    std::vector<size_t> offsets;
    int64_t len;
    if (container.is_string()) {
      offsets = unicode::Offsets(container.AsString());
      len = static_cast<int64_t>(offsets.size()) - 1;
    } else {
      len = static_cast<int64_t>(container.AsList().size());
    }
    const int64_t lo = SliceBound(start, len, step, true);
    const int64_t hi = SliceBound(stop, len, step, false);
    if (container.is_string()) {
      const std::string& s = container.AsString();
      std::string out;
      for (int64_t i = lo; step > 0 ? i < hi : i > hi; i += step) {
        out.append(s, offsets[i], offsets[i + 1] - offsets[i]);
      }
      return Value::String(std::move(out));
    }
    ValueList out;
    for (int64_t i = lo; step > 0 ? i < hi : i > hi; i += step)
      out.push_back(container.AsList()[i]);
    return container.kind() == Value::Kind::kTuple ? Value::Tuple(std::move(out))
                                                   : Value::List(std::move(out));
  }
  if (container.is_undefined()) return absl::InvalidArgumentError(container.UndefinedHint());
  // Slices bypass Jinja's getitem: a non-sequence is Python's TypeError.
  return TypeError(Cat("'", container.TypeName(), "' object is not subscriptable"));
}

absl::StatusOr<ValueList> Iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return ValueList{};
    case Value::Kind::kList:
    case Value::Kind::kTuple:
      return v.AsList();
    case Value::Kind::kDict: {
      ValueList keys;
      keys.reserve(v.AsDict().items.size());
      for (const auto& [k, unused] : v.AsDict().items) keys.push_back(k);
      return keys;
    }
    case Value::Kind::kString: {
      ValueList chars;
      const std::string& s = v.AsString();
      for (size_t i = 0; i < s.size();) {
        char32_t cp;
        const int n = unicode::DecodeAt(s, i, &cp);
        if (chars.size() == kMaxListItems) return CheckListItems(kMaxListItems + 1);
        chars.push_back(Value::String(s.substr(i, n)));
        i += n;
      }
      return chars;
    }
    default:
      return TypeError(Cat("'", v.TypeName(), "' object is not iterable"));
  }
}

absl::StatusOr<int64_t> Length(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return 0;
    case Value::Kind::kString:
      return static_cast<int64_t>(unicode::Length(v.AsString()));
    case Value::Kind::kList:
    case Value::Kind::kTuple:
      return static_cast<int64_t>(v.AsList().size());
    case Value::Kind::kDict:
      return static_cast<int64_t>(v.AsDict().items.size());
    default:
      return TypeError(Cat("object of type '", v.TypeName(), "' has no len()"));
  }
}

}  // namespace ballast::chat
