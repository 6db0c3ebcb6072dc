#include "engine/chat/parser.h"

#include <algorithm>

#include "absl/status/status.h"

namespace ballast::chat {
namespace internal {
namespace {

// Jinja statements this interpreter does not implement; they fail with
// UNIMPLEMENTED rather than as unknown tags.
constexpr std::string_view kUnsupportedTags[] = {
    "include", "import", "from",       "extends",    "block",     "call",
    "do",      "trans",  "macro_call", "autoescape", "pluralize",
};

StmtPtr MakeStmt(Stmt::Kind kind, SourcePos pos) {
  auto s = std::make_unique<Stmt>();
  s->kind = kind;
  s->pos = pos;
  return s;
}

bool Contains(const std::vector<std::string_view>& v, std::string_view s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

}  // namespace

absl::Status Parser::Error(std::string_view message) const {
  return absl::InvalidArgumentError(Cat("chat template ", FormatPos(Current().pos), ": ", message));
}

absl::Status Parser::Unsupported(std::string_view what) const {
  return absl::UnimplementedError(
      Cat("chat template ", FormatPos(Current().pos), ": unsupported ", what));
}

std::string Parser::Describe(const Token& t) const {
  switch (t.type) {
    case Token::Type::kText:
      return "template text";
    case Token::Type::kVarBegin:
      return "'{{'";
    case Token::Type::kVarEnd:
      return "'}}'";
    case Token::Type::kBlockBegin:
      return "'{%'";
    case Token::Type::kBlockEnd:
      return "'%}'";
    case Token::Type::kString:
      return "string literal";
    case Token::Type::kEnd:
      return "end of template";
    default:
      return "'" + t.value + "'";
  }
}

absl::Status Parser::ExpectOp(std::string_view op) {
  if (SkipOp(op)) return absl::OkStatus();
  return Error(Cat("expected '", op, "', got ", Describe(Current())));
}

absl::StatusOr<std::string> Parser::ExpectName() {
  if (Current().type != Token::Type::kName) {
    return Error(Cat("expected a name, got ", Describe(Current())));
  }
  std::string name = Current().value;
  Advance();
  return name;
}

absl::Status Parser::ExpectBlockEnd() {
  if (Current().type == Token::Type::kBlockEnd) {
    Advance();
    return absl::OkStatus();
  }
  return Error(Cat("expected '%}', got ", Describe(Current())));
}

absl::StatusOr<StmtList> Parser::ParseTemplate() {
  std::string end;
  auto body = ParseBody({}, &end);
  if (!body.ok()) return body.status();
  if (Current().type != Token::Type::kEnd) return Error("unexpected " + Describe(Current()));
  return body;
}

absl::StatusOr<StmtList> Parser::ParseBody(const std::vector<std::string_view>& end_tags,
                                           std::string* end) {
  StmtList body;
  while (true) {
    const Token& t = Current();
    if (t.type == Token::Type::kEnd) {
      if (end_tags.empty()) return body;
      return Error(Cat("unexpected end of template: expected '{% ", end_tags.back(), " %}'"));
    }
    if (t.type == Token::Type::kText) {
      auto s = MakeStmt(Stmt::Kind::kText, t.pos);
      s->text = t.value;
      body.push_back(std::move(s));
      Advance();
    } else if (t.type == Token::Type::kVarBegin) {
      auto s = MakeStmt(Stmt::Kind::kOutput, t.pos);
      Advance();
      auto e = ParseTuple();
      if (!e.ok()) return e.status();
      s->expr = std::move(*e);
      if (Current().type != Token::Type::kVarEnd) {
        return Error(Cat("expected '}}', got ", Describe(Current())));
      }
      Advance();
      body.push_back(std::move(s));
    } else if (t.type == Token::Type::kBlockBegin) {
      const Token& name = Peek();
      if (name.type == Token::Type::kName && Contains(end_tags, name.value)) {
        Advance();
        *end = name.value;
        Advance();
        return body;
      }
      auto s = ParseStatement();
      if (!s.ok()) return s.status();
      body.push_back(std::move(*s));
    } else {
      return Error("unexpected " + Describe(t));
    }
  }
}

absl::StatusOr<StmtPtr> Parser::ParseStatement() {
  if (nesting_ >= kMaxNesting) return Error("blocks nested too deeply");
  ++nesting_;
  auto stmt = ParseTag();
  --nesting_;
  return stmt;
}

absl::StatusOr<StmtPtr> Parser::ParseTag() {
  Advance();  // {%
  const Token& t = Current();
  if (t.type != Token::Type::kName) return Error("expected a tag name, got " + Describe(t));
  const std::string tag = t.value;
  const SourcePos pos = t.pos;
  for (std::string_view u : kUnsupportedTags) {
    if (tag == u) return Unsupported(Cat("tag '{% ", tag, " %}'"));
  }
  Advance();
  if (tag == "if") return ParseIf(pos);
  if (tag == "for") return ParseFor(pos);
  if (tag == "set") return ParseSet(pos);
  if (tag == "macro") return ParseMacro(pos);
  if (tag == "filter") return ParseFilterBlock(pos);
  if (tag == "with") return ParseWith(pos);
  if (tag == "generation") return ParseSimpleBlock(pos, Stmt::Kind::kGeneration, "endgeneration");
  if (tag == "break" || tag == "continue") {
    if (loop_depth_ == 0) {
      return absl::InvalidArgumentError(
          Cat("chat template ", FormatPos(pos), ": '", tag, "' outside a loop"));
    }
    if (auto st = ExpectBlockEnd(); !st.ok()) return st;
    return MakeStmt(tag == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue, pos);
  }
  const bool stray_end = tag.rfind("end", 0) == 0 || tag == "else" || tag == "elif";
  return absl::InvalidArgumentError(Cat("chat template ", FormatPos(pos),
                                        stray_end ? ": unexpected tag '" : ": unknown tag '", tag,
                                        "'"));
}

absl::StatusOr<StmtPtr> Parser::ParseIf(SourcePos pos) {
  auto s = MakeStmt(Stmt::Kind::kIf, pos);
  auto cond = ParseTuple(/*with_condexpr=*/false);
  if (!cond.ok()) return cond.status();
  s->expr = std::move(*cond);
  if (auto st = ExpectBlockEnd(); !st.ok()) return st;
  std::string end;
  auto body = ParseBody({"elif", "else", "endif"}, &end);
  if (!body.ok()) return body.status();
  s->body = std::move(*body);
  if (end == "elif") {
    auto elif = ParseIf(Current().pos);
    if (!elif.ok()) return elif.status();
    s->else_body.push_back(std::move(*elif));
    return s;
  }
  if (end == "else") {
    if (auto st = ExpectBlockEnd(); !st.ok()) return st;
    auto else_body = ParseBody({"endif"}, &end);
    if (!else_body.ok()) return else_body.status();
    s->else_body = std::move(*else_body);
  }
  if (auto st = ExpectBlockEnd(); !st.ok()) return st;
  return s;
}

absl::StatusOr<StmtPtr> Parser::ParseFor(SourcePos pos) {
  auto s = MakeStmt(Stmt::Kind::kFor, pos);
  auto target = ParseTarget(/*with_namespace=*/false);
  if (!target.ok()) return target.status();
  s->target = std::move(*target);
  if (!SkipName("in")) return Error("expected 'in', got " + Describe(Current()));
  auto iter = ParseTuple(/*with_condexpr=*/false);
  if (!iter.ok()) return iter.status();
  s->expr = std::move(*iter);
  if (SkipName("if")) {
    auto cond = ParseExpression();
    if (!cond.ok()) return cond.status();
    s->condition = std::move(*cond);
  }
  if (IsName("recursive")) return Unsupported("recursive for loop");
  if (auto st = ExpectBlockEnd(); !st.ok()) return st;
  ++loop_depth_;
  std::string end;
  auto body = ParseBody({"else", "endfor"}, &end);
  --loop_depth_;
  if (!body.ok()) return body.status();
  s->body = std::move(*body);
  if (end == "else") {
    if (auto st = ExpectBlockEnd(); !st.ok()) return st;
    auto else_body = ParseBody({"endfor"}, &end);
    if (!else_body.ok()) return else_body.status();
    s->else_body = std::move(*else_body);
  }
  if (auto st = ExpectBlockEnd(); !st.ok()) return st;
  return s;
}

absl::StatusOr<Target> Parser::ParseTarget(bool with_namespace) {
  Target target;
  if (with_namespace && Current().type == Token::Type::kName &&
      Peek().type == Token::Type::kOperator && Peek().value == ".") {
    target.names.push_back(Current().value);
    Advance();
    Advance();
    auto attr = ExpectName();
    if (!attr.ok()) return attr.status();
    target.ns_attr = *attr;
    return target;
  }
  const bool parens = SkipOp("(");
  while (true) {
    if (IsOp("(")) return Unsupported("nested unpacking target");
    auto name = ExpectName();
    if (!name.ok()) return name.status();
    target.names.push_back(*name);
    if (!SkipOp(",")) break;
    target.unpack = true;
    if (parens && IsOp(")")) break;
    if (IsName("in") || IsOp("=")) break;
  }
  if (parens) {
    if (auto st = ExpectOp(")"); !st.ok()) return st;
  }
  return target;
}

absl::StatusOr<StmtPtr> Parser::ParseSet(SourcePos pos) {
  auto target = ParseTarget(/*with_namespace=*/true);
  if (!target.ok()) return target.status();
  if (SkipOp("=")) {
    auto s = MakeStmt(Stmt::Kind::kSet, pos);
    s->target = std::move(*target);
    auto value = ParseTuple();
    if (!value.ok()) return value.status();
    s->expr = std::move(*value);
    if (auto st = ExpectBlockEnd(); !st.ok()) return st;
    return s;
  }
  auto s = MakeStmt(Stmt::Kind::kSetBlock, pos);
  s->target = std::move(*target);
  if (!s->target.ns_attr.empty() || s->target.unpack) return Error("a block set takes one name");
  if (IsOp("|")) {
    auto filter = ParseFilter(nullptr, /*start_inline=*/false);
    if (!filter.ok()) return filter.status();
    s->expr = std::move(*filter);
  }
  if (auto st = ExpectBlockEnd(); !st.ok()) return st;
  std::string end;
  auto body = ParseBody({"endset"}, &end);
  if (!body.ok()) return body.status();
  s->body = std::move(*body);
  if (auto st = ExpectBlockEnd(); !st.ok()) return st;
  return s;
}

absl::StatusOr<StmtPtr> Parser::ParseMacro(SourcePos pos) {
  auto s = MakeStmt(Stmt::Kind::kMacro, pos);
  auto name = ExpectName();
  if (!name.ok()) return name.status();
  s->name = *name;
  if (auto st = ExpectOp("("); !st.ok()) return st;
  while (!IsOp(")")) {
    if (!s->params.empty()) {
      if (auto st = ExpectOp(","); !st.ok()) return st;
      if (IsOp(")")) break;
    }
    MacroParam param;
    auto pname = ExpectName();
    if (!pname.ok()) return pname.status();
    param.name = *pname;
    if (SkipOp("=")) {
      auto def = ParseExpression();
      if (!def.ok()) return def.status();
      param.default_value = std::move(*def);
    } else if (!s->params.empty() && s->params.back().default_value) {
      return Error("non-default macro argument follows a default argument");
    }
    s->params.push_back(std::move(param));
  }
  Advance();  // )
  if (auto st = ExpectBlockEnd(); !st.ok()) return st;
  const int saved_depth = loop_depth_;
  loop_depth_ = 0;
  std::string end;
  auto body = ParseBody({"endmacro"}, &end);
  loop_depth_ = saved_depth;
  if (!body.ok()) return body.status();
  s->body = std::move(*body);
  if (Current().type == Token::Type::kName) Advance();  // {% endmacro name %}
  if (auto st = ExpectBlockEnd(); !st.ok()) return st;
  return s;
}

absl::StatusOr<StmtPtr> Parser::ParseFilterBlock(SourcePos pos) {
  auto s = MakeStmt(Stmt::Kind::kFilterBlock, pos);
  auto filter = ParseFilter(nullptr, /*start_inline=*/true);
  if (!filter.ok()) return filter.status();
  s->expr = std::move(*filter);
  if (auto st = ExpectBlockEnd(); !st.ok()) return st;
  std::string end;
  auto body = ParseBody({"endfilter"}, &end);
  if (!body.ok()) return body.status();
  s->body = std::move(*body);
  if (auto st = ExpectBlockEnd(); !st.ok()) return st;
  return s;
}

absl::StatusOr<StmtPtr> Parser::ParseWith(SourcePos pos) {
  auto s = MakeStmt(Stmt::Kind::kWith, pos);
  while (Current().type != Token::Type::kBlockEnd) {
    if (!s->with_targets.empty()) {
      if (auto st = ExpectOp(","); !st.ok()) return st;
    }
    auto target = ParseTarget(/*with_namespace=*/false);
    if (!target.ok()) return target.status();
    if (auto st = ExpectOp("="); !st.ok()) return st;
    auto value = ParseExpression();
    if (!value.ok()) return value.status();
    s->with_targets.push_back(std::move(*target));
    s->with_values.push_back(std::move(*value));
  }
  Advance();
  std::string end;
  auto body = ParseBody({"endwith"}, &end);
  if (!body.ok()) return body.status();
  s->body = std::move(*body);
  if (auto st = ExpectBlockEnd(); !st.ok()) return st;
  return s;
}

absl::StatusOr<StmtPtr> Parser::ParseSimpleBlock(SourcePos pos, Stmt::Kind kind,
                                                 std::string_view end_tag) {
  auto s = MakeStmt(kind, pos);
  if (auto st = ExpectBlockEnd(); !st.ok()) return st;
  std::string end;
  auto body = ParseBody({end_tag}, &end);
  if (!body.ok()) return body.status();
  s->body = std::move(*body);
  if (auto st = ExpectBlockEnd(); !st.ok()) return st;
  return s;
}

}  // namespace internal

absl::StatusOr<StmtList> Parse(std::vector<Token> tokens) {
  return internal::Parser(std::move(tokens)).ParseTemplate();
}

}  // namespace ballast::chat
