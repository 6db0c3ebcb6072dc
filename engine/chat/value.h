// Values of the chat-template interpreter, with Python semantics.
//
// Jinja evaluates templates on Python objects, so a byte-identical render
// needs Python's rules: str() and repr() of every type (floats in shortest
// repr, lists as "['a', 1]", None as "None"), truthiness, equality across
// int/float/bool, ordering, and Jinja's Undefined (prints as "", is false,
// iterates as empty; an attribute of it or arithmetic on it is an error).
//
// Strings, lists and dicts are immutable and shared (copying a Value is
// cheap). Dicts keep insertion order, as Python's do. Objects (namespace(),
// the loop variable) hold attributes; only a namespace may be assigned to.
//
// Thread-safety: a Value is immutable except a namespace's attributes; the
// interpreter never shares values between renders, so values need no locks.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/chat/cat.h"
#include "nlohmann/json.hpp"

namespace ballast::chat {

class Value;
using ValueList = std::vector<Value>;

// An insertion-ordered dict with Python key equality.
struct ValueDict {
  std::vector<std::pair<Value, Value>> items;

  const Value* Find(const Value& key) const;
  const Value* Find(std::string_view key) const;
  // Inserts or replaces.
  void Set(Value key, Value value);
};

// Keyword arguments of a call, in source order.
using Kwargs = std::vector<std::pair<std::string, Value>>;

// A callable: a global function (range, namespace, raise_exception), a bound
// method ("abc".upper), a macro or loop.cycle.
struct Callable {
  std::string name;
  std::function<absl::StatusOr<Value>(const ValueList& args, const Kwargs& kwargs)> fn;
  // Whether a call may read its arguments whole (a built-in such as
  // loop.changed or a method compares or scans them); a macro only binds
  // them to its parameters. The evaluator counts the reading in steps.
  bool reads_args = true;
};

// An attribute bag: namespace() (mutable) or the loop variable.
struct Object {
  std::string type_name;  // "Namespace", "LoopContext"
  bool is_namespace = false;
  ValueDict attrs;
};

class Value {
 public:
  enum class Kind : uint8_t {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,
    kTuple,
    kDict,
    kObject,
    kCallable,
  };

  Value() = default;  // undefined
  static Value Undefined(std::string hint);
  static Value None();
  static Value Bool(bool b);
  static Value Int(int64_t i);
  static Value Float(double d);
  static Value String(std::string s);
  static Value List(ValueList items);
  static Value Tuple(ValueList items);
  static Value Dict(ValueDict dict);
  static Value MakeObject(std::shared_ptr<Object> object);
  static Value MakeCallable(std::string name, decltype(Callable::fn) fn, bool reads_args = true);
  // JSON → Value (objects keep their key order).
  static Value FromJson(const nlohmann::ordered_json& j);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt; }
  bool is_float() const { return kind_ == Kind::kFloat; }
  // int, float or bool (Python's bool is an int).
  bool is_number() const { return is_int() || is_float() || is_bool(); }
  bool is_string() const { return kind_ == Kind::kString; }
  // list or tuple.
  bool is_sequence() const { return kind_ == Kind::kList || kind_ == Kind::kTuple; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_object() const { return kind_ == Kind::kObject; }
  bool is_callable() const { return kind_ == Kind::kCallable; }

  bool AsBool() const { return std::get<bool>(data_); }
  // int or bool; never throws: a float truncates toward zero (saturating,
  // NaN 0) and any other type gives 0. Where Python raises a TypeError for
  // a non-int, the caller checks the type first.
  int64_t AsInt() const;
  double AsDouble() const;  // int, float or bool
  const std::string& AsString() const;
  const ValueList& AsList() const;
  const ValueDict& AsDict() const;
  Object& AsObject() const;
  const Callable& AsCallable() const;
  // Why an undefined value is undefined ("'x' is undefined").
  const std::string& UndefinedHint() const;

  // Python's bool(x).
  bool Truthy() const;
  // How deeply containers nest in this value: 0 for a scalar, one more than
  // its deepest item for a list, tuple or dict, and for an object one more
  // than its deepest attribute when it was made (a namespace assigned to
  // later keeps that figure; Equals compares objects by identity).
  int depth() const { return depth_; }
  // Whether this is a string, list, dict or object whose data no other
  // value holds: one just made, not one read from a variable or container.
  bool Unshared() const;
  // Python's str(x); undefined is "". A container's text, like Repr's, is
  // cut once it passes kMaxStringBytes: longer means "too large".
  std::string Str() const;
  // Python's repr(x), cut once it passes kMaxStringBytes (so at most a few
  // bytes over it): a text longer than kMaxStringBytes was cut, and the
  // evaluator refuses it (OverflowError) wherever it would become a value.
  std::string Repr() const;
  // Repr() for a message: cut after `max_bytes`, "..." marking the cut, in
  // time proportional to max_bytes whatever the value's size.
  std::string ShortRepr(size_t max_bytes = 200) const;
  // At least the first `max_bytes` of Repr() (all of it when shorter; a few
  // bytes more at most), in time proportional to max_bytes.
  std::string ReprPrefix(size_t max_bytes) const;
  // Python's type name: "str", "int", "NoneType", "dict", ...
  std::string TypeName() const;

 private:
  using Data =
      std::variant<std::monostate, bool, int64_t, double, std::shared_ptr<const std::string>,
                   std::shared_ptr<const ValueList>, std::shared_ptr<const ValueDict>,
                   std::shared_ptr<Object>, std::shared_ptr<const Callable>>;
  Value(Kind kind, Data data, int depth = 0) : kind_(kind), depth_(depth), data_(std::move(data)) {}

  Kind kind_ = Kind::kUndefined;
  int depth_ = 0;
  Data data_;
};

// The deepest a template's value may nest (Value::depth): deeper ones are
// refused with RecursionError, so that comparing, printing or freeing one
// never recurses past it (a 300,000-deep list overflowed the stack).
inline constexpr int kMaxValueDepth = 512;

// The longest string a template may make (16 MiB): longer ones are
// refused with OverflowError (builtins.h's CheckStringBytes).
inline constexpr uint64_t kMaxStringBytes = uint64_t{16} << 20;

// Python's `a == b` (1 == 1.0 == True; [1] != (1,)).
bool Equals(const Value& a, const Value& b);
// Python's ordering: <0, 0, >0; a TypeError naming `op` for unorderable types.
absl::StatusOr<int> Compare(const Value& a, const Value& b, std::string_view op = "<");
// Python's repr() of a float ("1.0", "1e-05", "1e+16", "nan", "inf").
std::string FloatRepr(double d);
// Python's repr() of a str ('abc', "it's").
std::string StringRepr(std::string_view s);

}  // namespace ballast::chat
