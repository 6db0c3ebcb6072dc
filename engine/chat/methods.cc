// Attribute/item access and the str/dict/list methods templates call.
#include <algorithm>
#include <array>
#include <optional>

#include "absl/status/status.h"
#include "engine/chat/builtins.h"
#include "engine/chat/operators.h"
#include "engine/chat/unicode.h"

namespace ballast::chat {
namespace {

using unicode::StripSide;

// Every public method of Python's str / dict / list: an attribute with one of
// these names is a method, never a dict key (Jinja's getattr order).
constexpr std::string_view kStrMethods[] = {
    "capitalize",   "casefold",    "center",    "count",      "encode",       "endswith",
    "expandtabs",   "find",        "format",    "format_map", "index",        "isalnum",
    "isalpha",      "isascii",     "isdecimal", "isdigit",    "isidentifier", "islower",
    "isnumeric",    "isprintable", "isspace",   "istitle",    "isupper",      "join",
    "ljust",        "lower",       "lstrip",    "maketrans",  "partition",    "removeprefix",
    "removesuffix", "replace",     "rfind",     "rindex",     "rjust",        "rpartition",
    "rsplit",       "rstrip",      "split",     "splitlines", "startswith",   "strip",
    "swapcase",     "title",       "translate", "upper",      "zfill",
};
constexpr std::string_view kDictMethods[] = {"clear",      "copy",   "fromkeys", "get",
                                             "items",      "keys",   "pop",      "popitem",
                                             "setdefault", "update", "values"};
constexpr std::string_view kListMethods[] = {"append", "clear",   "copy",   "count",
                                             "extend", "index",   "insert", "pop",
                                             "remove", "reverse", "sort"};
// Methods that modify their object: refused by the immutable sandbox.
constexpr std::string_view kMutating[] = {"append", "clear",      "extend", "insert",
                                          "pop",    "popitem",    "remove", "reverse",
                                          "sort",   "setdefault", "update"};

template <size_t N>
bool In(const std::string_view (&names)[N], std::string_view name) {
  return std::find(std::begin(names), std::end(names), name) != std::end(names);
}

std::string ObjectRepr(const Value& obj) {
  if (obj.is_none()) return "None";
  return obj.TypeName() + " object";
}

Value MissingAttr(const Value& obj, std::string_view name) {
  return Value::Undefined(Cat("'", ObjectRepr(obj), "' has no attribute '", name, "'"));
}

absl::StatusOr<std::string> StrArg(const ArgBinder& b, size_t i, std::string_view method) {
  if (!b.Get(i).is_string()) {
    return TypeErrorStatus(Cat(method, "() argument must be str, not ", b.Get(i).TypeName()));
  }
  return b.Get(i).AsString();
}

// str.split()/rsplit() without a separator: runs of whitespace, no empty parts.
std::vector<std::string> SplitWhitespace(const std::string& s, int64_t maxsplit, bool from_right) {
  std::vector<std::pair<size_t, size_t>> words;
  for (size_t i = 0; i < s.size();) {
    char32_t cp;
    int n = unicode::DecodeAt(s, i, &cp);
    if (unicode::IsSpace(cp)) {
      i += n;
      continue;
    }
    const size_t start = i;
    while (i < s.size() && (n = unicode::DecodeAt(s, i, &cp), !unicode::IsSpace(cp))) i += n;
    words.emplace_back(start, i);
  }
  auto word = [&](size_t k) { return s.substr(words[k].first, words[k].second - words[k].first); };
  std::vector<std::string> parts;
  if (maxsplit < 0 || static_cast<size_t>(maxsplit) + 1 >= words.size()) {
    for (size_t k = 0; k < words.size(); ++k) parts.push_back(word(k));
  } else if (!from_right) {  // the rest keeps its inner whitespace, loses the trailing
    for (int64_t k = 0; k < maxsplit; ++k) parts.push_back(word(k));
    parts.emplace_back(
        unicode::Strip(std::string_view(s).substr(words[maxsplit].first), StripSide::kRight));
  } else {
    const size_t keep = words.size() - maxsplit;
    parts.emplace_back(
        unicode::Strip(std::string_view(s).substr(0, words[keep - 1].second), StripSide::kLeft));
    for (size_t k = keep; k < words.size(); ++k) parts.push_back(word(k));
  }
  return parts;
}

// str.split(sep)/rsplit(sep).
std::vector<std::string> SplitOn(const std::string& s, const std::string& sep, int64_t maxsplit,
                                 bool from_right) {
  std::vector<std::string> parts;
  if (!from_right) {
    size_t start = 0, hit;
    while ((maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) &&
           (hit = unicode::Find(s, sep, start)) != std::string::npos) {
      parts.push_back(s.substr(start, hit - start));
      start = hit + sep.size();
    }
    parts.push_back(s.substr(start));
    return parts;
  }
  size_t end = s.size();
  std::vector<std::string> rev;
  // rfind(sep, end - sep.size()) as a forward search of the reversed text.
  const std::string r_s = unicode::Reversed(s), r_sep = unicode::Reversed(sep);
  while ((maxsplit < 0 || static_cast<int64_t>(rev.size()) < maxsplit) && end >= sep.size()) {
    const size_t r_hit = unicode::Find(r_s, r_sep, s.size() - end);
    if (r_hit == std::string::npos) break;
    const size_t hit = s.size() - r_hit - sep.size();
    rev.push_back(s.substr(hit + sep.size(), end - hit - sep.size()));
    end = hit;
  }
  parts.push_back(s.substr(0, end));
  parts.insert(parts.end(), rev.rbegin(), rev.rend());
  return parts;
}

absl::StatusOr<Value> StrSplit(const std::string& s, const ArgBinder& b, bool from_right) {
  const int64_t maxsplit = b.Has(1) ? b.Get(1).AsInt() : -1;
  std::vector<std::string> parts;
  if (!b.Has(0) || b.Get(0).is_none()) {
    parts = SplitWhitespace(s, maxsplit, from_right);
  } else {
    auto sep = StrArg(b, 0, "split");
    if (!sep.ok()) return sep.status();
    if (sep->empty()) return absl::InvalidArgumentError("ValueError: empty separator");
    uint64_t n = 1;  // the parts, counted before any is made
    for (size_t at = unicode::Find(s, *sep);
         at != std::string::npos && (maxsplit < 0 || n <= static_cast<uint64_t>(maxsplit));
         at = unicode::Find(s, *sep, at + sep->size())) {
      if (auto st = CheckListItems(++n); !st.ok()) return st;
    }
    parts = SplitOn(s, *sep, maxsplit, from_right);
  }
  if (auto st = CheckListItems(parts.size()); !st.ok()) return st;
  ValueList out;
  for (auto& p : parts) out.push_back(Value::String(std::move(p)));
  return Value::List(std::move(out));
}

absl::StatusOr<Value> StrAffix(const std::string& s, const ArgBinder& b, bool prefix) {
  std::vector<std::string> affixes;
  if (b.Get(0).kind() == Value::Kind::kTuple) {
    for (const Value& v : b.Get(0).AsList()) {
      if (!v.is_string()) return TypeErrorStatus("tuple for startswith must only contain str");
      affixes.push_back(v.AsString());
    }
  } else {
    auto a = StrArg(b, 0, prefix ? "startswith" : "endswith");
    if (!a.ok()) return a.status();
    affixes.push_back(*a);
  }
  if (b.Has(1) || b.Has(2)) {
    return absl::UnimplementedError("unsupported: start/end arguments of startswith/endswith");
  }
  for (const auto& a : affixes) {
    const bool hit = prefix ? std::string_view(s).starts_with(a) : std::string_view(s).ends_with(a);
    if (hit) return Value::Bool(true);
  }
  return Value::Bool(false);
}

absl::StatusOr<Value> StrStrip(const std::string& s, const ArgBinder& b, StripSide side) {
  if (!b.Has(0) || b.Get(0).is_none()) return Value::String(std::string(unicode::Strip(s, side)));
  auto chars = StrArg(b, 0, "strip");
  if (!chars.ok()) return chars.status();
  const std::string_view cv = *chars;
  return Value::String(std::string(unicode::Strip(s, side, &cv)));
}

absl::StatusOr<Value> StrReplace(const std::string& s, const ArgBinder& b) {
  auto from = StrArg(b, 0, "replace");
  if (!from.ok()) return from.status();
  auto to = StrArg(b, 1, "replace");
  if (!to.ok()) return to.status();
  int64_t count = b.Has(2) ? b.Get(2).AsInt() : -1;
  std::string out;
  if (from->empty()) {  // Python inserts `to` between every character
    const auto offsets = unicode::Offsets(s);
    for (size_t i = 0; i + 1 < offsets.size() + 1; ++i) {
      if (count < 0 || static_cast<int64_t>(i) < count) out += *to;
      if (i + 1 < offsets.size()) out.append(s, offsets[i], offsets[i + 1] - offsets[i]);
      if (auto st = CheckStringBytes(out.size()); !st.ok()) return st;
    }
    return Value::String(std::move(out));
  }
  size_t start = 0, hit;
  while (count != 0 && (hit = unicode::Find(s, *from, start)) != std::string::npos) {
    out.append(s, start, hit - start);
    out += *to;
    if (auto st = CheckStringBytes(out.size()); !st.ok()) return st;
    start = hit + from->size();
    if (count > 0) --count;
  }
  out.append(s, start);
  return Value::String(std::move(out));
}

absl::StatusOr<Value> StrFind(const std::string& s, const ArgBinder& b, std::string_view method) {
  auto sub = StrArg(b, 0, method);
  if (!sub.ok()) return sub.status();
  if (method == "count") {
    if (sub->empty()) return Value::Int(static_cast<int64_t>(unicode::Length(s)) + 1);
    int64_t n = 0;
    for (size_t p = unicode::Find(s, *sub); p != std::string::npos;
         p = unicode::Find(s, *sub, p + sub->size())) {
      ++n;
    }
    return Value::Int(n);
  }
  const size_t p = method == "find" || method == "index" ? unicode::Find(s, *sub)
                                                         : unicode::ReverseFind(s, *sub);
  if (p == std::string::npos) {
    if (method == "index" || method == "rindex") {
      return absl::InvalidArgumentError("ValueError: substring not found");
    }
    return Value::Int(-1);
  }
  return Value::Int(static_cast<int64_t>(unicode::Length(std::string_view(s).substr(0, p))));
}

template <typename Pred>
Value AllChars(const std::string& s, Pred pred) {
  if (s.empty()) return Value::Bool(false);
  for (size_t i = 0; i < s.size();) {
    char32_t cp;
    i += unicode::DecodeAt(s, i, &cp);
    if (!pred(cp)) return Value::Bool(false);
  }
  return Value::Bool(true);
}

// str.isupper / str.islower: some cased character, and all of one case.
Value StrIsCase(const std::string& s, bool upper) {
  bool cased = false, ok = true;
  for (size_t i = 0; i < s.size();) {
    char32_t cp;
    i += unicode::DecodeAt(s, i, &cp);
    if (unicode::IsUpper(cp)) cased = true, ok = ok && upper;
    if (unicode::IsLower(cp)) cased = true, ok = ok && !upper;
  }
  return Value::Bool(cased && ok);
}

// The str methods that take no argument (case, character classes,
// splitlines); nullopt if `m` is none of them.
std::optional<Value> StrNoArgMethod(const std::string& s, std::string_view m) {
  if (m == "upper") return Value::String(unicode::Upper(s));
  if (m == "lower") return Value::String(unicode::Lower(s));
  if (m == "title") return Value::String(unicode::Title(s));
  if (m == "capitalize") return Value::String(unicode::Capitalize(s));
  if (m == "isspace") return AllChars(s, unicode::IsSpace);
  if (m == "isalpha") return AllChars(s, unicode::IsAlpha);
  if (m == "isdigit" || m == "isdecimal" || m == "isnumeric") return AllChars(s, unicode::IsDigit);
  if (m == "isalnum") {
    return AllChars(s, [](char32_t c) { return unicode::IsAlpha(c) || unicode::IsDigit(c); });
  }
  if (m == "isupper" || m == "islower") return StrIsCase(s, m == "isupper");
  if (m == "splitlines") {
    ValueList out;
    for (auto& line : unicode::SplitLines(s)) out.push_back(Value::String(std::move(line)));
    return Value::List(std::move(out));
  }
  return std::nullopt;
}

// str.removeprefix / str.removesuffix (`method`).
absl::StatusOr<Value> StrRemoveAffix(const std::string& s, const ArgBinder& b,
                                     std::string_view method) {
  auto a = StrArg(b, 0, method);
  if (!a.ok()) return a.status();
  std::string_view v = s;
  if (method == "removeprefix" && v.starts_with(*a)) v.remove_prefix(a->size());
  if (method == "removesuffix" && v.ends_with(*a)) v.remove_suffix(a->size());
  return Value::String(std::string(v));
}

// str.join: the iterable's strings with `s` between them.
absl::StatusOr<Value> StrJoin(const std::string& s, const ArgBinder& b) {
  auto items = Iterate(b.Get(0));
  if (!items.ok()) return items.status();
  std::string out;
  for (size_t i = 0; i < items->size(); ++i) {
    if (!(*items)[i].is_string()) {
      return TypeErrorStatus(
          Cat("sequence item ", i, ": expected str instance, ", (*items)[i].TypeName(), " found"));
    }
    if (i > 0) out += s;
    out += (*items)[i].AsString();
    if (auto st = CheckStringBytes(out.size()); !st.ok()) return st;
  }
  return Value::String(std::move(out));
}

absl::StatusOr<Value> CallStrMethod(const std::string& s, std::string_view m, const ValueList& args,
                                    const Kwargs& kwargs) {
  auto bind = [&](std::initializer_list<std::string_view> params) {
    return ArgBinder(m, args, kwargs, params);
  };
  if (std::optional<Value> v = StrNoArgMethod(s, m)) return *std::move(v);
  if (m == "split" || m == "rsplit") {
    ArgBinder b = bind({"sep", "maxsplit"});
    if (!b.status().ok()) return b.status();
    return StrSplit(s, b, m == "rsplit");
  }
  if (m == "startswith" || m == "endswith") {
    ArgBinder b = bind({"prefix", "start", "end"});
    if (!b.status().ok()) return b.status();
    return StrAffix(s, b, m == "startswith");
  }
  if (m == "strip" || m == "lstrip" || m == "rstrip") {
    ArgBinder b = bind({"chars"});
    if (!b.status().ok()) return b.status();
    return StrStrip(
        s, b,
        m == "strip" ? StripSide::kBoth : (m == "lstrip" ? StripSide::kLeft : StripSide::kRight));
  }
  if (m == "replace") {
    ArgBinder b = bind({"old", "new", "count"});
    if (!b.status().ok()) return b.status();
    return StrReplace(s, b);
  }
  if (m == "find" || m == "rfind" || m == "index" || m == "rindex" || m == "count") {
    ArgBinder b = bind({"sub"});
    if (!b.status().ok()) return b.status();
    return StrFind(s, b, m);
  }
  if (m == "removeprefix" || m == "removesuffix") {
    ArgBinder b = bind({"affix"});
    if (!b.status().ok()) return b.status();
    return StrRemoveAffix(s, b, m);
  }
  if (m == "join") {
    ArgBinder b = bind({"iterable"});
    if (!b.status().ok()) return b.status();
    return StrJoin(s, b);
  }
  return absl::UnimplementedError(Cat("unsupported str method '", m, "'"));
}

absl::StatusOr<Value> CallDictMethod(const Value& obj, std::string_view m, const ValueList& args,
                                     const Kwargs& kwargs) {
  const ValueDict& d = obj.AsDict();
  if (m == "get") {
    ArgBinder b(m, args, kwargs, {"key", "default"});
    if (!b.status().ok()) return b.status();
    const Value* v = d.Find(b.Get(0));
    if (v != nullptr) return *v;
    return b.Has(1) ? b.Get(1) : Value::None();
  }
  if (!args.empty() || !kwargs.empty()) {
    return TypeErrorStatus(Cat(m, "() takes no arguments"));
  }
  ValueList out;
  for (const auto& [k, v] : d.items) {
    if (m == "keys") out.push_back(k);
    if (m == "values") out.push_back(v);
    if (m == "items") out.push_back(Value::Tuple({k, v}));
  }
  if (m == "keys" || m == "values" || m == "items") return Value::List(std::move(out));
  return absl::UnimplementedError(Cat("unsupported dict method '", m, "'"));
}

absl::StatusOr<Value> CallListMethod(const Value& obj, std::string_view m, const ValueList& args,
                                     const Kwargs& kwargs) {
  ArgBinder b(m, args, kwargs, {"value"});
  if (!b.status().ok()) return b.status();
  const ValueList& items = obj.AsList();
  if (m == "count") {
    return Value::Int(std::count_if(items.begin(), items.end(),
                                    [&](const Value& v) { return Equals(v, b.Get(0)); }));
  }
  if (m == "index") {
    for (size_t i = 0; i < items.size(); ++i) {
      if (Equals(items[i], b.Get(0))) return Value::Int(static_cast<int64_t>(i));
    }
    return absl::InvalidArgumentError(Cat("ValueError: ", b.Get(0).ShortRepr(), " is not in list"));
  }
  return absl::UnimplementedError(Cat("unsupported list method '", m, "'"));
}

Value BoundMethod(const Value& obj, std::string_view name) {
  std::string method(name);
  return Value::MakeCallable(
      Cat(obj.TypeName(), ".", name),
      [obj, method](const ValueList& args, const Kwargs& kwargs) -> absl::StatusOr<Value> {
        if (obj.is_string()) return CallStrMethod(obj.AsString(), method, args, kwargs);
        if (obj.is_dict()) return CallDictMethod(obj, method, args, kwargs);
        return CallListMethod(obj, method, args, kwargs);
      });
}

// The method `name` of obj, or nullopt when obj's type has none by that name.
std::optional<Value> Method(const Value& obj, std::string_view name) {
  const bool is_method = (obj.is_string() && In(kStrMethods, name)) ||
                         (obj.is_dict() && In(kDictMethods, name)) ||
                         (obj.is_sequence() && In(kListMethods, name));
  if (!is_method) return std::nullopt;
  if (In(kMutating, name) && !obj.is_string()) {
    return Value::Undefined(Cat("SecurityError: access to attribute '", name, "' of '",
                                obj.TypeName(), "' object is unsafe."));
  }
  return BoundMethod(obj, name);
}

}  // namespace

absl::Status TypeErrorStatus(std::string_view message) {
  return absl::InvalidArgumentError(Cat("TypeError: ", message));
}

absl::Status CheckStringBytes(uint64_t bytes) {
  if (bytes <= kMaxStringBytes) return absl::OkStatus();
  return absl::OutOfRangeError(
      Cat("OverflowError: a string of ", bytes, " bytes is over the limit of 16 MiB"));
}

absl::Status CheckListItems(uint64_t items) {
  if (items <= kMaxListItems) return absl::OkStatus();
  return absl::OutOfRangeError(
      Cat("OverflowError: a list of ", items, " items is over the limit of 1,048,576"));
}

absl::StatusOr<std::string> TextOf(const Value& v, bool repr) {
  std::string s = repr ? v.Repr() : v.Str();
  if (s.size() <= kMaxStringBytes) return s;
  return absl::OutOfRangeError(
      Cat("OverflowError: the text of a ", v.TypeName(), " is over the limit of 16 MiB"));
}

ArgBinder::ArgBinder(std::string_view function, const ValueList& args, const Kwargs& kwargs,
                     std::initializer_list<std::string_view> params)
    : values_(params.size()) {
  if (args.size() > params.size()) {
    status_ = TypeErrorStatus(
        Cat(function, "() takes at most ", params.size(), " arguments (", args.size(), " given)"));
    return;
  }
  for (size_t i = 0; i < args.size(); ++i) values_[i] = args[i];
  for (const auto& [key, value] : kwargs) {
    const auto it = std::find(params.begin(), params.end(), key);
    if (it == params.end()) {
      status_ = TypeErrorStatus(Cat(function, "() got an unexpected keyword argument '", key, "'"));
      return;
    }
    values_[it - params.begin()] = value;
  }
}

absl::StatusOr<Value> GetAttr(const Value& obj, std::string_view name) {
  if (obj.is_undefined()) return absl::InvalidArgumentError(obj.UndefinedHint());
  if (auto m = Method(obj, name)) return *m;
  if (obj.is_dict()) {
    if (const Value* v = obj.AsDict().Find(name)) return *v;
  } else if (obj.is_object()) {
    if (const Value* v = obj.AsObject().attrs.Find(name)) return *v;
  }
  return MissingAttr(obj, name);
}

absl::StatusOr<Value> GetItem(const Value& obj, const Value& key) {
  if (obj.is_undefined()) return absl::InvalidArgumentError(obj.UndefinedHint());
  if (obj.is_dict()) {
    if (const Value* v = obj.AsDict().Find(key)) return *v;
  } else if ((obj.is_sequence() || obj.is_string()) && (key.is_int() || key.is_bool())) {
    if (auto v = IndexSequence(obj, key.AsInt())) return *v;
    return Value::Undefined(Cat(ObjectRepr(obj), " has no element ", key.ShortRepr()));
  } else if (obj.is_object() && key.is_string()) {
    if (const Value* v = obj.AsObject().attrs.Find(key.AsString())) return *v;
  }
  if (key.is_string()) {
    if (auto m = Method(obj, key.AsString())) return *m;
    return MissingAttr(obj, key.AsString());
  }
  return Value::Undefined(Cat(ObjectRepr(obj), " has no element ", key.ShortRepr()));
}

}  // namespace ballast::chat
