// Expression rules of the parser (see parser.h for the precedence).
#include "absl/status/status.h"
#include "engine/chat/builtins.h"
#include "engine/chat/parser.h"

namespace ballast::chat::internal {
namespace {

ExprPtr MakeExpr(Expr::Kind kind, SourcePos pos) {
  auto e = std::make_unique<Expr>();
  e->kind = kind;
  e->pos = pos;
  return e;
}

ExprPtr MakeBinary(std::string op, ExprPtr left, ExprPtr right, SourcePos pos) {
  auto e = MakeExpr(Expr::Kind::kBinary, pos);
  e->name = std::move(op);
  e->children.push_back(std::move(left));
  e->children.push_back(std::move(right));
  return e;
}

}  // namespace

absl::StatusOr<ExprPtr> Parser::ParseTuple(bool with_condexpr, bool explicit_parens) {
  const SourcePos pos = Current().pos;
  ExprList items;
  bool is_tuple = false;
  auto at_end = [&] {
    const Token& t = Current();
    return t.type == Token::Type::kVarEnd || t.type == Token::Type::kBlockEnd ||
           t.type == Token::Type::kEnd || IsOp(")");
  };
  while (true) {
    if (!items.empty()) {
      if (auto st = ExpectOp(","); !st.ok()) return st;
    }
    if (at_end() && (!items.empty() || explicit_parens)) break;
    auto e = ParseExpression(with_condexpr);
    if (!e.ok()) return e.status();
    items.push_back(std::move(*e));
    if (IsOp(",")) {
      is_tuple = true;
    } else {
      break;
    }
  }
  if (!is_tuple && items.size() == 1) return std::move(items[0]);
  if (!is_tuple && !explicit_parens) return Error("expected an expression");
  auto t = MakeExpr(Expr::Kind::kTuple, pos);
  t->children = std::move(items);
  return t;
}

absl::StatusOr<ExprPtr> Parser::ParseExpression(bool with_condexpr) {
  return with_condexpr ? ParseCondExpr() : ParseOr();
}

absl::StatusOr<ExprPtr> Parser::ParseCondExpr() {
  auto expr = ParseOr();
  if (!expr.ok()) return expr.status();
  while (IsName("if")) {
    const SourcePos pos = Current().pos;
    Advance();
    auto cond = ParseOr();
    if (!cond.ok()) return cond.status();
    auto e = MakeExpr(Expr::Kind::kCondition, pos);
    e->children.push_back(std::move(*cond));
    e->children.push_back(std::move(*expr));
    if (SkipName("else")) {
      auto other = ParseCondExpr();
      if (!other.ok()) return other.status();
      e->children.push_back(std::move(*other));
    } else {
      e->children.push_back(nullptr);
    }
    expr = std::move(e);
  }
  return expr;
}

absl::StatusOr<ExprPtr> Parser::ParseLeftAssoc(absl::FunctionRef<absl::StatusOr<ExprPtr>()> next,
                                               std::initializer_list<std::string_view> ops,
                                               bool keywords) {
  auto left = next();
  if (!left.ok()) return left.status();
  while (true) {
    std::string op;
    for (const std::string_view o : ops) {
      if (keywords ? IsName(o) : IsOp(o)) {
        op = std::string(o);
        break;
      }
    }
    if (op.empty()) return left;
    const SourcePos pos = Current().pos;
    Advance();
    auto right = next();
    if (!right.ok()) return right.status();
    left = MakeBinary(std::move(op), std::move(*left), std::move(*right), pos);
  }
}

absl::StatusOr<ExprPtr> Parser::ParseOr() {
  return ParseLeftAssoc([this] { return ParseAnd(); }, {"or"}, /*keywords=*/true);
}

absl::StatusOr<ExprPtr> Parser::ParseAnd() {
  return ParseLeftAssoc([this] { return ParseNot(); }, {"and"}, /*keywords=*/true);
}

absl::StatusOr<ExprPtr> Parser::ParseNot() {
  if (IsName("not")) {
    const SourcePos pos = Current().pos;
    Advance();
    auto operand = ParseNot();
    if (!operand.ok()) return operand.status();
    auto e = MakeExpr(Expr::Kind::kUnary, pos);
    e->name = "not";
    e->children.push_back(std::move(*operand));
    return e;
  }
  return ParseCompare();
}

absl::StatusOr<ExprPtr> Parser::ParseCompare() {
  const SourcePos pos = Current().pos;
  auto first = ParseMath1();
  if (!first.ok()) return first.status();
  ExprPtr cmp;
  while (true) {
    std::string op;
    const Token& t = Current();
    if (t.type == Token::Type::kOperator &&
        (t.value == "==" || t.value == "!=" || t.value == "<" || t.value == "<=" ||
         t.value == ">" || t.value == ">=")) {
      op = t.value;
      Advance();
    } else if (IsName("in")) {
      op = "in";
      Advance();
    } else if (IsName("not") && Peek().type == Token::Type::kName && Peek().value == "in") {
      op = "not in";
      Advance();
      Advance();
    } else {
      break;
    }
    auto operand = ParseMath1();
    if (!operand.ok()) return operand.status();
    if (!cmp) {
      cmp = MakeExpr(Expr::Kind::kCompare, pos);
      cmp->children.push_back(std::move(*first));
    }
    cmp->ops.push_back(op);
    cmp->children.push_back(std::move(*operand));
  }
  if (cmp) return cmp;
  return first;
}

absl::StatusOr<ExprPtr> Parser::ParseMath1() {
  return ParseLeftAssoc([this] { return ParseConcat(); }, {"+", "-"});
}

absl::StatusOr<ExprPtr> Parser::ParseConcat() {
  return ParseLeftAssoc([this] { return ParseMath2(); }, {"~"});
}

absl::StatusOr<ExprPtr> Parser::ParseMath2() {
  return ParseLeftAssoc([this] { return ParsePow(); }, {"*", "/", "//", "%"});
}

absl::StatusOr<ExprPtr> Parser::ParsePow() {
  return ParseLeftAssoc([this] { return ParseUnary(/*with_filter=*/true); }, {"**"});
}

absl::StatusOr<ExprPtr> Parser::ParseUnary(bool with_filter) {
  // Every nested operand passes here: bound the recursion.
  if (nesting_ >= kMaxNesting) return Error("expression nested too deeply");
  ++nesting_;
  auto node = ParseUnaryInner(with_filter);
  --nesting_;
  return node;
}

absl::StatusOr<ExprPtr> Parser::ParseUnaryInner(bool with_filter) {
  absl::StatusOr<ExprPtr> node;
  if (IsOp("-") || IsOp("+")) {
    auto e = MakeExpr(Expr::Kind::kUnary, Current().pos);
    e->name = Current().value;
    Advance();
    auto operand = ParseUnary(/*with_filter=*/false);
    if (!operand.ok()) return operand.status();
    e->children.push_back(std::move(*operand));
    node = std::move(e);
  } else {
    node = ParsePrimary();
  }
  if (!node.ok()) return node.status();
  node = ParsePostfix(std::move(*node));
  if (with_filter && node.ok()) node = ParseFilterExpr(std::move(*node));
  return node;
}

absl::StatusOr<ExprPtr> Parser::ParsePrimary() {
  const Token& t = Current();
  auto lit = MakeExpr(Expr::Kind::kLiteral, t.pos);
  switch (t.type) {
    case Token::Type::kName:
      if (t.value == "true" || t.value == "True") {
        lit->literal = Value::Bool(true);
      } else if (t.value == "false" || t.value == "False") {
        lit->literal = Value::Bool(false);
      } else if (t.value == "none" || t.value == "None") {
        lit->literal = Value::None();
      } else {
        lit->kind = Expr::Kind::kName;
        lit->name = t.value;
      }
      Advance();
      return lit;
    case Token::Type::kString: {
      std::string s;
      while (Current().type == Token::Type::kString) {  // adjacent literals concatenate
        s += Current().value;
        Advance();
      }
      lit->literal = Value::String(std::move(s));
      return lit;
    }
    case Token::Type::kInt:
      lit->literal = Value::Int(t.int_value);
      Advance();
      return lit;
    case Token::Type::kFloat:
      lit->literal = Value::Float(t.float_value);
      Advance();
      return lit;
    case Token::Type::kOperator:
      if (t.value == "(") {
        Advance();
        auto e = ParseTuple(/*with_condexpr=*/true, /*explicit_parens=*/true);
        if (!e.ok()) return e.status();
        if (auto st = ExpectOp(")"); !st.ok()) return st;
        return e;
      }
      if (t.value == "[") return ParseList();
      if (t.value == "{") return ParseDict();
      break;
    default:
      break;
  }
  return Error("unexpected " + Describe(t));
}

absl::StatusOr<ExprPtr> Parser::ParseList() {
  auto e = MakeExpr(Expr::Kind::kList, Current().pos);
  Advance();  // [
  while (!IsOp("]")) {
    if (!e->children.empty()) {
      if (auto st = ExpectOp(","); !st.ok()) return st;
      if (IsOp("]")) break;
    }
    auto item = ParseExpression();
    if (!item.ok()) return item.status();
    e->children.push_back(std::move(*item));
  }
  Advance();  // ]
  return e;
}

absl::StatusOr<ExprPtr> Parser::ParseDict() {
  auto e = MakeExpr(Expr::Kind::kDict, Current().pos);
  Advance();  // {
  while (!IsOp("}")) {
    if (!e->children.empty()) {
      if (auto st = ExpectOp(","); !st.ok()) return st;
      if (IsOp("}")) break;
    }
    auto key = ParseExpression();
    if (!key.ok()) return key.status();
    if (auto st = ExpectOp(":"); !st.ok()) return st;
    auto value = ParseExpression();
    if (!value.ok()) return value.status();
    e->children.push_back(std::move(*key));
    e->children.push_back(std::move(*value));
  }
  Advance();  // }
  return e;
}

absl::StatusOr<ExprPtr> Parser::ParsePostfix(ExprPtr node) {
  while (true) {
    absl::StatusOr<ExprPtr> next;
    if (IsOp(".") || IsOp("[")) {
      next = ParseSubscript(std::move(node));
    } else if (IsOp("(")) {
      next = ParseCall(std::move(node));
    } else {
      return node;
    }
    if (!next.ok()) return next.status();
    node = std::move(*next);
  }
}

absl::StatusOr<ExprPtr> Parser::ParseFilterExpr(ExprPtr node) {
  while (true) {
    absl::StatusOr<ExprPtr> next;
    if (IsOp("|")) {
      next = ParseFilter(std::move(node), /*start_inline=*/false);
    } else if (IsName("is")) {
      next = ParseTest(std::move(node));
    } else if (IsOp("(")) {
      next = ParseCall(std::move(node));
    } else {
      return node;
    }
    if (!next.ok()) return next.status();
    node = std::move(*next);
  }
}

absl::StatusOr<ExprPtr> Parser::ParseSubscript(ExprPtr node) {
  const SourcePos pos = Current().pos;
  if (SkipOp(".")) {
    const Token& t = Current();
    if (t.type == Token::Type::kName) {
      auto e = MakeExpr(Expr::Kind::kGetAttr, pos);
      e->name = t.value;
      e->children.push_back(std::move(node));
      Advance();
      return e;
    }
    if (t.type == Token::Type::kInt) {
      auto e = MakeExpr(Expr::Kind::kGetItem, pos);
      auto index = MakeExpr(Expr::Kind::kLiteral, t.pos);
      index->literal = Value::Int(t.int_value);
      e->children.push_back(std::move(node));
      e->children.push_back(std::move(index));
      Advance();
      return e;
    }
    return Error("expected a name or number after '.'");
  }
  Advance();  // [
  ExprList args;
  while (!IsOp("]")) {
    if (!args.empty()) {
      if (auto st = ExpectOp(","); !st.ok()) return st;
    }
    auto arg = ParseSubscribed();
    if (!arg.ok()) return arg.status();
    args.push_back(std::move(*arg));
  }
  Advance();  // ]
  if (args.empty()) return Error("expected a subscript");
  ExprPtr index;
  if (args.size() == 1) {
    index = std::move(args[0]);
  } else {
    index = MakeExpr(Expr::Kind::kTuple, pos);
    index->children = std::move(args);
  }
  if (index->kind == Expr::Kind::kSlice) {  // x[a:b:c]: the slice node takes x as child 0
    index->children.insert(index->children.begin(), std::move(node));
    return index;
  }
  auto e = MakeExpr(Expr::Kind::kGetItem, pos);
  e->children.push_back(std::move(node));
  e->children.push_back(std::move(index));
  return e;
}

absl::StatusOr<ExprPtr> Parser::ParseSubscribed() {
  const SourcePos pos = Current().pos;
  ExprList parts;  // start, stop, step (null when absent)
  if (IsOp(":")) {
    Advance();
    parts.push_back(nullptr);
  } else {
    auto e = ParseExpression();
    if (!e.ok()) return e.status();
    if (!IsOp(":")) return e;
    Advance();
    parts.push_back(std::move(*e));
  }
  auto optional_part = [&]() -> absl::StatusOr<ExprPtr> {
    if (IsOp(":") || IsOp("]") || IsOp(",")) return ExprPtr();
    return ParseExpression();
  };
  auto stop = optional_part();
  if (!stop.ok()) return stop.status();
  parts.push_back(std::move(*stop));
  if (SkipOp(":")) {
    auto step = optional_part();
    if (!step.ok()) return step.status();
    parts.push_back(std::move(*step));
  } else {
    parts.push_back(nullptr);
  }
  auto slice = MakeExpr(Expr::Kind::kSlice, pos);
  slice->children = std::move(parts);
  return slice;
}

absl::StatusOr<ExprPtr> Parser::ParseCall(ExprPtr node) {
  auto call = MakeExpr(Expr::Kind::kCall, Current().pos);
  call->children.push_back(std::move(node));
  if (auto st = ParseCallArgs(call.get()); !st.ok()) return st;
  return call;
}

absl::Status Parser::ParseCallArgs(Expr* call) {
  if (auto st = ExpectOp("("); !st.ok()) return st;
  bool need_comma = false;
  while (!IsOp(")")) {
    if (need_comma) {
      if (auto st = ExpectOp(","); !st.ok()) return st;
      if (IsOp(")")) break;
    }
    if (IsOp("*") || IsOp("**")) return Unsupported("'*args' / '**kwargs' in a call");
    if (Current().type == Token::Type::kName && Peek().type == Token::Type::kOperator &&
        Peek().value == "=") {
      std::string key = Current().value;
      Advance();
      Advance();
      auto value = ParseExpression();
      if (!value.ok()) return value.status();
      call->kwargs.emplace_back(std::move(key), std::move(*value));
    } else {
      if (!call->kwargs.empty()) return Error("positional argument follows keyword argument");
      auto value = ParseExpression();
      if (!value.ok()) return value.status();
      call->children.push_back(std::move(*value));
    }
    need_comma = true;
  }
  Advance();  // )
  return absl::OkStatus();
}

absl::StatusOr<std::string> Parser::ParseDottedName() {
  auto name = ExpectName();
  if (!name.ok()) return name.status();
  std::string full = *name;
  while (IsOp(".") && Peek().type == Token::Type::kName) {
    Advance();
    full += "." + Current().value;
    Advance();
  }
  return full;
}

absl::StatusOr<ExprPtr> Parser::ParseFilter(ExprPtr node, bool start_inline) {
  // start_inline: `{% filter f %}` / `{% set x | f %}` (no leading '|' for the first).
  bool first = true;
  while (IsOp("|") || (start_inline && first)) {
    if (!(start_inline && first)) Advance();  // |
    first = false;
    const SourcePos pos = Current().pos;
    auto name = ParseDottedName();
    if (!name.ok()) return name.status();
    if (!IsKnownFilter(*name)) {
      if (IsJinjaFilter(*name)) {
        return absl::UnimplementedError(
            Cat("chat template ", FormatPos(pos), ": unsupported filter '", *name, "'"));
      }
      return absl::InvalidArgumentError(
          Cat("chat template ", FormatPos(pos), ": no filter named '", *name, "'"));
    }
    auto f = MakeExpr(Expr::Kind::kFilter, pos);
    f->name = *name;
    f->children.push_back(std::move(node));
    if (IsOp("(")) {
      if (auto st = ParseCallArgs(f.get()); !st.ok()) return st;
    }
    node = std::move(f);
  }
  return node;
}

absl::StatusOr<ExprPtr> Parser::ParseTest(ExprPtr node) {
  Advance();  // is
  const bool negated = SkipName("not");
  const SourcePos pos = Current().pos;
  auto name = ParseDottedName();
  if (!name.ok()) return name.status();
  if (!IsKnownTest(*name)) {
    return absl::InvalidArgumentError(
        Cat("chat template ", FormatPos(pos), ": no test named '", *name, "'"));
  }
  auto t = MakeExpr(Expr::Kind::kTest, pos);
  t->name = *name;
  t->negated = negated;
  t->children.push_back(std::move(node));
  if (IsOp("(")) {
    if (auto st = ParseCallArgs(t.get()); !st.ok()) return st;
  } else {
    const Token& c = Current();
    const bool starts_arg = c.type == Token::Type::kName || c.type == Token::Type::kString ||
                            c.type == Token::Type::kInt || c.type == Token::Type::kFloat ||
                            IsOp("(") || IsOp("[") || IsOp("{");
    if (starts_arg && !IsName("else") && !IsName("or") && !IsName("and")) {
      if (IsName("is")) return Error("you cannot chain multiple tests with 'is'");
      auto arg = ParsePrimary();
      if (!arg.ok()) return arg.status();
      auto full = ParsePostfix(std::move(*arg));
      if (!full.ok()) return full.status();
      t->children.push_back(std::move(*full));
    }
  }
  return t;
}

}  // namespace ballast::chat::internal
