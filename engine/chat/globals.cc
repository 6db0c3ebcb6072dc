// The interpreter's global functions: Jinja's range/namespace/dict and
// Hugging Face's raise_exception/strftime_now.
#include <ctime>
#include <memory>

#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "engine/chat/builtins.h"
#include "engine/chat/evaluator.h"
#include "engine/chat/lexer.h"

namespace ballast::chat {
namespace {

constexpr absl::string_view kRaisedPayload = "ballast.chat/raise_exception";
// Jinja's sandbox refuses larger ranges (MAX_RANGE).
constexpr int64_t kMaxRange = 100000;

absl::StatusOr<Value> Range(const ValueList& args, const Kwargs& kwargs) {
  if (!kwargs.empty() || args.empty() || args.size() > 3) {
    return TypeErrorStatus("range expected 1 to 3 positional arguments");
  }
  for (const Value& a : args) {
    if (!a.is_int() && !a.is_bool()) {
      return TypeErrorStatus(
          Cat("'", a.TypeName(), "' object cannot be interpreted as an integer"));
    }
  }
  const int64_t start = args.size() == 1 ? 0 : args[0].AsInt();
  const int64_t stop = args.size() == 1 ? args[0].AsInt() : args[1].AsInt();
  const int64_t step = args.size() == 3 ? args[2].AsInt() : 1;
  if (step == 0) return absl::InvalidArgumentError("ValueError: range() arg 3 must not be zero");
  const int64_t n = step > 0 ? (stop > start ? (stop - start + step - 1) / step : 0)
                             : (start > stop ? (start - stop - step - 1) / -step : 0);
  if (n > kMaxRange) {
    return absl::InvalidArgumentError(
        "OverflowError: Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
  }
  ValueList out;
  out.reserve(n);
  for (int64_t i = 0; i < n; ++i) out.push_back(Value::Int(start + i * step));
  return Value::List(std::move(out));
}

absl::StatusOr<Value> Namespace(const ValueList& args, const Kwargs& kwargs) {
  auto ns = std::make_shared<Object>();
  ns->type_name = "Namespace";
  ns->is_namespace = true;
  for (const Value& a : args) {  // namespace({'a': 1}) takes the dict's items
    if (!a.is_dict()) return TypeErrorStatus("namespace() positional arguments must be dicts");
    for (const auto& [k, v] : a.AsDict().items) ns->attrs.Set(k, v);
  }
  for (const auto& [k, v] : kwargs) ns->attrs.Set(Value::String(k), v);
  return Value::MakeObject(std::move(ns));
}

absl::StatusOr<Value> Dict(const ValueList& args, const Kwargs& kwargs) {
  ValueDict d;
  for (const Value& a : args) {
    if (!a.is_dict()) return absl::UnimplementedError("unsupported: dict() from a non-dict");
    for (const auto& [k, v] : a.AsDict().items) d.Set(k, v);
  }
  for (const auto& [k, v] : kwargs) d.Set(Value::String(k), v);
  return Value::Dict(std::move(d));
}

absl::StatusOr<Value> RaiseException(const ValueList& args, const Kwargs& kwargs) {
  ArgBinder b("raise_exception", args, kwargs, {"message"});
  if (!b.status().ok()) return b.status();
  return internal::RaisedException(b.Get(0).Str());
}

absl::StatusOr<Value> StrftimeNow(const ValueList& args, const Kwargs& kwargs) {
  ArgBinder b("strftime_now", args, kwargs, {"format"});
  if (!b.status().ok()) return b.status();
  if (!b.Get(0).is_string()) return TypeErrorStatus("strftime_now() argument must be str");
  const std::time_t now = std::time(nullptr);
  std::tm tm;
  localtime_r(&now, &tm);
  char buf[256];
  const size_t n = std::strftime(buf, sizeof(buf), b.Get(0).AsString().c_str(), &tm);
  return Value::String(std::string(buf, n));
}

Value Unsupported(std::string name) {
  return Value::MakeCallable(
      name, [name](const ValueList&, const Kwargs&) -> absl::StatusOr<Value> {
        return absl::UnimplementedError(Cat("unsupported global function '", name, "'"));
      });
}

}  // namespace

bool IsRaisedException(const absl::Status& status) {
  return status.GetPayload(kRaisedPayload).has_value();
}

namespace internal {

absl::Status LocateError(SourcePos pos, const absl::Status& status) {
  if (status.ok() || IsRaisedException(status) ||
      absl::StartsWith(status.message(), "chat template ")) {
    return status;
  }
  absl::Status located(status.code(),
                       Cat("chat template ", FormatPos(pos), ": ", status.message()));
  status.ForEachPayload(
      [&](absl::string_view url, const absl::Cord& payload) { located.SetPayload(url, payload); });
  return located;
}

absl::Status RaisedException(std::string message) {
  absl::Status status = absl::InvalidArgumentError(message);
  status.SetPayload(kRaisedPayload, absl::Cord("1"));
  return status;
}

ValueDict MakeGlobals() {
  ValueDict g;
  g.Set(Value::String("range"), Value::MakeCallable("range", Range));
  g.Set(Value::String("namespace"), Value::MakeCallable("namespace", Namespace));
  g.Set(Value::String("dict"), Value::MakeCallable("dict", Dict));
  g.Set(Value::String("raise_exception"), Value::MakeCallable("raise_exception", RaiseException));
  g.Set(Value::String("strftime_now"), Value::MakeCallable("strftime_now", StrftimeNow));
  for (const char* name : {"cycler", "joiner", "lipsum"}) {
    g.Set(Value::String(name), Unsupported(name));
  }
  return g;
}

Value MakeLoop(const ValueList& items, size_t i, std::shared_ptr<Value> last_changed) {
  const int64_t n = static_cast<int64_t>(items.size());
  const int64_t idx = static_cast<int64_t>(i);
  auto loop = std::make_shared<Object>();
  loop->type_name = "LoopContext";
  auto set = [&](const char* name, Value v) {
    loop->attrs.items.emplace_back(Value::String(name), std::move(v));
  };
  set("index0", Value::Int(idx));
  set("index", Value::Int(idx + 1));
  set("revindex0", Value::Int(n - idx - 1));
  set("revindex", Value::Int(n - idx));
  set("first", Value::Bool(idx == 0));
  set("last", Value::Bool(idx == n - 1));
  set("length", Value::Int(n));
  set("depth", Value::Int(1));
  set("depth0", Value::Int(0));
  set("previtem", idx > 0 ? items[i - 1] : Value::Undefined("there is no previous item"));
  set("nextitem", idx + 1 < n ? items[i + 1] : Value::Undefined("there is no next item"));
  set("cycle",
      Value::MakeCallable("loop.cycle",
                          [idx](const ValueList& args, const Kwargs&) -> absl::StatusOr<Value> {
                            if (args.empty()) return TypeErrorStatus("no items for cycling given");
                            return args[idx % static_cast<int64_t>(args.size())];
                          }));
  set("changed", Value::MakeCallable(
                     "loop.changed",
                     [last_changed](const ValueList& args, const Kwargs&) -> absl::StatusOr<Value> {
                       Value now = Value::List(args);
                       if (!last_changed->is_undefined() && Equals(*last_changed, now))
                         return Value::Bool(false);
                       *last_changed = std::move(now);
                       return Value::Bool(true);
                     }));
  return Value::MakeObject(std::move(loop));
}

}  // namespace internal
}  // namespace ballast::chat
