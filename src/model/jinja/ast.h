#pragma once
// The syntax tree of a template: expressions and statements as generic nodes whose kind says
// which fields are used. Built by parse() (parser.h), walked by the evaluator.

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "model/jinja/value.h"

namespace crescent::model::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

enum class ExprKind {
  kLiteral,    // value
  kName,       // name
  kList,       // items
  kTuple,      // items (rendered like a list)
  kDict,       // keyword (keys are expressions in items: k0, v0, k1, v1...)
  kAttribute,  // items[0].name
  kSubscript,  // items[0][items[1]]
  kSlice,      // items[0][items[1]:items[2]:items[3]] (null parts absent)
  kCall,       // items[0](items[1:], keyword)
  kFilter,     // name(items[0], items[1:], keyword)
  kTest,       // items[0] is [not] name(items[1:]); negated
  kUnary,      // name in {"-", "+", "not"}, items[0]
  kBinary,     // name is the operator (and, or, ~, +, ...), items[0..1]
  kCompare,    // items[0] op1 keyword[0] op2 keyword[1]...: a chain like a < b <= c
  kCondition,  // items[1] if items[0] else items[2] (items[2] may be null)
};

struct Expr {
  ExprKind kind;
  int line = 0;
  std::string name;
  Value value;
  bool negated = false;
  std::vector<ExprPtr> items;
  std::vector<std::pair<std::string, ExprPtr>> keyword;
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using StmtList = std::vector<StmtPtr>;

enum class StmtKind {
  kText,      // text
  kOutput,    // {{ expr }}
  kIf,        // if expr: body else: else_body (elif is a nested kIf in else_body)
  kFor,       // for targets in expr [if filter]: body else: else_body
  kSet,       // set targets = expr; or set targets[0].attribute = expr
  kSetBlock,  // set targets[0] %}body{% endset
  kMacro,     // macro name(params) body
  kBreak,
  kContinue,
  kBlock,        // a body rendered as is ({% generation %})
  kFilterBlock,  // {% filter f(args) %}body{% endfilter %}: expr is a kFilter on nothing
};

struct MacroParam {
  std::string name;
  ExprPtr default_value;  // null when required
};

struct Stmt {
  StmtKind kind;
  int line = 0;
  std::string text;  // kText: the text; kMacro: the name; kSet: the attribute of a namespace
  ExprPtr expr;
  ExprPtr filter;  // kFor: the optional `if` condition
  std::vector<std::string> targets;
  std::vector<MacroParam> params;
  StmtList body;
  StmtList else_body;
};

}  // namespace crescent::model::jinja
