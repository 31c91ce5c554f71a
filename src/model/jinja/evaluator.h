#pragma once
// Walks a parsed template (ast.h) and writes its output: jinja2's scoping (a for loop's body
// and a macro have their own scope; if does not), the loop variable, break/continue, macros
// and namespace attribute assignment. Errors are jinja::Error; line() tells where.

#include <memory>
#include <string>
#include <vector>

#include "model/jinja/ast.h"

namespace crescent::model::jinja {

class Evaluator {
 public:
  // `variables` are visible everywhere, above the globals.
  explicit Evaluator(ValueDict variables);

  std::string render(const StmtList& body);
  // The template line of the node being evaluated.
  int line() const { return line_; }

 private:
  enum class Flow { kNormal, kBreak, kContinue };

  Flow exec(const StmtList& body, std::string& out);
  Flow exec(const Stmt& s, std::string& out);
  Flow exec_for(const Stmt& s, std::string& out);
  void exec_set(const Stmt& s);
  void define_macro(const Stmt& s);

  Value eval(const Expr& e);
  Value eval_call(const Expr& e);
  CallArgs eval_args(const Expr& e, size_t first);
  Value attribute(const Value& target, const std::string& name);
  Value subscript(const Value& target, const Value& key);
  Value slice(const Value& target, const Expr& e);

  Value lookup(const std::string& name) const;
  void assign(const std::string& name, Value v);

  ValueDict globals_;
  std::vector<std::shared_ptr<ValueDict>> scopes_;
  int line_ = 0;
  int num_macro_frames_ = 0;  // nested macro calls, bounded (a recursive macro may not end)
};

}  // namespace crescent::model::jinja
