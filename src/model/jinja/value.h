#pragma once
// The values a Jinja template computes with, shaped like the Python objects jinja2 sees when
// transformers renders a chat template: undefined, None, bool, int, float, str, list, dict
// (insertion-ordered, string keys), namespace() and callables (macros, globals, bound methods).
// Lists, dicts and namespaces are shared by reference like Python objects; everything else is
// copied. Conversions to text follow Python's str()/repr() and json.dumps so that rendered
// output matches jinja2 byte for byte. Not thread-safe: a value belongs to one render.

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace crescent::model::jinja {

// A template error (syntax, type, raise_exception). It never leaves the jinja module: the
// public entry points (Template::parse/render) turn it into an InvalidArgument Status.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message, int line = 0)
      : std::runtime_error(message), line_(line) {}
  int line() const { return line_; }

 private:
  int line_;
};

[[noreturn]] void fail(const std::string& message);

class Value;
using ValueList = std::vector<Value>;

struct ValueDict {
  std::vector<std::pair<std::string, Value>> items;

  const Value* find(std::string_view key) const;
  void set(const std::string& key, Value value);
};

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;

  // The argument at `index`, or the keyword `name`, or nullptr.
  const Value* get(size_t index, std::string_view name) const;
};

using Function = std::function<Value(const CallArgs&)>;

// json.dumps' options, as transformers' tojson filter passes them.
struct JsonOptions {
  std::optional<int> indent;
  bool ensure_ascii = false;
  bool sort_keys = false;
  // separators=(item, key); unset: (", ", ": "), or (",", ": ") with an indent.
  std::optional<std::pair<std::string, std::string>> separators;
};

class Value {
 public:
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kFunction };

  Value() = default;  // undefined
  // `reason` says why, as jinja2 does: "'x' is undefined", "'dict object' has no attribute 'y'".
  static Value undefined(std::string reason = "");
  static Value none();
  static Value boolean(bool b);
  static Value integer(int64_t i);
  static Value number(double f);
  static Value string(std::string s);
  static Value list(ValueList items = {});
  // A list that prints as a Python tuple: (a, b).
  static Value tuple(ValueList items);
  static Value dict(ValueDict d = {});
  static Value namespace_(ValueDict d = {});
  static Value function(std::string name, Function fn);
  static Value from_json(const nlohmann::ordered_json& j);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt; }
  bool is_float() const { return kind_ == Kind::kFloat; }
  // Python's numbers.Number: bool, int and float.
  bool is_number() const { return is_bool() || is_int() || is_float(); }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_tuple() const { return kind_ == Kind::kList && is_tuple_; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_namespace() const { return kind_ == Kind::kDict && is_namespace_; }
  bool is_function() const { return kind_ == Kind::kFunction; }

  bool as_bool() const { return bool_; }
  int64_t as_int() const { return is_float() ? static_cast<int64_t>(float_) : int_; }
  double as_float() const { return is_float() ? float_ : static_cast<double>(int_); }
  const std::string& as_string() const { return string_; }
  ValueList& as_list() const { return *list_; }
  ValueDict& as_dict() const { return *dict_; }
  const Function& as_function() const { return *function_; }
  // The name of a function, for messages.
  const std::string& name() const { return string_; }
  // Why an undefined value is undefined: the message of an error that uses it.
  std::string undefined_reason() const { return string_.empty() ? "undefined value" : string_; }

  // Python truthiness.
  bool truthy() const;
  // Python str(); undefined is "".
  std::string str() const;
  // Python repr().
  std::string repr() const;
  // json.dumps(value, ...) with `options`.
  std::string to_json(const JsonOptions& options = {}) const;
  // The elements a for loop visits: list items, dict keys, string characters; undefined is
  // empty.
  ValueList iterate() const;
  // len(); an error for what has no length.
  int64_t length() const;

  friend bool operator==(const Value& a, const Value& b);
  friend bool operator!=(const Value& a, const Value& b) { return !(a == b); }

 private:
  Kind kind_ = Kind::kUndefined;
  bool is_namespace_ = false;
  bool is_tuple_ = false;
  bool bool_ = false;
  int64_t int_ = 0;
  double float_ = 0;
  std::string string_;
  std::shared_ptr<ValueList> list_;
  std::shared_ptr<ValueDict> dict_;
  std::shared_ptr<Function> function_;
};

// Python's a < b for numbers, strings and lists; an error for anything else.
bool less_than(const Value& a, const Value& b);
// Python's repr() of a float: the shortest text that reads back as the same double.
std::string python_float_repr(double f);
// Python's repr() of a str.
std::string python_string_repr(std::string_view s);

}  // namespace crescent::model::jinja
