#include "model/jinja/parser.h"

#include <cstdlib>
#include <initializer_list>

#include "model/jinja/lexer.h"

namespace crescent::model::jinja {
namespace {

ExprPtr make(ExprKind kind, int line) {
  auto e = std::make_unique<Expr>();
  e->kind = kind;
  e->line = line;
  return e;
}

// Deeper nesting than any real template has; beyond it the parser stops before it exhausts
// the thread's stack (templates may come from requests).
constexpr int kMaxNesting = 200;

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  StmtList parse_template() {
    StmtList body = parse_body({});
    if (peek().kind != TokenKind::kEnd) {
      error("unexpected '" + peek_block_name() + "'");
    }
    return body;
  }

 private:
  const Token& peek(size_t ahead = 0) const {
    return tokens_[std::min(pos_ + ahead, tokens_.size() - 1)];
  }
  const Token& next() {
    const Token& t = tokens_[pos_];
    if (pos_ + 1 < tokens_.size()) {
      ++pos_;
    }
    return t;
  }
  [[noreturn]] void error(const std::string& message) const { throw Error(message, peek().line); }

  bool is_op(std::string_view op, size_t ahead = 0) const {
    return peek(ahead).kind == TokenKind::kOperator && peek(ahead).text == op;
  }
  bool is_name(std::string_view name, size_t ahead = 0) const {
    return peek(ahead).kind == TokenKind::kName && peek(ahead).text == name;
  }
  bool skip_op(std::string_view op) {
    if (is_op(op)) {
      next();
      return true;
    }
    return false;
  }
  bool skip_name(std::string_view name) {
    if (is_name(name)) {
      next();
      return true;
    }
    return false;
  }
  void expect_op(std::string_view op) {
    if (!skip_op(op)) {
      error("expected '" + std::string(op) + "', got '" + peek().text + "'");
    }
  }
  std::string expect_name() {
    if (peek().kind != TokenKind::kName) {
      error("expected a name, got '" + peek().text + "'");
    }
    return next().text;
  }
  void expect_block_end() {
    if (peek().kind != TokenKind::kBlockEnd) {
      error("expected end of statement block, got '" + peek().text + "'");
    }
    next();
  }
  std::string peek_block_name() const {
    return peek().kind == TokenKind::kBlockBegin ? peek(1).text : peek().text;
  }

  // Statements up to a {% NAME %} whose name is in `ends` (left unconsumed) or the end.
  StmtList parse_body(std::initializer_list<std::string_view> ends) {
    StmtList body;
    while (peek().kind != TokenKind::kEnd) {
      const Token& t = peek();
      if (t.kind == TokenKind::kText) {
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::kText;
        s->line = t.line;
        s->text = t.text;
        body.push_back(std::move(s));
        next();
      } else if (t.kind == TokenKind::kVariableBegin) {
        next();
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::kOutput;
        s->line = t.line;
        s->expr = parse_expression();
        if (peek().kind != TokenKind::kVariableEnd) {
          error("expected end of print statement, got '" + peek().text + "'");
        }
        next();
        body.push_back(std::move(s));
      } else if (t.kind == TokenKind::kBlockBegin) {
        const std::string& name = peek(1).text;
        for (std::string_view end : ends) {
          if (name == end) {
            return body;
          }
        }
        next();
        body.push_back(parse_statement());
      } else {
        error("unexpected token '" + t.text + "'");
      }
    }
    if (ends.size() > 0) {
      error("unexpected end of template, expected '" + std::string(*ends.begin()) + "'");
    }
    return body;
  }

  void expect_tag(std::string_view name) {
    if (peek().kind != TokenKind::kBlockBegin || peek(1).text != name) {
      error("expected '" + std::string(name) + "'");
    }
    next();
    next();
  }

  StmtPtr parse_statement() {
    NestingGuard guard(*this);
    const int line = peek().line;
    const std::string keyword = expect_name();
    auto s = std::make_unique<Stmt>();
    s->line = line;
    if (keyword == "if") {
      parse_if(*s);
      return s;
    }
    if (keyword == "for") {
      s->kind = StmtKind::kFor;
      s->targets.push_back(expect_name());
      while (skip_op(",")) {
        s->targets.push_back(expect_name());
      }
      if (!skip_name("in")) {
        error("expected 'in'");
      }
      s->expr = parse_or_with_condition(false);
      if (skip_name("if")) {
        s->filter = parse_expression();
      }
      skip_name("recursive");
      expect_block_end();
      s->body = parse_body({"else", "endfor"});
      if (is_name("else", 1)) {
        expect_tag("else");
        expect_block_end();
        s->else_body = parse_body({"endfor"});
      }
      expect_tag("endfor");
      expect_block_end();
      return s;
    }
    if (keyword == "set") {
      s->targets.push_back(expect_name());
      if (skip_op(".")) {
        s->text = expect_name();
      }
      while (skip_op(",")) {
        s->targets.push_back(expect_name());
      }
      if (skip_op("=")) {
        s->kind = StmtKind::kSet;
        s->expr = parse_tuple_or_expression();
        expect_block_end();
        return s;
      }
      s->kind = StmtKind::kSetBlock;
      expect_block_end();
      s->body = parse_body({"endset"});
      expect_tag("endset");
      expect_block_end();
      return s;
    }
    if (keyword == "macro") {
      s->kind = StmtKind::kMacro;
      s->text = expect_name();
      expect_op("(");
      while (!skip_op(")")) {
        if (!s->params.empty()) {
          expect_op(",");
        }
        MacroParam p;
        p.name = expect_name();
        if (skip_op("=")) {
          p.default_value = parse_expression();
        }
        s->params.push_back(std::move(p));
      }
      expect_block_end();
      s->body = parse_body({"endmacro"});
      expect_tag("endmacro");
      if (peek().kind == TokenKind::kName) {
        next();
      }
      expect_block_end();
      return s;
    }
    if (keyword == "break" || keyword == "continue") {
      s->kind = keyword == "break" ? StmtKind::kBreak : StmtKind::kContinue;
      expect_block_end();
      return s;
    }
    if (keyword == "filter") {
      s->kind = StmtKind::kFilterBlock;
      s->expr = make(ExprKind::kFilter, line);
      s->expr->name = expect_name();
      s->expr->items.push_back(nullptr);
      if (skip_op("(")) {
        parse_call_args(*s->expr);
      }
      expect_block_end();
      s->body = parse_body({"endfilter"});
      expect_tag("endfilter");
      expect_block_end();
      return s;
    }
    if (keyword == "generation") {
      // transformers' AssistantTracker: the body renders as is.
      s->kind = StmtKind::kBlock;
      expect_block_end();
      s->body = parse_body({"endgeneration"});
      expect_tag("endgeneration");
      expect_block_end();
      return s;
    }
    throw Error("unknown tag '" + keyword + "'", line);
  }

  void parse_if(Stmt& s) {
    s.kind = StmtKind::kIf;
    s.expr = parse_tuple_or_expression();
    expect_block_end();
    s.body = parse_body({"elif", "else", "endif"});
    if (is_name("elif", 1)) {
      next();
      next();
      auto nested = std::make_unique<Stmt>();
      nested->line = peek().line;
      parse_if(*nested);
      s.else_body.push_back(std::move(nested));
      return;
    }
    if (is_name("else", 1)) {
      expect_tag("else");
      expect_block_end();
      s.else_body = parse_body({"endif"});
    }
    expect_tag("endif");
    expect_block_end();
  }

  // `a, b` as a tuple where jinja allows one (set values, if conditions), else one expression.
  ExprPtr parse_tuple_or_expression() {
    ExprPtr first = parse_expression();
    if (!is_op(",")) {
      return first;
    }
    auto t = make(ExprKind::kTuple, first->line);
    t->items.push_back(std::move(first));
    while (skip_op(",")) {
      t->items.push_back(parse_expression());
    }
    return t;
  }

  ExprPtr parse_expression() { return parse_or_with_condition(true); }

  ExprPtr parse_or_with_condition(bool with_condition) {
    ExprPtr e = parse_or();
    while (with_condition && is_name("if")) {
      next();
      auto c = make(ExprKind::kCondition, e->line);
      ExprPtr test = parse_or();
      ExprPtr otherwise = skip_name("else") ? parse_expression() : nullptr;
      c->items.push_back(std::move(test));
      c->items.push_back(std::move(e));
      c->items.push_back(std::move(otherwise));
      e = std::move(c);
    }
    return e;
  }

  ExprPtr binary(std::string op, ExprPtr a, ExprPtr b) {
    auto e = make(ExprKind::kBinary, a->line);
    e->name = std::move(op);
    e->items.push_back(std::move(a));
    e->items.push_back(std::move(b));
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr e = parse_and();
    while (skip_name("or")) {
      e = binary("or", std::move(e), parse_and());
    }
    return e;
  }

  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    while (skip_name("and")) {
      e = binary("and", std::move(e), parse_not());
    }
    return e;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      const int line = next().line;
      auto e = make(ExprKind::kUnary, line);
      e->name = "not";
      e->items.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    ExprPtr first = parse_math1();
    ExprPtr chain;
    while (true) {
      std::string op;
      if (peek().kind == TokenKind::kOperator &&
          (peek().text == "==" || peek().text == "!=" || peek().text == "<" || peek().text == ">" ||
           peek().text == "<=" || peek().text == ">=")) {
        op = next().text;
      } else if (skip_name("in")) {
        op = "in";
      } else if (is_name("not") && is_name("in", 1)) {
        next();
        next();
        op = "not in";
      } else {
        return chain ? std::move(chain) : std::move(first);
      }
      if (!chain) {
        chain = make(ExprKind::kCompare, first->line);
        chain->items.push_back(std::move(first));
      }
      chain->keyword.emplace_back(std::move(op), parse_math1());
    }
  }

  ExprPtr parse_math1() {
    ExprPtr e = parse_concat();
    while (is_op("+") || is_op("-")) {
      std::string op = next().text;
      e = binary(op, std::move(e), parse_concat());
    }
    return e;
  }

  ExprPtr parse_concat() {
    ExprPtr e = parse_math2();
    while (skip_op("~")) {
      e = binary("~", std::move(e), parse_math2());
    }
    return e;
  }

  ExprPtr parse_math2() {
    ExprPtr e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      std::string op = next().text;
      e = binary(op, std::move(e), parse_pow());
    }
    return e;
  }

  ExprPtr parse_pow() {
    ExprPtr e = parse_unary(true);
    while (skip_op("**")) {
      e = binary("**", std::move(e), parse_unary(true));
    }
    return e;
  }

  ExprPtr parse_unary(bool with_filter) {
    NestingGuard guard(*this);
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      const Token& t = next();
      e = make(ExprKind::kUnary, t.line);
      e->name = t.text;
      e->items.push_back(parse_unary(false));
    } else {
      e = parse_postfix(parse_primary());
    }
    return with_filter ? parse_filters(std::move(e)) : std::move(e);
  }

  ExprPtr parse_primary() {
    const Token& t = next();
    switch (t.kind) {
      case TokenKind::kName: {
        if (t.text == "true" || t.text == "True" || t.text == "false" || t.text == "False") {
          auto e = make(ExprKind::kLiteral, t.line);
          e->value = Value::boolean(t.text[0] == 't' || t.text[0] == 'T');
          return e;
        }
        if (t.text == "none" || t.text == "None") {
          auto e = make(ExprKind::kLiteral, t.line);
          e->value = Value::none();
          return e;
        }
        auto e = make(ExprKind::kName, t.line);
        e->name = t.text;
        return e;
      }
      case TokenKind::kString: {
        std::string s = t.text;
        while (peek().kind == TokenKind::kString) {
          s += next().text;
        }
        auto e = make(ExprKind::kLiteral, t.line);
        e->value = Value::string(std::move(s));
        return e;
      }
      case TokenKind::kInteger: {
        auto e = make(ExprKind::kLiteral, t.line);
        e->value = Value::integer(std::strtoll(t.text.c_str(), nullptr, 10));
        return e;
      }
      case TokenKind::kFloat: {
        auto e = make(ExprKind::kLiteral, t.line);
        e->value = Value::number(std::strtod(t.text.c_str(), nullptr));
        return e;
      }
      case TokenKind::kOperator:
        if (t.text == "(") {
          if (skip_op(")")) {
            return make(ExprKind::kTuple, t.line);
          }
          ExprPtr first = parse_expression();
          if (skip_op(")")) {
            return first;
          }
          auto tuple = make(ExprKind::kTuple, t.line);
          tuple->items.push_back(std::move(first));
          while (skip_op(",") && !is_op(")")) {
            tuple->items.push_back(parse_expression());
          }
          expect_op(")");
          return tuple;
        }
        if (t.text == "[") {
          auto list = make(ExprKind::kList, t.line);
          while (!skip_op("]")) {
            if (!list->items.empty()) {
              expect_op(",");
              if (skip_op("]")) {
                break;
              }
            }
            list->items.push_back(parse_expression());
          }
          return list;
        }
        if (t.text == "{") {
          auto dict = make(ExprKind::kDict, t.line);
          while (!skip_op("}")) {
            if (!dict->items.empty()) {
              expect_op(",");
              if (skip_op("}")) {
                break;
              }
            }
            dict->items.push_back(parse_expression());
            expect_op(":");
            dict->items.push_back(parse_expression());
          }
          return dict;
        }
        break;
      default:
        break;
    }
    throw Error("unexpected '" + (t.text.empty() ? std::string("end of tag") : t.text) + "'",
                t.line);
  }

  void parse_call_args(Expr& call) {
    bool first = true;
    while (!skip_op(")")) {
      if (!first) {
        expect_op(",");
        if (skip_op(")")) {
          return;
        }
      }
      first = false;
      if (peek().kind == TokenKind::kName && is_op("=", 1)) {
        std::string name = next().text;
        next();
        call.keyword.emplace_back(std::move(name), parse_expression());
      } else {
        call.items.push_back(parse_expression());
      }
    }
  }

  ExprPtr parse_postfix(ExprPtr e) {
    while (true) {
      if (is_op(".")) {
        next();
        auto a = make(ExprKind::kAttribute, e->line);
        if (peek().kind == TokenKind::kInteger) {
          a->kind = ExprKind::kSubscript;
          auto index = make(ExprKind::kLiteral, e->line);
          index->value = Value::integer(std::strtoll(next().text.c_str(), nullptr, 10));
          a->items.push_back(std::move(e));
          a->items.push_back(std::move(index));
        } else {
          a->name = expect_name();
          a->items.push_back(std::move(e));
        }
        e = std::move(a);
      } else if (is_op("[")) {
        next();
        e = parse_subscript(std::move(e));
      } else if (is_op("(")) {
        next();
        auto c = make(ExprKind::kCall, e->line);
        c->items.push_back(std::move(e));
        parse_call_args(*c);
        e = std::move(c);
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr target) {
    ExprPtr parts[3];
    int colons = 0;
    while (!is_op("]")) {
      if (skip_op(":")) {
        if (++colons > 2) {
          error("too many ':' in a slice");
        }
        continue;
      }
      parts[colons] = parse_expression();
    }
    next();
    if (colons == 0) {
      if (!parts[0]) {
        error("expected an index");
      }
      auto s = make(ExprKind::kSubscript, target->line);
      s->items.push_back(std::move(target));
      s->items.push_back(std::move(parts[0]));
      return s;
    }
    auto s = make(ExprKind::kSlice, target->line);
    s->items.push_back(std::move(target));
    for (ExprPtr& p : parts) {
      s->items.push_back(std::move(p));
    }
    return s;
  }

  ExprPtr parse_filters(ExprPtr e) {
    while (true) {
      if (skip_op("|")) {
        auto f = make(ExprKind::kFilter, peek().line);
        f->name = expect_name();
        while (skip_op(".")) {
          f->name += '.';
          f->name += expect_name();
        }
        f->items.push_back(std::move(e));
        if (skip_op("(")) {
          parse_call_args(*f);
        }
        e = std::move(f);
      } else if (is_name("is")) {
        next();
        auto t = make(ExprKind::kTest, peek().line);
        t->negated = skip_name("not");
        if (peek().kind == TokenKind::kOperator &&
            (peek().text == "==" || peek().text == "!=" || peek().text == "<" ||
             peek().text == ">" || peek().text == "<=" || peek().text == ">=")) {
          t->name = next().text;
        } else {
          t->name = expect_name();
        }
        t->items.push_back(std::move(e));
        if (skip_op("(")) {
          parse_call_args(*t);
        } else if ((peek().kind == TokenKind::kName && !is_name("else") && !is_name("or") &&
                    !is_name("and") && !is_name("if") && !is_name("in") && !is_name("not") &&
                    !is_name("is")) ||
                   peek().kind == TokenKind::kString || peek().kind == TokenKind::kInteger ||
                   peek().kind == TokenKind::kFloat || is_op("[") || is_op("{")) {
          t->items.push_back(parse_postfix(parse_primary()));
        }
        e = std::move(t);
      } else if (is_op("(")) {
        next();
        auto c = make(ExprKind::kCall, e->line);
        c->items.push_back(std::move(e));
        parse_call_args(*c);
        e = std::move(c);
      } else {
        return e;
      }
    }
  }

  // Counts the nesting of the enclosing parse call, failing past kMaxNesting.
  class NestingGuard {
   public:
    explicit NestingGuard(Parser& p) : p_(p) {
      if (++p_.depth_ > kMaxNesting) {
        p_.error("the template nests deeper than " + std::to_string(kMaxNesting) + " levels");
      }
    }
    ~NestingGuard() { --p_.depth_; }
    NestingGuard(const NestingGuard&) = delete;
    NestingGuard& operator=(const NestingGuard&) = delete;

   private:
    Parser& p_;
  };

  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int depth_ = 0;
};

}  // namespace

StmtList parse(std::string_view source) {
  return Parser(tokenize(source)).parse_template();
}

}  // namespace crescent::model::jinja
