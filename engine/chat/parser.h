// Parser of the chat-template interpreter: tokens → syntax tree.
//
// Follows Jinja's grammar and operator precedence (jinja2/parser.py):
// conditional expression < or < and < not < comparisons (chained, `in`,
// `not in`) < + - < ~ < * / // % < ** < unary - + < postfix (.attr, [i],
// [a:b:c], calls) and filters/tests (`|f(...)`, `is [not] t`), which bind
// tighter than any binary operator (`xs|length - 1` is `(xs|length) - 1`).
//
// Statements: if/elif/else, for (tuple targets, `if` filter, else), set
// (plain, namespace attribute, block), macro, filter, with, break, continue,
// raw (in the lexer) and HF's generation block. Unknown filters and tests
// fail here, as in Jinja; constructs this interpreter does not implement
// (include, extends, block, import, call, recursive loops, ...) fail with
// UNIMPLEMENTED naming the construct and its line:column.
//
// Thread-safety: Parse is a pure function.
#pragma once

#include <initializer_list>
#include <string_view>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "engine/chat/ast.h"
#include "engine/chat/lexer.h"

namespace ballast::chat {

absl::StatusOr<StmtList> Parse(std::vector<Token> tokens);

namespace internal {

// The parser's state (internal: use Parse()); the statement rules live in
// parser.cc, the expression rules in expr_parser.cc.
class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  absl::StatusOr<StmtList> ParseTemplate();

  // --- statements (parser.cc)
  // Parses statements until a block tag named in `end_tags`; returns the
  // tag's name in *end (the tag's name token is consumed, not its `%}`).
  absl::StatusOr<StmtList> ParseBody(const std::vector<std::string_view>& end_tags,
                                     std::string* end);
  absl::StatusOr<StmtPtr> ParseStatement();
  absl::StatusOr<StmtPtr> ParseTag();
  absl::StatusOr<StmtPtr> ParseIf(SourcePos pos);
  absl::StatusOr<StmtPtr> ParseFor(SourcePos pos);
  absl::StatusOr<StmtPtr> ParseSet(SourcePos pos);
  absl::StatusOr<StmtPtr> ParseMacro(SourcePos pos);
  absl::StatusOr<StmtPtr> ParseFilterBlock(SourcePos pos);
  absl::StatusOr<StmtPtr> ParseWith(SourcePos pos);
  absl::StatusOr<StmtPtr> ParseSimpleBlock(SourcePos pos, Stmt::Kind kind,
                                           std::string_view end_tag);
  absl::StatusOr<Target> ParseTarget(bool with_namespace);
  absl::Status ExpectBlockEnd();

  // --- expressions (expr_parser.cc)
  // A tuple without parentheses (`a, b`) or one expression.
  absl::StatusOr<ExprPtr> ParseTuple(bool with_condexpr = true, bool explicit_parens = false);
  absl::StatusOr<ExprPtr> ParseExpression(bool with_condexpr = true);
  absl::StatusOr<ExprPtr> ParseCondExpr();
  absl::StatusOr<ExprPtr> ParseOr();
  absl::StatusOr<ExprPtr> ParseAnd();
  absl::StatusOr<ExprPtr> ParseNot();
  absl::StatusOr<ExprPtr> ParseCompare();
  absl::StatusOr<ExprPtr> ParseMath1();
  absl::StatusOr<ExprPtr> ParseConcat();
  absl::StatusOr<ExprPtr> ParseMath2();
  absl::StatusOr<ExprPtr> ParsePow();
  // One left-associative level: operands from `next` joined by any of
  // `ops`, operator tokens or (`keywords`) names such as "and".
  absl::StatusOr<ExprPtr> ParseLeftAssoc(absl::FunctionRef<absl::StatusOr<ExprPtr>()> next,
                                         std::initializer_list<std::string_view> ops,
                                         bool keywords = false);
  absl::StatusOr<ExprPtr> ParseUnary(bool with_filter);
  absl::StatusOr<ExprPtr> ParseUnaryInner(bool with_filter);
  absl::StatusOr<ExprPtr> ParsePrimary();
  absl::StatusOr<ExprPtr> ParseList();
  absl::StatusOr<ExprPtr> ParseDict();
  absl::StatusOr<ExprPtr> ParsePostfix(ExprPtr node);
  absl::StatusOr<ExprPtr> ParseFilterExpr(ExprPtr node);
  absl::StatusOr<ExprPtr> ParseSubscript(ExprPtr node);
  absl::StatusOr<ExprPtr> ParseSubscribed();
  absl::StatusOr<ExprPtr> ParseCall(ExprPtr node);
  absl::StatusOr<ExprPtr> ParseFilter(ExprPtr node, bool start_inline);
  absl::StatusOr<ExprPtr> ParseTest(ExprPtr node);
  absl::Status ParseCallArgs(Expr* call);
  absl::StatusOr<std::string> ParseDottedName();

  // --- token helpers
  const Token& Current() const { return tokens_[pos_]; }
  const Token& Peek(size_t ahead = 1) const {
    return tokens_[std::min(pos_ + ahead, tokens_.size() - 1)];
  }
  void Advance() {
    if (pos_ + 1 < tokens_.size()) ++pos_;
  }
  bool IsOp(std::string_view op) const {
    return Current().type == Token::Type::kOperator && Current().value == op;
  }
  bool IsName(std::string_view name) const {
    return Current().type == Token::Type::kName && Current().value == name;
  }
  bool SkipOp(std::string_view op) {
    if (!IsOp(op)) return false;
    Advance();
    return true;
  }
  bool SkipName(std::string_view name) {
    if (!IsName(name)) return false;
    Advance();
    return true;
  }
  absl::Status ExpectOp(std::string_view op);
  absl::StatusOr<std::string> ExpectName();
  // An error at the current token ("chat template L:C: message").
  absl::Status Error(std::string_view message) const;
  absl::Status Unsupported(std::string_view what) const;
  std::string Describe(const Token& t) const;

 private:
  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int loop_depth_ = 0;
  // Nesting of expressions and of blocks, bounded (far beyond real templates)
  // so that a hostile template cannot exhaust the stack.
  static constexpr int kMaxNesting = 200;
  int nesting_ = 0;
};

}  // namespace internal
}  // namespace ballast::chat
