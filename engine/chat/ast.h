// Syntax tree of a parsed chat template.
//
// Expressions and statements are plain structs with a kind tag; the parser
// builds them once and the evaluator only reads them, so one tree serves
// any number of concurrent renders.
//
// Thread-safety: immutable after parsing.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/chat/lexer.h"
#include "engine/chat/value.h"

namespace ballast::chat {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;
using ExprList = std::vector<ExprPtr>;

struct Expr {
  enum class Kind {
    kLiteral,    // value
    kName,       // name
    kList,       // children
    kTuple,      // children
    kDict,       // children: key0, value0, key1, value1, ...
    kGetAttr,    // children[0].name
    kGetItem,    // children[0][children[1]]
    kSlice,      // children[0][c1:c2:c3]; an absent bound is a null child
    kCall,       // children[0](children[1..], kwargs)
    kFilter,     // children[0] | name(children[1..], kwargs)
    kTest,       // children[0] is [not] name(children[1..], kwargs)
    kUnary,      // name ("not", "-", "+") children[0]
    kBinary,     // children[0] name children[1]: + - * / // % ** ~ and or
    kCompare,    // children[0] ops[0] children[1] ops[1] children[2] ... (Python chaining)
    kCondition,  // children[1] if children[0] else children[2] (null: undefined)
  };
  Kind kind;
  SourcePos pos;
  Value literal;
  std::string name;
  bool negated = false;  // kTest: `is not`
  ExprList children;
  std::vector<std::string> ops;  // kCompare: ==, !=, <, <=, >, >=, in, not in
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using StmtList = std::vector<StmtPtr>;

// The left side of `set` or a `for` target: names (several for unpacking)
// or one namespace attribute (`ns.attr`).
struct Target {
  std::vector<std::string> names;
  bool unpack = false;  // `a, b` (a tuple, even with one name)
  std::string ns_attr;  // `names[0].ns_attr` when set
};

struct MacroParam {
  std::string name;
  ExprPtr default_value;  // may be null
};

struct Stmt {
  enum class Kind {
    kText,         // text
    kOutput,       // {{ expr }}
    kIf,           // if expr: body else else_body (elif nests in else_body)
    kFor,          // for target in expr [if condition]: body else else_body
    kSet,          // set target = expr
    kSetBlock,     // set target: body, optional filter chain in expr (a kFilter on a null child)
    kMacro,        // macro name(params): body
    kFilterBlock,  // filter expr: body
    kWith,         // with assignments (targets/values): body
    kBreak,
    kContinue,
    kGeneration,  // {% generation %}: body (HF's assistant-mask extension, rendered as is)
  };
  Kind kind;
  SourcePos pos;
  std::string text;
  ExprPtr expr;
  ExprPtr condition;  // kFor: the loop filter
  Target target;
  std::string name;                  // kMacro
  std::vector<MacroParam> params;    // kMacro
  std::vector<Target> with_targets;  // kWith
  ExprList with_values;              // kWith
  StmtList body;
  StmtList else_body;
};

}  // namespace ballast::chat
