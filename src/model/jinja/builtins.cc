#include "model/jinja/builtins.h"

#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <ctime>

#include "model/jinja/arguments.h"
#include "model/jinja/strings.h"

namespace crescent::model::jinja {
namespace {

[[noreturn]] void fail_undefined(const Value& v) {
  fail(v.undefined_reason());
}

// Python's str.format with {}, {N} and {name} fields (no format specs).
Value brace_format(const std::string& fmt, const CallArgs& args) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    const char c = fmt[i];
    if ((c == '{' || c == '}') && i + 1 < fmt.size() && fmt[i + 1] == c) {
      out += c;
      ++i;
      continue;
    }
    if (c != '{') {
      out += c;
      continue;
    }
    const size_t close = fmt.find('}', i);
    if (close == std::string::npos) {
      fail("Single '{' encountered in format string");
    }
    const std::string field = fmt.substr(i + 1, close - i - 1);
    if (field.find_first_of(":!") != std::string::npos) {
      fail("str.format: format specs are not supported");
    }
    const Value* v = nullptr;
    if (field.empty()) {
      v = args.get(auto_index++, "");
    } else if (std::isdigit(static_cast<unsigned char>(field[0]))) {
      v = args.get(static_cast<size_t>(std::stoul(field)), "");
    } else {
      v = args.get(SIZE_MAX, field);
    }
    if (v == nullptr) {
      fail("str.format: no argument for {" + field + "}");
    }
    out += v->str();
    i = close;
  }
  return Value::string(std::move(out));
}

[[noreturn]] void fail_not_number(char conv, const Value& v) {
  std::string message = "%";
  message += conv;
  message += " format: a real number is required, not ";
  message += v.repr();
  fail(message);
}

}  // namespace

// Python's printf-style `fmt % args` for the conversions templates use (s r d i f x %).
Value percent_format(const std::string& fmt, const ValueList& args) {
  std::string out;
  size_t next = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out += fmt[i];
      continue;
    }
    size_t j = i + 1;
    std::string spec = "%";
    while (j < fmt.size() &&
           std::string_view("-+ #0123456789.").find(fmt[j]) != std::string_view::npos) {
      spec += fmt[j++];
    }
    if (j >= fmt.size()) {
      fail("incomplete format");
    }
    const char conv = fmt[j];
    i = j;
    if (conv == '%') {
      out += '%';
      continue;
    }
    if (next >= args.size()) {
      fail("not enough arguments for format string");
    }
    const Value& v = args[next++];
    char buf[512];
    switch (conv) {
      case 's':
      case 'r': {
        const std::string text = conv == 's' ? v.str() : v.repr();
        std::snprintf(buf, sizeof(buf), (spec + "s").c_str(), text.c_str());
        out += spec == "%" ? text : std::string(buf);
        break;
      }
      case 'd':
      case 'i':
      case 'x':
      case 'X':
        if (!v.is_number()) {
          fail_not_number(conv, v);
        }
        std::snprintf(buf, sizeof(buf),
                      (spec + "ll" + std::string(1, conv == 'i' ? 'd' : conv)).c_str(),
                      static_cast<long long>(v.as_int()));
        out += buf;
        break;
      case 'f':
      case 'e':
      case 'g':
        if (!v.is_number()) {
          fail_not_number(conv, v);
        }
        std::snprintf(buf, sizeof(buf), (spec + std::string(1, conv)).c_str(), v.as_float());
        out += buf;
        break;
      default:
        fail("unsupported format character '" + std::string(1, conv) + "'");
    }
  }
  if (next < args.size()) {
    fail("not all arguments converted during string formatting");
  }
  return Value::string(std::move(out));
}

Value binary_op(const std::string& op, const Value& a, const Value& b) {
  if (a.is_undefined()) {
    fail_undefined(a);
  }
  if (b.is_undefined()) {
    fail_undefined(b);
  }
  const bool numbers = a.is_number() && b.is_number();
  const bool ints = numbers && !a.is_float() && !b.is_float();
  if (op == "+") {
    if (ints) {
      return Value::integer(a.as_int() + b.as_int());
    }
    if (numbers) {
      return Value::number(a.as_float() + b.as_float());
    }
    if (a.is_string() && b.is_string()) {
      return Value::string(a.as_string() + b.as_string());
    }
    if (a.is_list() && b.is_list()) {
      ValueList items = a.as_list();
      items.insert(items.end(), b.as_list().begin(), b.as_list().end());
      return Value::list(std::move(items));
    }
  } else if (op == "-" && numbers) {
    return ints ? Value::integer(a.as_int() - b.as_int())
                : Value::number(a.as_float() - b.as_float());
  } else if (op == "*") {
    if (ints) {
      return Value::integer(a.as_int() * b.as_int());
    }
    if (numbers) {
      return Value::number(a.as_float() * b.as_float());
    }
    const Value& seq = a.is_number() ? b : a;
    const Value& times = a.is_number() ? a : b;
    if ((seq.is_string() || seq.is_list()) && times.is_number() && !times.is_float()) {
      if (seq.is_string()) {
        std::string out;
        for (int64_t i = 0; i < times.as_int(); ++i) {
          out += seq.as_string();
        }
        return Value::string(std::move(out));
      }
      ValueList out;
      for (int64_t i = 0; i < times.as_int(); ++i) {
        out.insert(out.end(), seq.as_list().begin(), seq.as_list().end());
      }
      return Value::list(std::move(out));
    }
  } else if (op == "%" && a.is_string()) {
    return percent_format(a.as_string(), b.is_tuple() ? b.as_list() : ValueList{b});
  } else if (numbers && (op == "/" || op == "//" || op == "%")) {
    if (b.as_float() == 0) {
      fail("division by zero");
    }
    if (op == "/") {
      return Value::number(a.as_float() / b.as_float());
    }
    if (ints) {
      const int64_t x = a.as_int();
      const int64_t y = b.as_int();
      int64_t q = x / y;
      if ((x % y != 0) && ((x < 0) != (y < 0))) {
        --q;
      }
      return op == "//" ? Value::integer(q) : Value::integer(x - q * y);
    }
    const double q = std::floor(a.as_float() / b.as_float());
    return op == "//" ? Value::number(q) : Value::number(a.as_float() - q * b.as_float());
  } else if (op == "**" && numbers) {
    if (ints && b.as_int() >= 0) {
      int64_t r = 1;
      for (int64_t i = 0; i < b.as_int(); ++i) {
        r *= a.as_int();
      }
      return Value::integer(r);
    }
    return Value::number(std::pow(a.as_float(), b.as_float()));
  }
  fail("unsupported operand types for " + op + ": " + a.repr() + " and " + b.repr());
}

bool contains(const Value& container, const Value& item) {
  if (container.is_string()) {
    if (!item.is_string()) {
      fail("'in <string>' requires string as left operand");
    }
    return container.as_string().find(item.as_string()) != std::string::npos;
  }
  if (container.is_dict()) {
    return item.is_string() && container.as_dict().find(item.as_string()) != nullptr;
  }
  if (container.is_list()) {
    for (const Value& v : container.as_list()) {
      if (v == item) {
        return true;
      }
    }
    return false;
  }
  if (container.is_undefined()) {
    return false;
  }
  fail("argument of type " + container.repr() + " is not iterable");
}

bool apply_test(const std::string& name, const Value& v, const CallArgs& args) {
  const Value other = arg(args, 0, "", Value());
  if (name == "defined") {
    return !v.is_undefined();
  }
  if (name == "undefined") {
    return v.is_undefined();
  }
  if (name == "none") {
    return v.is_none();
  }
  if (name == "string") {
    return v.is_string();
  }
  if (name == "number") {
    return v.is_number();
  }
  if (name == "integer") {
    return v.is_int();
  }
  if (name == "float") {
    return v.is_float();
  }
  if (name == "boolean") {
    return v.is_bool();
  }
  if (name == "true") {
    return v.is_bool() && v.as_bool();
  }
  if (name == "false") {
    return v.is_bool() && !v.as_bool();
  }
  if (name == "mapping") {
    return v.is_dict();
  }
  if (name == "iterable") {
    return v.is_list() || v.is_dict() || v.is_string() || v.is_undefined();
  }
  if (name == "sequence") {
    return v.is_list() || v.is_dict() || v.is_string();
  }
  if (name == "callable") {
    return v.is_function();
  }
  if (name == "equalto" || name == "==" || name == "eq" || name == "sameas") {
    return v == other && (name != "sameas" || v.kind() == other.kind());
  }
  if (name == "ne" || name == "!=") {
    return !(v == other);
  }
  if (name == "lt" || name == "<" || name == "lessthan") {
    return less_than(v, other);
  }
  if (name == "gt" || name == ">" || name == "greaterthan") {
    return less_than(other, v);
  }
  if (name == "le" || name == "<=") {
    return !less_than(other, v);
  }
  if (name == "ge" || name == ">=") {
    return !less_than(v, other);
  }
  if (name == "in") {
    return contains(other, v);
  }
  if (name == "odd" || name == "even") {
    return (v.as_int() % 2 != 0) == (name == "odd");
  }
  if (name == "divisibleby") {
    return other.as_int() != 0 && v.as_int() % other.as_int() == 0;
  }
  if (name == "lower") {
    return v.is_string() && py_lower(v.as_string()) == v.as_string();
  }
  if (name == "upper") {
    return v.is_string() && py_upper(v.as_string()) == v.as_string();
  }
  fail("no test named '" + name + "'");
}

bool has_method(const Value& target, const std::string& name) {
  static const std::vector<std::string> kString = {
      "strip",   "lstrip", "rstrip",     "split", "startswith", "endswith", "upper",     "lower",
      "replace", "title",  "capitalize", "find",  "count",      "join",     "splitlines"};
  static const std::vector<std::string> kDict = {"items", "keys", "values", "get"};
  const std::vector<std::string>* names = nullptr;
  if (target.is_string()) {
    names = &kString;
  } else if (target.is_dict() && !target.is_namespace()) {
    names = &kDict;
  }
  return names && std::find(names->begin(), names->end(), name) != names->end();
}

Value call_method(const Value& target, const std::string& name, const CallArgs& args) {
  if (target.is_dict()) {
    const ValueDict& d = target.as_dict();
    if (name == "get") {
      const Value* v = d.find(arg(args, 0, "key", Value()).str());
      return v ? *v : arg(args, 1, "default", Value::none());
    }
    ValueList out;
    for (const auto& [k, v] : d.items) {
      out.push_back(name == "keys"     ? Value::string(k)
                    : name == "values" ? v
                                       : Value::tuple({Value::string(k), v}));
    }
    return Value::list(std::move(out));
  }
  const std::string& s = target.as_string();
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    return Value::string(
        py_strip(s, optional_string(args, 0, "chars"), name != "rstrip", name != "lstrip"));
  }
  if (name == "split") {
    ValueList out;
    for (std::string& part :
         py_split(s, optional_string(args, 0, "sep"), int_arg(args, 1, "maxsplit", -1))) {
      out.push_back(Value::string(std::move(part)));
    }
    return Value::list(std::move(out));
  }
  if (name == "splitlines") {
    ValueList out;
    for (std::string& line : py_splitlines(s)) {
      out.push_back(Value::string(std::move(line)));
    }
    return Value::list(std::move(out));
  }
  if (name == "startswith" || name == "endswith") {
    const Value affix = arg(args, 0, "prefix", Value());
    const ValueList options = affix.is_list() ? affix.as_list() : ValueList{affix};
    for (const Value& o : options) {
      const std::string& a = o.as_string();
      const bool match =
          name == "startswith"
              ? s.compare(0, a.size(), a) == 0
              : s.size() >= a.size() && s.compare(s.size() - a.size(), a.size(), a) == 0;
      if (match) {
        return Value::boolean(true);
      }
    }
    return Value::boolean(false);
  }
  if (name == "upper") {
    return Value::string(py_upper(s));
  }
  if (name == "lower") {
    return Value::string(py_lower(s));
  }
  if (name == "title") {
    return Value::string(py_title(s));
  }
  if (name == "capitalize") {
    return Value::string(py_capitalize(s));
  }
  if (name == "replace") {
    return Value::string(py_replace(s, arg(args, 0, "old", Value()).str(),
                                    arg(args, 1, "new", Value()).str(),
                                    int_arg(args, 2, "count", -1)));
  }
  if (name == "find") {
    const size_t pos = s.find(arg(args, 0, "sub", Value()).str());
    return Value::integer(pos == std::string::npos ? -1
                                                   : static_cast<int64_t>(utf8_length(
                                                         std::string_view(s).substr(0, pos))));
  }
  if (name == "count") {
    const std::string sub = arg(args, 0, "sub", Value()).str();
    return Value::integer(static_cast<int64_t>(py_split(s, sub, -1).size()) - 1);
  }
  if (name == "format") {
    return brace_format(s, args);
  }
  if (name == "join") {
    std::string out;
    bool first = true;
    for (const Value& item : arg(args, 0, "iterable", Value()).iterate()) {
      out += (first ? "" : s) + item.str();
      first = false;
    }
    return Value::string(std::move(out));
  }
  fail("'str' object has no attribute '" + name + "'");
}

ValueDict make_globals() {
  ValueDict g;
  g.set("range", Value::function("range", [](const CallArgs& args) {
          int64_t start = 0;
          int64_t stop = 0;
          int64_t step = 1;
          if (args.positional.size() == 1) {
            stop = args.positional[0].as_int();
          } else if (args.positional.size() >= 2) {
            start = args.positional[0].as_int();
            stop = args.positional[1].as_int();
            if (args.positional.size() >= 3) {
              step = args.positional[2].as_int();
            }
          }
          if (step == 0) {
            fail("range() arg 3 must not be zero");
          }
          ValueList out;
          for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
            out.push_back(Value::integer(i));
          }
          return Value::list(std::move(out));
        }));
  auto kwargs_dict = [](const CallArgs& args) {
    ValueDict d;
    for (const Value& p : args.positional) {
      if (p.is_dict()) {
        for (const auto& [k, v] : p.as_dict().items) {
          d.set(k, v);
        }
      }
    }
    for (const auto& [k, v] : args.keyword) {
      d.set(k, v);
    }
    return d;
  };
  g.set("namespace", Value::function("namespace", [kwargs_dict](const CallArgs& args) {
          return Value::namespace_(kwargs_dict(args));
        }));
  g.set("dict", Value::function("dict", [kwargs_dict](const CallArgs& args) {
          return Value::dict(kwargs_dict(args));
        }));
  g.set("raise_exception", Value::function("raise_exception", [](const CallArgs& args) -> Value {
          fail(arg(args, 0, "message", Value()).str());
        }));
  g.set("strftime_now", Value::function("strftime_now", [](const CallArgs& args) {
          const std::time_t now = std::time(nullptr);
          std::tm local{};
          localtime_r(&now, &local);
          char buf[256];
          const size_t n = std::strftime(buf, sizeof(buf),
                                         arg(args, 0, "format", Value()).str().c_str(), &local);
          return Value::string(std::string(buf, n));
        }));
  return g;
}

}  // namespace crescent::model::jinja
