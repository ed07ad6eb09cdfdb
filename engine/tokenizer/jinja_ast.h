// The parsed form of a Jinja template (internal to jinja_parse.cc and jinja_eval.cc).
#ifndef TANDEM_ENGINE_TOKENIZER_JINJA_AST_H_
#define TANDEM_ENGINE_TOKENIZER_JINJA_AST_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/tokenizer/jinja.h"

namespace tandem::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Type {
    kLiteral,   // literal
    kName,      // name
    kList,      // children = items
    kTuple,     // children = items
    kDict,      // children = key0, value0, key1, value1, ...
    kGetAttr,   // children[0].name
    kGetItem,   // children[0][children[1]]
    kSlice,     // children[0][children[1]:children[2]:children[3]] (null = omitted)
    kCall,      // children[0](children[1..], kwargs)
    kFilter,    // children[0] | name(children[1..], kwargs)
    kTest,      // children[0] is [not] name(children[1..])
    kUnary,     // name in {"-", "+", "not"}, children[0]
    kBinary,    // children[0] name children[1]: + - * / // % ** ~ and or
    kCompare,   // children[0] ops[0] children[1] ops[1] children[2] ...
    kCondition  // children[0] if children[1] else children[2] (null = undefined)
  };
  Type type;
  int line = 0;
  Value literal;
  std::string name;
  bool negated = false;
  std::vector<ExprPtr> children;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;
};

struct Node;
using NodePtr = std::unique_ptr<Node>;
using Body = std::vector<NodePtr>;

struct Node {
  enum class Type {
    kText,        // text
    kOutput,      // {{ expr }}
    kIf,          // branches: (condition, body); a null condition is `else`
    kFor,         // for targets in expr [if condition]: body [else: else_body]
    kSet,         // set targets (or target_object.attr) = expr
    kSetBlock,    // set targets[0] %}body{% endset (expr: optional filter, applied to body)
    kMacro,       // macro name(params) body
    kCallBlock,   // call[(params)] expr: body is `caller`
    kFilterBlock, // filter: expr is a kFilter chain over a kName "__body__"
    kBreak,
    kContinue,
    kScope        // a block that just renders its body (transformers' {% generation %})
  };
  Type type;
  int line = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr condition;
  std::vector<std::string> targets;
  std::string target_object;  // kSet on a namespace: `set ns.attr = ...` (targets[0] = attr)
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body;
  Body else_body;
  // kMacro / kCallBlock: parameter names and default values (null = required).
  std::vector<std::pair<std::string, ExprPtr>> params;
};

struct Template::Program {
  Body body;
};

// Parses `source` into a Program (jinja_parse.cc).
absl::StatusOr<std::shared_ptr<const Template::Program>> ParseProgram(absl::string_view source);

}  // namespace tandem::jinja

#endif  // TANDEM_ENGINE_TOKENIZER_JINJA_AST_H_
