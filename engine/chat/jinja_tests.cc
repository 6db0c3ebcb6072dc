// Jinja's tests (`x is defined`, `x is string`, ...), with the aliases that
// select/reject accept ("==", "eq", "equalto", ...).
#include <algorithm>

#include "absl/status/status.h"
#include "engine/chat/builtins.h"
#include "engine/chat/operators.h"
#include "engine/chat/unicode.h"

namespace ballast::chat {
namespace {

using TestFn = absl::StatusOr<bool> (*)(const Value& v, const ValueList& args);

absl::Status NeedArg(const ValueList& args, size_t n, std::string_view test) {
  if (args.size() == n) return absl::OkStatus();
  return TypeErrorStatus(
      Cat("test '", test, "' takes ", n, " argument(s), ", args.size(), " given"));
}

absl::StatusOr<bool> CompareTest(const Value& v, const ValueList& args, std::string_view op) {
  if (auto st = NeedArg(args, 1, op); !st.ok()) return st;
  if (op == "==") return Equals(v, args[0]);
  if (op == "!=") return !Equals(v, args[0]);
  auto c = Compare(v, args[0], op);
  if (!c.ok()) return c.status();
  if (op == "<") return *c < 0;
  if (op == "<=") return *c <= 0;
  if (op == ">") return *c > 0;
  return *c >= 0;
}

// Python's str.islower()/isupper(): some cased character, all in that case.
absl::StatusOr<bool> CaseTest(const Value& v, bool (*is_case)(char32_t)) {
  auto text = TextOf(v);
  if (!text.ok()) return text.status();
  const std::string& s = *text;
  bool cased = false;
  for (size_t i = 0; i < s.size();) {
    char32_t cp;
    i += unicode::DecodeAt(s, i, &cp);
    if (unicode::IsUpper(cp) || unicode::IsLower(cp)) {
      cased = true;
      if (!is_case(cp)) return false;
    }
  }
  return cased;
}

// Python's `v % divisor == 0` (floats too).
absl::StatusOr<bool> Divisible(const Value& v, int64_t divisor) {
  if (!v.is_number()) return TypeErrorStatus(Cat("'", v.TypeName(), "' is not a number"));
  auto m = BinaryOp("%", v, Value::Int(divisor));
  if (!m.ok()) return m.status();
  return m->AsDouble() == 0;
}

struct TestEntry {
  std::string_view name;
  TestFn fn;
};

#define SIMPLE(expr) \
  [](const Value& v, const ValueList& args) -> absl::StatusOr<bool> { return expr; }
#define CMP(op) [](const Value& v, const ValueList& args) { return CompareTest(v, args, op); }

const TestEntry kTests[] = {
    {"defined", SIMPLE(!v.is_undefined())},
    {"undefined", SIMPLE(v.is_undefined())},
    {"none", SIMPLE(v.is_none())},
    {"true", SIMPLE(v.is_bool() && v.AsBool())},
    {"false", SIMPLE(v.is_bool() && !v.AsBool())},
    {"boolean", SIMPLE(v.is_bool())},
    {"string", SIMPLE(v.is_string())},
    {"mapping", SIMPLE(v.is_dict())},
    {"number", SIMPLE(v.is_number())},
    {"integer", SIMPLE(v.is_int())},
    {"float", SIMPLE(v.is_float())},
    {"callable", SIMPLE(v.is_callable())},
    {"escaped", SIMPLE(false)},
    // Undefined iterates (as empty) and has a length, as in Jinja.
    {"iterable", SIMPLE(v.is_undefined() || v.is_string() || v.is_sequence() || v.is_dict())},
    {"sequence", SIMPLE(v.is_undefined() || v.is_string() || v.is_sequence() || v.is_dict())},
    {"lower", SIMPLE(CaseTest(v, unicode::IsLower))},
    {"upper", SIMPLE(CaseTest(v, unicode::IsUpper))},
    {"filter", SIMPLE(v.is_string() && IsKnownFilter(v.AsString()))},
    {"test", SIMPLE(v.is_string() && IsKnownTest(v.AsString()))},
    {"even", SIMPLE(Divisible(v, 2))},
    {"odd",  // Jinja: value % 2 == 1 (so 0.5 is neither odd nor even)
     [](const Value& v, const ValueList& args) -> absl::StatusOr<bool> {
       if (!v.is_number()) return TypeErrorStatus(Cat("'", v.TypeName(), "' is not a number"));
       auto m = BinaryOp("%", v, Value::Int(2));
       if (!m.ok()) return m.status();
       return m->AsDouble() == 1;
     }},
    {"divisibleby",
     [](const Value& v, const ValueList& args) -> absl::StatusOr<bool> {
       if (auto st = NeedArg(args, 1, "divisibleby"); !st.ok()) return st;
       if (!args[0].is_int()) return TypeErrorStatus("divisibleby needs an int");
       return Divisible(v, args[0].AsInt());
     }},
    {"in",
     [](const Value& v, const ValueList& args) -> absl::StatusOr<bool> {
       if (auto st = NeedArg(args, 1, "in"); !st.ok()) return st;
       return Contains(args[0], v);
     }},
    {"sameas",
     [](const Value& v, const ValueList& args) -> absl::StatusOr<bool> {
       if (auto st = NeedArg(args, 1, "sameas"); !st.ok()) return st;
       // Python identity, approximated: same kind and equal.
       return v.kind() == args[0].kind() && Equals(v, args[0]);
     }},
    {"eq", CMP("==")},
    {"equalto", CMP("==")},
    {"==", CMP("==")},
    {"ne", CMP("!=")},
    {"!=", CMP("!=")},
    {"lt", CMP("<")},
    {"lessthan", CMP("<")},
    {"<", CMP("<")},
    {"le", CMP("<=")},
    {"<=", CMP("<=")},
    {"gt", CMP(">")},
    {"greaterthan", CMP(">")},
    {">", CMP(">")},
    {"ge", CMP(">=")},
    {">=", CMP(">=")},
};

#undef SIMPLE
#undef CMP

const TestEntry* FindTest(std::string_view name) {
  for (const auto& t : kTests) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

}  // namespace

bool IsKnownTest(std::string_view name) { return FindTest(name) != nullptr; }

absl::StatusOr<bool> ApplyTest(std::string_view name, const Value& input, const ValueList& args) {
  const TestEntry* t = FindTest(name);
  if (t == nullptr) return absl::InvalidArgumentError(Cat("no test named '", name, "'"));
  return t->fn(input, args);
}

}  // namespace ballast::chat
