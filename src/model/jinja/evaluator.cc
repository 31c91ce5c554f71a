#include "model/jinja/evaluator.h"

#include "model/jinja/builtins.h"
#include "model/jinja/filters.h"
#include "model/jinja/strings.h"

namespace crescent::model::jinja {
namespace {

// Deeper macro recursion than any real template needs; beyond it a runaway recursion fails
// cleanly instead of exhausting the thread's stack.
constexpr int kMaxMacroFrames = 100;

// Python's slice indices for a sequence of `n` elements.
std::vector<size_t> slice_indices(int64_t n, const Value& start_v, const Value& stop_v,
                                  const Value& step_v) {
  const int64_t step = step_v.is_number() ? step_v.as_int() : 1;
  if (step == 0) {
    fail("slice step cannot be zero");
  }
  auto clamp = [&](const Value& v, int64_t fallback) {
    if (!v.is_number()) {
      return fallback;
    }
    int64_t i = v.as_int();
    if (i < 0) {
      i += n;
      if (i < 0) {
        i = step > 0 ? 0 : -1;
      }
    } else if (i >= n) {
      i = step > 0 ? n : n - 1;
    }
    return i;
  };
  const int64_t start = clamp(start_v, step > 0 ? 0 : n - 1);
  const int64_t stop = clamp(stop_v, step > 0 ? n : -1);
  std::vector<size_t> out;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    out.push_back(static_cast<size_t>(i));
  }
  return out;
}

bool compare(const std::string& op, const Value& a, const Value& b) {
  if (op == "==") {
    return a == b;
  }
  if (op == "!=") {
    return a != b;
  }
  if (op == "<") {
    return less_than(a, b);
  }
  if (op == ">") {
    return less_than(b, a);
  }
  if (op == "<=") {
    return !less_than(b, a);
  }
  if (op == ">=") {
    return !less_than(a, b);
  }
  if (op == "in") {
    return contains(b, a);
  }
  return !contains(b, a);  // not in
}

}  // namespace

Evaluator::Evaluator(ValueDict variables) : globals_(make_globals()) {
  scopes_.push_back(std::make_shared<ValueDict>(std::move(variables)));
}

std::string Evaluator::render(const StmtList& body) {
  std::string out;
  exec(body, out);
  return out;
}

Evaluator::Flow Evaluator::exec(const StmtList& body, std::string& out) {
  for (const StmtPtr& s : body) {
    const Flow flow = exec(*s, out);
    if (flow != Flow::kNormal) {
      return flow;
    }
  }
  return Flow::kNormal;
}

Evaluator::Flow Evaluator::exec(const Stmt& s, std::string& out) {
  line_ = s.line;
  switch (s.kind) {
    case StmtKind::kText:
      out += s.text;
      return Flow::kNormal;
    case StmtKind::kOutput:
      out += eval(*s.expr).str();
      return Flow::kNormal;
    case StmtKind::kIf:
      return exec(eval(*s.expr).truthy() ? s.body : s.else_body, out);
    case StmtKind::kFor:
      return exec_for(s, out);
    case StmtKind::kSet:
      exec_set(s);
      return Flow::kNormal;
    case StmtKind::kSetBlock: {
      std::string text;
      exec(s.body, text);
      assign(s.targets[0], Value::string(std::move(text)));
      return Flow::kNormal;
    }
    case StmtKind::kMacro:
      define_macro(s);
      return Flow::kNormal;
    case StmtKind::kBreak:
      return Flow::kBreak;
    case StmtKind::kContinue:
      return Flow::kContinue;
    case StmtKind::kBlock:
      return exec(s.body, out);
    case StmtKind::kFilterBlock: {
      std::string text;
      exec(s.body, text);
      out +=
          apply_filter(s.expr->name, Value::string(std::move(text)), eval_args(*s.expr, 1)).str();
      return Flow::kNormal;
    }
  }
  return Flow::kNormal;
}

Evaluator::Flow Evaluator::exec_for(const Stmt& s, std::string& out) {
  const Value iterable = eval(*s.expr);
  if (iterable.is_dict() && iterable.is_namespace()) {
    fail("a namespace is not iterable");
  }
  ValueList items = iterable.iterate();
  // Unpacks `k, v` targets from a pair.
  auto bind = [&](ValueDict& scope, const Value& item) {
    if (s.targets.size() == 1) {
      scope.set(s.targets[0], item);
      return;
    }
    const ValueList parts = item.iterate();
    if (parts.size() != s.targets.size()) {
      fail("cannot unpack " + item.repr() + " into " + std::to_string(s.targets.size()) + " names");
    }
    for (size_t i = 0; i < parts.size(); ++i) {
      scope.set(s.targets[i], parts[i]);
    }
  };
  if (s.filter) {
    ValueList kept;
    for (const Value& item : items) {
      scopes_.push_back(std::make_shared<ValueDict>());
      bind(*scopes_.back(), item);
      const bool keep = eval(*s.filter).truthy();
      scopes_.pop_back();
      if (keep) {
        kept.push_back(item);
      }
    }
    items = std::move(kept);
  }
  if (items.empty()) {
    return exec(s.else_body, out);
  }
  const auto n = static_cast<int64_t>(items.size());
  for (int64_t i = 0; i < n; ++i) {
    auto scope = std::make_shared<ValueDict>();
    bind(*scope, items[static_cast<size_t>(i)]);
    ValueDict loop;
    loop.set("index", Value::integer(i + 1));
    loop.set("index0", Value::integer(i));
    loop.set("revindex", Value::integer(n - i));
    loop.set("revindex0", Value::integer(n - i - 1));
    loop.set("first", Value::boolean(i == 0));
    loop.set("last", Value::boolean(i == n - 1));
    loop.set("length", Value::integer(n));
    loop.set("depth", Value::integer(1));
    loop.set("depth0", Value::integer(0));
    loop.set("previtem", i > 0 ? items[static_cast<size_t>(i - 1)]
                               : Value::undefined("there is no previous item"));
    loop.set("nextitem", i + 1 < n ? items[static_cast<size_t>(i + 1)]
                                   : Value::undefined("there is no next item"));
    loop.set("cycle", Value::function("cycle", [i](const CallArgs& args) {
               if (args.positional.empty()) {
                 fail("no items for cycling given");
               }
               return args.positional[static_cast<size_t>(i) % args.positional.size()];
             }));
    scope->set("loop", Value::dict(std::move(loop)));
    scopes_.push_back(std::move(scope));
    const Flow flow = exec(s.body, out);
    scopes_.pop_back();
    if (flow == Flow::kBreak) {
      break;
    }
  }
  return Flow::kNormal;
}

void Evaluator::exec_set(const Stmt& s) {
  Value v = eval(*s.expr);
  if (!s.text.empty()) {
    const Value target = lookup(s.targets[0]);
    if (!target.is_namespace()) {
      fail("cannot assign attribute on non-namespace object");
    }
    target.as_dict().set(s.text, std::move(v));
    return;
  }
  if (s.targets.size() == 1) {
    assign(s.targets[0], std::move(v));
    return;
  }
  const ValueList parts = v.iterate();
  if (parts.size() != s.targets.size()) {
    fail("cannot unpack " + v.repr() + " into " + std::to_string(s.targets.size()) + " names");
  }
  for (size_t i = 0; i < parts.size(); ++i) {
    assign(s.targets[i], parts[i]);
  }
}

void Evaluator::define_macro(const Stmt& s) {
  const Stmt* macro = &s;
  assign(s.text, Value::function(s.text, [this, macro](const CallArgs& args) {
           if (num_macro_frames_ >= kMaxMacroFrames) {
             fail("maximum recursion depth exceeded in macro '" + macro->text + "'");
           }
           auto scope = std::make_shared<ValueDict>();
           for (size_t i = 0; i < macro->params.size(); ++i) {
             const MacroParam& p = macro->params[i];
             const Value* given = args.get(i, p.name);
             if (given) {
               scope->set(p.name, *given);
             } else if (p.default_value) {
               scope->set(p.name, eval(*p.default_value));
             } else {
               scope->set(p.name, Value::undefined("parameter '" + p.name + "' was not provided"));
             }
           }
           std::vector<std::shared_ptr<ValueDict>> saved = {scopes_[0], std::move(scope)};
           std::swap(saved, scopes_);
           const int saved_line = line_;
           std::string out;
           ++num_macro_frames_;
           try {
             exec(macro->body, out);
           } catch (...) {
             --num_macro_frames_;
             std::swap(saved, scopes_);
             throw;
           }
           --num_macro_frames_;
           std::swap(saved, scopes_);
           line_ = saved_line;
           return Value::string(std::move(out));
         }));
}

Value Evaluator::lookup(const std::string& name) const {
  for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
    if (const Value* v = (*it)->find(name)) {
      return *v;
    }
  }
  if (const Value* v = globals_.find(name)) {
    return *v;
  }
  return Value::undefined("'" + name + "' is undefined");
}

void Evaluator::assign(const std::string& name, Value v) {
  scopes_.back()->set(name, std::move(v));
}

Value Evaluator::attribute(const Value& target, const std::string& name) {
  if (target.is_undefined()) {
    fail(target.undefined_reason());
  }
  if (target.is_dict()) {
    if (const Value* v = target.as_dict().find(name)) {
      if (!has_method(target, name)) {
        return *v;
      }
    }
  }
  if (has_method(target, name)) {
    Value self = target;
    return Value::function(
        name, [self, name](const CallArgs& args) { return call_method(self, name, args); });
  }
  std::string what = "'";
  what += target.is_dict() ? std::string("dict object") : target.repr();
  what += "' has no attribute '";
  what += name;
  what += "'";
  return Value::undefined(std::move(what));
}

Value Evaluator::subscript(const Value& target, const Value& key) {
  if (target.is_undefined()) {
    fail(target.undefined_reason());
  }
  if (target.is_dict() && key.is_string()) {
    if (const Value* v = target.as_dict().find(key.as_string())) {
      return *v;
    }
    return Value::undefined("'dict object' has no attribute '" + key.as_string() + "'");
  }
  if ((target.is_list() || target.is_string()) && key.is_number() && !key.is_float()) {
    const ValueList items = target.is_list() ? ValueList() : target.iterate();
    const ValueList& seq = target.is_list() ? target.as_list() : items;
    int64_t i = key.as_int();
    const auto n = static_cast<int64_t>(seq.size());
    if (i < 0) {
      i += n;
    }
    if (i < 0 || i >= n) {
      return Value::undefined("index " + std::to_string(key.as_int()) + " is out of range");
    }
    return seq[static_cast<size_t>(i)];
  }
  if (key.is_string()) {
    return attribute(target, key.as_string());
  }
  return Value::undefined(target.repr() + " has no item " + key.repr());
}

Value Evaluator::slice(const Value& target, const Expr& e) {
  Value parts[3];
  for (size_t i = 0; i < 3; ++i) {
    if (e.items[i + 1]) {
      parts[i] = eval(*e.items[i + 1]);
    }
  }
  if (!target.is_list() && !target.is_string()) {
    fail(target.repr() + " cannot be sliced");
  }
  const ValueList items = target.iterate();
  ValueList out;
  for (size_t i : slice_indices(static_cast<int64_t>(items.size()), parts[0], parts[1], parts[2])) {
    out.push_back(items[i]);
  }
  if (target.is_string()) {
    std::string s;
    for (const Value& c : out) {
      s += c.as_string();
    }
    return Value::string(std::move(s));
  }
  return Value::list(std::move(out));
}

CallArgs Evaluator::eval_args(const Expr& e, size_t first) {
  CallArgs args;
  for (size_t i = first; i < e.items.size(); ++i) {
    args.positional.push_back(eval(*e.items[i]));
  }
  for (const auto& [name, value] : e.keyword) {
    args.keyword.emplace_back(name, eval(*value));
  }
  return args;
}

Value Evaluator::eval_call(const Expr& e) {
  const Expr& callee = *e.items[0];
  if (callee.kind == ExprKind::kAttribute) {
    const Value target = eval(*callee.items[0]);
    if (has_method(target, callee.name)) {
      return call_method(target, callee.name, eval_args(e, 1));
    }
  }
  const Value f = eval(callee);
  if (!f.is_function()) {
    fail(f.is_undefined() ? f.undefined_reason() : f.repr() + " is not callable");
  }
  return f.as_function()(eval_args(e, 1));
}

Value Evaluator::eval(const Expr& e) {
  line_ = e.line;
  switch (e.kind) {
    case ExprKind::kLiteral:
      return e.value;
    case ExprKind::kName:
      return lookup(e.name);
    case ExprKind::kList:
    case ExprKind::kTuple: {
      ValueList items;
      for (const ExprPtr& item : e.items) {
        items.push_back(eval(*item));
      }
      return e.kind == ExprKind::kTuple ? Value::tuple(std::move(items))
                                        : Value::list(std::move(items));
    }
    case ExprKind::kDict: {
      ValueDict d;
      for (size_t i = 0; i + 1 < e.items.size(); i += 2) {
        d.set(eval(*e.items[i]).str(), eval(*e.items[i + 1]));
      }
      return Value::dict(std::move(d));
    }
    case ExprKind::kAttribute:
      return attribute(eval(*e.items[0]), e.name);
    case ExprKind::kSubscript: {
      const Value target = eval(*e.items[0]);
      return subscript(target, eval(*e.items[1]));
    }
    case ExprKind::kSlice:
      return slice(eval(*e.items[0]), e);
    case ExprKind::kCall:
      return eval_call(e);
    case ExprKind::kFilter: {
      const Value target = eval(*e.items[0]);
      return apply_filter(e.name, target, eval_args(e, 1));
    }
    case ExprKind::kTest: {
      const Value target = eval(*e.items[0]);
      return Value::boolean(apply_test(e.name, target, eval_args(e, 1)) != e.negated);
    }
    case ExprKind::kUnary: {
      const Value v = eval(*e.items[0]);
      if (e.name == "not") {
        return Value::boolean(!v.truthy());
      }
      if (!v.is_number()) {
        fail("bad operand type for unary " + e.name + ": " + v.repr());
      }
      if (e.name == "+") {
        return v.is_float() ? v : Value::integer(v.as_int());
      }
      return v.is_float() ? Value::number(-v.as_float()) : Value::integer(-v.as_int());
    }
    case ExprKind::kCondition: {
      if (eval(*e.items[0]).truthy()) {
        return eval(*e.items[1]);
      }
      return e.items[2] ? eval(*e.items[2])
                        : Value::undefined("the condition is false and has no else");
    }
    case ExprKind::kCompare: {
      Value left = eval(*e.items[0]);
      for (const auto& [op, operand] : e.keyword) {
        Value right = eval(*operand);
        line_ = e.line;
        if (!compare(op, left, right)) {
          return Value::boolean(false);
        }
        left = std::move(right);
      }
      return Value::boolean(true);
    }
    case ExprKind::kBinary:
      break;
  }
  const std::string& op = e.name;
  const Value a = eval(*e.items[0]);
  if (op == "and") {
    return a.truthy() ? eval(*e.items[1]) : a;
  }
  if (op == "or") {
    return a.truthy() ? a : eval(*e.items[1]);
  }
  const Value b = eval(*e.items[1]);
  line_ = e.line;
  if (op == "~") {
    return Value::string(a.str() + b.str());
  }
  return binary_op(op, a, b);
}

}  // namespace crescent::model::jinja
