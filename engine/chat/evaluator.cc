#include "engine/chat/evaluator.h"

#include <algorithm>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "engine/chat/builtins.h"
#include "engine/chat/operators.h"
#include "engine/chat/work.h"

namespace ballast::chat {
namespace {

constexpr size_t kMaxOutputBytes = kMaxStringBytes;
constexpr int kMaxCallDepth = 64;
struct Frame {
  absl::flat_hash_map<std::string, Value> vars;
  std::shared_ptr<Frame> parent;

  const Value* Find(const std::string& name) const {
    for (const Frame* f = this; f != nullptr; f = f->parent.get()) {
      if (auto it = f->vars.find(name); it != f->vars.end()) return &it->second;
    }
    return nullptr;
  }
};

enum class Flow { kNormal, kBreak, kContinue };

absl::Status At(SourcePos pos, const absl::Status& status) {
  return internal::LocateError(pos, status);
}

class Evaluator {
 public:
  Evaluator(std::shared_ptr<Frame> frame, int64_t max_steps)
      : frame_(std::move(frame)), budget_(max_steps) {}
  // Breaks the reference cycles a template can make, so the values are
  // freed: a namespace that holds itself (`set ns.me = ns`, directly or
  // through other values), or a loop.changed() whose remembered value holds
  // the loop. Every cycle passes through a namespace assigned to or a
  // loop's remembered value, and nothing outlives the render.
  ~Evaluator() {
    for (const Value& ns : assigned_namespaces_) ns.AsObject().attrs.items.clear();
    for (const auto& changed : loop_changed_) *changed = Value();
  }
  Evaluator(const Evaluator&) = delete;
  Evaluator& operator=(const Evaluator&) = delete;

  absl::StatusOr<Flow> Exec(const StmtList& body, std::string* out);
  absl::StatusOr<Value> Eval(const Expr& e);

 private:
  // Counts n steps: RESOURCE_EXHAUSTED past the budget.
  absl::Status Step(int64_t n = 1) { return budget_.Charge(n); }
  // Counts reading `v` whole (a scan or a copy) in steps.
  absl::Status Read(const Value& v) { return Step(SizeSteps(v)); }
  // Counts an attribute or item lookup in `obj`: a list's is by index (free);
  // a dict's or object's key is searched item by item, a string's index
  // counted in code points.
  absl::Status ReadForLookup(const Value& obj) {
    return obj.is_sequence() ? absl::OkStatus() : Read(obj);
  }
  // Appends `text` to `out`, counting its size in steps.
  absl::Status Print(std::string_view text, std::string* out) {
    out->append(text);
    return Step(TextSteps(text.size()));
  }
  absl::StatusOr<Flow> ExecOne(const Stmt& s, std::string* out);
  absl::StatusOr<Flow> ExecFor(const Stmt& s, std::string* out);
  absl::StatusOr<Flow> ExecCaptureBlock(const Stmt& s, std::string* out);
  absl::Status ExecMacro(const Stmt& s);
  absl::StatusOr<Flow> ExecWith(const Stmt& s, std::string* out);
  absl::Status Assign(const Target& t, const Value& v, SourcePos pos);
  // Renders `body` in the current scope into a string.
  absl::StatusOr<std::string> Capture(const StmtList& body);
  // Applies the filter chain `e` (innermost child null) to `input`.
  absl::StatusOr<Value> ApplyChain(const Expr& e, const Value& input);
  absl::StatusOr<Value> EvalInner(const Expr& e);
  absl::StatusOr<Value> EvalCall(const Expr& e);
  absl::StatusOr<Value> EvalSlice(const Expr& e);
  absl::StatusOr<Value> EvalFilterOrTest(const Expr& e);
  absl::StatusOr<Value> EvalCondition(const Expr& e);
  absl::StatusOr<Value> EvalBinary(const Expr& e);
  absl::StatusOr<Value> EvalCompare(const Expr& e);
  absl::StatusOr<Value> EvalCollection(const Expr& e);
  absl::Status EvalArgs(const Expr& e, size_t first, ValueList* args, Kwargs* kwargs);
  absl::StatusOr<Value> CallMacro(const Stmt& s, const std::weak_ptr<Frame>& scope,
                                  const ValueList& args, const Kwargs& kwargs);

  std::shared_ptr<Frame> frame_;
  int call_depth_ = 0;
  WorkBudget budget_;
  // Namespaces assigned to, and loops' remembered values (the destructor).
  std::vector<Value> assigned_namespaces_;
  absl::flat_hash_set<const Object*> assigned_seen_;
  std::vector<std::shared_ptr<Value>> loop_changed_;
};

absl::StatusOr<Flow> Evaluator::Exec(const StmtList& body, std::string* out) {
  for (const auto& s : body) {
    if (auto st = Step(); !st.ok()) return At(s->pos, st);
    auto flow = ExecOne(*s, out);
    if (!flow.ok()) return At(s->pos, flow.status());
    if (*flow != Flow::kNormal) return flow;
    if (out->size() > kMaxOutputBytes) {
      return absl::ResourceExhaustedError("chat template: rendered text exceeds 16 MiB");
    }
  }
  return Flow::kNormal;
}

absl::StatusOr<Flow> Evaluator::ExecOne(const Stmt& s, std::string* out) {
  switch (s.kind) {
    case Stmt::Kind::kText:
      out->append(s.text);
      return Flow::kNormal;
    case Stmt::Kind::kOutput: {
      auto v = Eval(*s.expr);
      if (!v.ok()) return v.status();
      if (auto st = Print(v->is_string() ? v->AsString() : v->Str(), out); !st.ok()) return st;
      return Flow::kNormal;
    }
    case Stmt::Kind::kIf: {
      auto cond = Eval(*s.expr);
      if (!cond.ok()) return cond.status();
      return Exec(cond->Truthy() ? s.body : s.else_body, out);
    }
    case Stmt::Kind::kFor:
      return ExecFor(s, out);
    case Stmt::Kind::kSet: {
      auto v = Eval(*s.expr);
      if (!v.ok()) return v.status();
      if (auto st = Assign(s.target, *v, s.pos); !st.ok()) return st;
      return Flow::kNormal;
    }
    case Stmt::Kind::kSetBlock:
    case Stmt::Kind::kFilterBlock:
      return ExecCaptureBlock(s, out);
    case Stmt::Kind::kMacro: {
      if (auto st = ExecMacro(s); !st.ok()) return st;
      return Flow::kNormal;
    }
    case Stmt::Kind::kWith:
      return ExecWith(s, out);
    case Stmt::Kind::kBreak:
      return Flow::kBreak;
    case Stmt::Kind::kContinue:
      return Flow::kContinue;
    case Stmt::Kind::kGeneration:
      return Exec(s.body, out);
  }
  return Flow::kNormal;
}

// {% set x %}...{% endset %} and {% filter f %}...{% endfilter %}: the body
// rendered to a string, through the optional filter chain.
absl::StatusOr<Flow> Evaluator::ExecCaptureBlock(const Stmt& s, std::string* out) {
  auto text = Capture(s.body);
  if (!text.ok()) return text.status();
  Value v = Value::String(std::move(*text));
  if (s.expr) {
    auto filtered = ApplyChain(*s.expr, v);
    if (!filtered.ok()) return filtered.status();
    v = std::move(*filtered);
  }
  if (s.kind == Stmt::Kind::kFilterBlock) {
    if (auto st = Print(v.Str(), out); !st.ok()) return st;
    return Flow::kNormal;
  }
  if (auto st = Assign(s.target, v, s.pos); !st.ok()) return st;
  return Flow::kNormal;
}

absl::StatusOr<std::string> Evaluator::Capture(const StmtList& body) {
  std::string text;
  auto flow = Exec(body, &text);
  if (!flow.ok()) return flow.status();
  return text;
}

absl::Status Evaluator::Assign(const Target& t, const Value& v, SourcePos pos) {
  if (!t.ns_attr.empty()) {
    const Value* ns = frame_->Find(t.names[0]);
    if (ns == nullptr || !ns->is_object() || !ns->AsObject().is_namespace) {
      return absl::InvalidArgumentError(
          "TemplateRuntimeError: cannot assign attribute on non-namespace object");
    }
    ns->AsObject().attrs.Set(Value::String(t.ns_attr), v);
    if (assigned_seen_.insert(&ns->AsObject()).second) assigned_namespaces_.push_back(*ns);
    return absl::OkStatus();
  }
  if (!t.unpack) {
    frame_->vars[t.names[0]] = v;
    return absl::OkStatus();
  }
  auto items = Iterate(v);
  if (!items.ok()) return items.status();
  if (items->size() != t.names.size()) {
    return absl::InvalidArgumentError(
        items->size() < t.names.size()
            ? Cat("ValueError: not enough values to unpack (expected ", t.names.size(), ", got ",
                  items->size(), ")")
            : Cat("ValueError: too many values to unpack (expected ", t.names.size(), ")"));
  }
  for (size_t i = 0; i < t.names.size(); ++i) frame_->vars[t.names[i]] = (*items)[i];
  return absl::OkStatus();
}

absl::StatusOr<Flow> Evaluator::ExecFor(const Stmt& s, std::string* out) {
  auto iterable = Eval(*s.expr);
  if (!iterable.ok()) return iterable.status();
  if (auto st = Read(*iterable); !st.ok()) return At(s.pos, st);  // Iterate copies it
  auto all = Iterate(*iterable);
  if (!all.ok()) return At(s.expr->pos, all.status());
  const std::shared_ptr<Frame> outer = frame_;
  ValueList items;
  if (s.condition) {  // {% for x in xs if cond %}: filtered before loop.length is known
    for (const Value& item : *all) {
      frame_ = std::make_shared<Frame>(Frame{{}, outer});
      absl::Status st = Assign(s.target, item, s.pos);
      absl::StatusOr<Value> keep = st.ok() ? Eval(*s.condition) : st;
      frame_ = outer;
      if (!keep.ok()) return keep.status();
      if (keep->Truthy()) items.push_back(item);
    }
  } else {
    items = std::move(*all);
  }
  if (items.empty()) {
    frame_ = std::make_shared<Frame>(Frame{{}, outer});
    auto flow = Exec(s.else_body, out);
    frame_ = outer;
    if (!flow.ok()) return flow.status();
    return Flow::kNormal;
  }
  auto last_changed = std::make_shared<Value>();
  loop_changed_.push_back(last_changed);
  for (size_t i = 0; i < items.size(); ++i) {
    if (auto st = Step(kLoopIterationSteps); !st.ok()) return At(s.pos, st);
    frame_ = std::make_shared<Frame>(Frame{{}, outer});
    frame_->vars["loop"] = internal::MakeLoop(items, i, last_changed);
    absl::Status st = Assign(s.target, items[i], s.pos);
    absl::StatusOr<Flow> flow = st.ok() ? Exec(s.body, out) : st;
    frame_ = outer;
    if (!flow.ok()) return flow.status();
    if (*flow == Flow::kBreak) break;
  }
  return Flow::kNormal;
}

absl::Status Evaluator::ExecMacro(const Stmt& s) {
  std::weak_ptr<Frame> scope = frame_;
  const Stmt* stmt = &s;
  frame_->vars[s.name] = Value::MakeCallable(
      s.name,
      [this, stmt, scope](const ValueList& args, const Kwargs& kwargs) {
        return CallMacro(*stmt, scope, args, kwargs);
      },
      /*reads_args=*/false);
  return absl::OkStatus();
}

absl::StatusOr<Value> Evaluator::CallMacro(const Stmt& s, const std::weak_ptr<Frame>& scope,
                                           const ValueList& args, const Kwargs& kwargs) {
  std::shared_ptr<Frame> parent = scope.lock();
  if (!parent) return absl::FailedPreconditionError("macro called outside its scope");
  if (call_depth_ >= kMaxCallDepth) {
    return absl::ResourceExhaustedError("RecursionError: macros nested too deeply");
  }
  const std::shared_ptr<Frame> saved = frame_;
  frame_ = std::make_shared<Frame>(Frame{{}, parent});
  ValueList varargs;
  for (size_t i = 0; i < args.size(); ++i) {
    if (i < s.params.size()) {
      frame_->vars[s.params[i].name] = args[i];
    } else {
      varargs.push_back(args[i]);
    }
  }
  ValueDict extra;
  for (const auto& kv : kwargs) {
    // Not a structured binding: clang 14 cannot capture one in the lambda.
    const auto& k = kv.first;
    const auto& v = kv.second;
    const bool is_param = std::any_of(s.params.begin(), s.params.end(),
                                      [&](const MacroParam& p) { return p.name == k; });
    if (is_param) {
      frame_->vars[k] = v;
    } else {
      extra.Set(Value::String(k), v);
    }
  }
  frame_->vars["varargs"] = Value::Tuple(std::move(varargs));
  frame_->vars["kwargs"] = Value::Dict(std::move(extra));
  absl::Status status;
  for (const MacroParam& p : s.params) {
    if (frame_->vars.contains(p.name)) continue;
    if (!p.default_value) {
      frame_->vars[p.name] = Value::Undefined(Cat("parameter '", p.name, "' was not provided"));
      continue;
    }
    auto def = Eval(*p.default_value);
    if (!def.ok()) {
      status = def.status();
      break;
    }
    frame_->vars[p.name] = std::move(*def);
  }
  ++call_depth_;
  absl::StatusOr<std::string> text = status.ok() ? Capture(s.body) : status;
  --call_depth_;
  frame_ = saved;
  if (!text.ok()) return text.status();
  return Value::String(std::move(*text));
}

absl::StatusOr<Flow> Evaluator::ExecWith(const Stmt& s, std::string* out) {
  const std::shared_ptr<Frame> outer = frame_;
  auto inner = std::make_shared<Frame>(Frame{{}, outer});
  for (size_t i = 0; i < s.with_targets.size(); ++i) {
    auto v = Eval(*s.with_values[i]);  // evaluated in the enclosing scope
    if (!v.ok()) return v.status();
    frame_ = inner;
    absl::Status st = Assign(s.with_targets[i], *v, s.pos);
    frame_ = outer;
    if (!st.ok()) return st;
  }
  frame_ = inner;
  auto flow = Exec(s.body, out);
  frame_ = outer;
  return flow;
}

absl::StatusOr<Value> Evaluator::ApplyChain(const Expr& e, const Value& input) {
  Value v = input;
  if (e.children[0]) {
    auto inner = ApplyChain(*e.children[0], input);
    if (!inner.ok()) return inner.status();
    v = std::move(*inner);
  }
  ValueList args;
  Kwargs kwargs;
  if (auto st = EvalArgs(e, 1, &args, &kwargs); !st.ok()) return st;
  if (!ConstantTimeFilter(e.name, v)) {
    if (auto st = Read(v); !st.ok()) return At(e.pos, st);
  }
  auto r = ApplyFilter(e.name, v, args, kwargs);
  if (r.ok()) r = CheckSize(std::move(*r));
  if (!r.ok()) return At(e.pos, r.status());
  return r;
}

absl::StatusOr<Value> Evaluator::Eval(const Expr& e) {
  if (auto st = Step(); !st.ok()) return At(e.pos, st);
  auto v = EvalInner(e);
  if (v.ok()) v = CheckSize(std::move(*v));
  if (!v.ok()) return At(e.pos, v.status());
  // A value made here costs in proportion to its size (what building it
  // cost); one read from a variable or container costs nothing more.
  if (v->Unshared()) {
    if (auto st = Read(*v); !st.ok()) return At(e.pos, st);
  }
  return v;
}

absl::Status Evaluator::EvalArgs(const Expr& e, size_t first, ValueList* args, Kwargs* kwargs) {
  for (size_t i = first; i < e.children.size(); ++i) {
    auto v = Eval(*e.children[i]);
    if (!v.ok()) return v.status();
    args->push_back(std::move(*v));
  }
  for (const auto& [k, ex] : e.kwargs) {
    auto v = Eval(*ex);
    if (!v.ok()) return v.status();
    kwargs->emplace_back(k, std::move(*v));
  }
  return absl::OkStatus();
}

absl::StatusOr<Value> Evaluator::EvalInner(const Expr& e) {
  switch (e.kind) {
    case Expr::Kind::kLiteral:
      return e.literal;
    case Expr::Kind::kName: {
      if (const Value* v = frame_->Find(e.name)) return *v;
      return Value::Undefined(Cat("'", e.name, "' is undefined"));
    }
    case Expr::Kind::kList:
    case Expr::Kind::kTuple:
    case Expr::Kind::kDict:
      return EvalCollection(e);
    case Expr::Kind::kGetAttr: {
      auto obj = Eval(*e.children[0]);
      if (!obj.ok()) return obj.status();
      // A dict's or object's key is searched item by item; a method may read
      // its string, list or dict whole.
      if (auto st = ReadForLookup(*obj); !st.ok()) return st;
      auto attr = GetAttr(*obj, e.name);
      if (attr.ok() && attr->is_callable() && obj->is_sequence()) {
        if (auto st = Read(*obj); !st.ok()) return st;
      }
      return attr;
    }
    case Expr::Kind::kGetItem: {
      auto obj = Eval(*e.children[0]);
      if (!obj.ok()) return obj.status();
      auto key = Eval(*e.children[1]);
      if (!key.ok()) return key.status();
      if (auto st = ReadForLookup(*obj); !st.ok()) return st;  // as kGetAttr
      auto item = GetItem(*obj, *key);
      if (item.ok() && item->is_callable() && obj->is_sequence()) {
        if (auto st = Read(*obj); !st.ok()) return st;
      }
      return item;
    }
    case Expr::Kind::kSlice:
      return EvalSlice(e);
    case Expr::Kind::kCall:
      return EvalCall(e);
    case Expr::Kind::kFilter:
    case Expr::Kind::kTest:
      return EvalFilterOrTest(e);
    case Expr::Kind::kUnary: {
      auto v = Eval(*e.children[0]);
      if (!v.ok()) return v.status();
      if (e.name == "not") return Value::Bool(!v->Truthy());
      return UnaryOp(e.name, *v);
    }
    case Expr::Kind::kBinary:
      return EvalBinary(e);
    case Expr::Kind::kCompare:
      return EvalCompare(e);
    case Expr::Kind::kCondition:
      return EvalCondition(e);
  }
  return absl::InternalError("unknown expression kind");
}

absl::StatusOr<Value> Evaluator::EvalSlice(const Expr& e) {
  Value parts[4];  // container, start, stop, step (absent: undefined)
  for (size_t i = 0; i < 4; ++i) {
    if (!e.children[i]) continue;
    auto v = Eval(*e.children[i]);
    if (!v.ok()) return v.status();
    parts[i] = std::move(*v);
  }
  if (parts[0].is_string()) {  // counted in code points: read whole
    if (auto st = Read(parts[0]); !st.ok()) return st;
  }
  return Slice(parts[0], parts[1], parts[2], parts[3]);
}

absl::StatusOr<Value> Evaluator::EvalFilterOrTest(const Expr& e) {
  auto input = Eval(*e.children[0]);
  if (!input.ok()) return input.status();
  if (ReadsText(e.kind == Expr::Kind::kFilter, e.name) && !input->is_string() &&
      !input->is_undefined()) {  // the text is made here and counted
    auto text = TextOf(*input);
    if (!text.ok()) return text.status();
    if (auto st = Step(TextSteps(text->size())); !st.ok()) return st;
    input = Value::String(std::move(*text));
  }
  ValueList args;
  Kwargs kwargs;
  if (auto st = EvalArgs(e, 1, &args, &kwargs); !st.ok()) return st;
  if (e.kind == Expr::Kind::kFilter) {
    if (!ConstantTimeFilter(e.name, *input)) {
      if (auto st = Read(*input); !st.ok()) return st;
    }
    return ApplyFilter(e.name, *input, args, kwargs);
  }
  if (ScanningTest(e.name)) {
    if (auto st = Read(*input); !st.ok()) return st;
    for (const Value& a : args) {
      if (auto st = Read(a); !st.ok()) return st;
    }
  }
  auto r = ApplyTest(e.name, *input, args);
  if (!r.ok()) return r.status();
  return Value::Bool(*r != e.negated);
}

absl::StatusOr<Value> Evaluator::EvalCondition(const Expr& e) {
  auto cond = Eval(*e.children[0]);
  if (!cond.ok()) return cond.status();
  if (cond->Truthy()) return Eval(*e.children[1]);
  if (e.children[2]) return Eval(*e.children[2]);
  return Value::Undefined(
      "the inline if-expression evaluated to false and no else section was defined.");
}

absl::StatusOr<Value> Evaluator::EvalCollection(const Expr& e) {
  ValueList items;
  for (const auto& c : e.children) {
    auto v = Eval(*c);
    if (!v.ok()) return v.status();
    items.push_back(std::move(*v));
  }
  if (e.kind == Expr::Kind::kList) return Value::List(std::move(items));
  if (e.kind == Expr::Kind::kTuple) return Value::Tuple(std::move(items));
  ValueDict d;
  for (size_t i = 0; i + 1 < items.size(); i += 2) d.Set(items[i], items[i + 1]);
  return Value::Dict(std::move(d));
}

absl::StatusOr<Value> Evaluator::EvalCall(const Expr& e) {
  auto callee = Eval(*e.children[0]);
  if (!callee.ok()) return callee.status();
  if (callee->is_undefined()) return absl::InvalidArgumentError(callee->UndefinedHint());
  if (!callee->is_callable()) {
    return TypeErrorStatus(Cat("'", callee->TypeName(), "' object is not callable"));
  }
  ValueList args;
  Kwargs kwargs;
  if (auto st = EvalArgs(e, 1, &args, &kwargs); !st.ok()) return st;
  if (callee->AsCallable().reads_args) {
    for (const Value& a : args) {
      if (auto st = Read(a); !st.ok()) return st;
    }
    for (const auto& kv : kwargs) {
      if (auto st = Read(kv.second); !st.ok()) return st;
    }
  }
  return callee->AsCallable().fn(args, kwargs);
}

absl::StatusOr<Value> Evaluator::EvalBinary(const Expr& e) {
  auto left = Eval(*e.children[0]);
  if (!left.ok()) return left.status();
  if (e.name == "and") return left->Truthy() ? Eval(*e.children[1]) : left;
  if (e.name == "or") return left->Truthy() ? left : Eval(*e.children[1]);
  auto right = Eval(*e.children[1]);
  if (!right.ok()) return right.status();
  if (e.name == "~") {
    std::string joined = left->Str();
    joined += right->Str();
    if (joined.size() > kMaxOutputBytes) {
      return absl::ResourceExhaustedError("chat template: string exceeds 16 MiB");
    }
    return Value::String(std::move(joined));
  }
  return BinaryOp(e.name, *left, *right);
}

absl::StatusOr<Value> Evaluator::EvalCompare(const Expr& e) {
  auto left = Eval(*e.children[0]);
  if (!left.ok()) return left.status();
  for (size_t i = 0; i < e.ops.size(); ++i) {
    auto right = Eval(*e.children[i + 1]);
    if (!right.ok()) return right.status();
    if (auto st = Read(*left); !st.ok()) return st;  // ==, in, <: both read whole
    if (auto st = Read(*right); !st.ok()) return st;
    const std::string& op = e.ops[i];
    bool result;
    if (op == "==" || op == "!=") {
      result = Equals(*left, *right) == (op == "==");
    } else if (op == "in" || op == "not in") {
      auto in = Contains(*right, *left);
      if (!in.ok()) return in.status();
      result = *in == (op == "in");
    } else {
      auto c = Compare(*left, *right, op);
      if (!c.ok()) return c.status();
      result = op == "<" ? *c < 0 : op == "<=" ? *c <= 0 : op == ">" ? *c > 0 : *c >= 0;
    }
    if (!result) return Value::Bool(false);
    left = std::move(right);
  }
  return Value::Bool(true);
}

}  // namespace

absl::StatusOr<std::string> Evaluate(const StmtList& body, const nlohmann::ordered_json& context,
                                     int64_t max_steps) {
  if (!context.is_object()) {
    return absl::InvalidArgumentError("chat template context must be a JSON object");
  }
  auto globals = std::make_shared<Frame>();
  for (auto& [k, v] : internal::MakeGlobals().items) globals->vars[k.AsString()] = std::move(v);
  auto top = std::make_shared<Frame>(Frame{{}, globals});
  for (const auto& [k, v] : context.items()) top->vars[k] = Value::FromJson(v);
  Evaluator evaluator(top, max_steps);
  std::string out;
  auto flow = evaluator.Exec(body, &out);
  if (!flow.ok()) return flow.status();
  return out;
}

}  // namespace ballast::chat
