#include "model/jinja/value.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "model/jinja/strings.h"

namespace crescent::model::jinja {

void fail(const std::string& message) {
  throw Error(message);
}

const Value* ValueDict::find(std::string_view key) const {
  for (const auto& [k, v] : items) {
    if (k == key) {
      return &v;
    }
  }
  return nullptr;
}

void ValueDict::set(const std::string& key, Value value) {
  for (auto& [k, v] : items) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  items.emplace_back(key, std::move(value));
}

const Value* CallArgs::get(size_t index, std::string_view name) const {
  if (index < positional.size()) {
    return &positional[index];
  }
  for (const auto& [k, v] : keyword) {
    if (k == name) {
      return &v;
    }
  }
  return nullptr;
}

Value Value::undefined(std::string reason) {
  Value v;
  v.string_ = std::move(reason);
  return v;
}

Value Value::none() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}

Value Value::boolean(bool b) {
  Value v;
  v.kind_ = Kind::kBool;
  v.bool_ = b;
  v.int_ = b ? 1 : 0;
  return v;
}

Value Value::integer(int64_t i) {
  Value v;
  v.kind_ = Kind::kInt;
  v.int_ = i;
  return v;
}

Value Value::number(double f) {
  Value v;
  v.kind_ = Kind::kFloat;
  v.float_ = f;
  return v;
}

Value Value::string(std::string s) {
  Value v;
  v.kind_ = Kind::kString;
  v.string_ = std::move(s);
  return v;
}

Value Value::list(ValueList items) {
  Value v;
  v.kind_ = Kind::kList;
  v.list_ = std::make_shared<ValueList>(std::move(items));
  return v;
}

Value Value::tuple(ValueList items) {
  Value v = list(std::move(items));
  v.is_tuple_ = true;
  return v;
}

Value Value::dict(ValueDict d) {
  Value v;
  v.kind_ = Kind::kDict;
  v.dict_ = std::make_shared<ValueDict>(std::move(d));
  return v;
}

Value Value::namespace_(ValueDict d) {
  Value v = dict(std::move(d));
  v.is_namespace_ = true;
  return v;
}

Value Value::function(std::string name, Function fn) {
  Value v;
  v.kind_ = Kind::kFunction;
  v.string_ = std::move(name);
  v.function_ = std::make_shared<Function>(std::move(fn));
  return v;
}

Value Value::from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return none();
    case nlohmann::ordered_json::value_t::boolean:
      return boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned:
      return integer(static_cast<int64_t>(j.get<uint64_t>()));
    case nlohmann::ordered_json::value_t::number_float:
      return number(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return string(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      ValueList items;
      for (const auto& e : j) {
        items.push_back(from_json(e));
      }
      return list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      ValueDict d;
      for (const auto& [k, e] : j.items()) {
        d.items.emplace_back(k, from_json(e));
      }
      return dict(std::move(d));
    }
    default:
      return none();
  }
}

bool Value::truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return bool_;
    case Kind::kInt:
      return int_ != 0;
    case Kind::kFloat:
      return float_ != 0;
    case Kind::kString:
      return !string_.empty();
    case Kind::kList:
      return !list_->empty();
    case Kind::kDict:
      return is_namespace_ || !dict_->items.empty();
    case Kind::kFunction:
      return true;
  }
  return false;
}

std::string Value::str() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "";
    case Kind::kString:
      return string_;
    default:
      return repr();
  }
}

std::string Value::repr() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return bool_ ? "True" : "False";
    case Kind::kInt:
      return std::to_string(int_);
    case Kind::kFloat:
      return python_float_repr(float_);
    case Kind::kString:
      return python_string_repr(string_);
    case Kind::kList: {
      std::string out = is_tuple_ ? "(" : "[";
      for (size_t i = 0; i < list_->size(); ++i) {
        out += (i ? ", " : "") + (*list_)[i].repr();
      }
      if (is_tuple_ && list_->size() == 1) {
        out += ",";
      }
      return out + (is_tuple_ ? ")" : "]");
    }
    case Kind::kDict: {
      std::string out = is_namespace_ ? "<Namespace {" : "{";
      for (size_t i = 0; i < dict_->items.size(); ++i) {
        const auto& [k, v] = dict_->items[i];
        out += (i ? ", " : "") + python_string_repr(k) + ": " + v.repr();
      }
      return out + (is_namespace_ ? "}>" : "}");
    }
    case Kind::kFunction:
      return "<function " + string_ + ">";
  }
  return "";
}

namespace {

void json_string(std::string_view s, bool ensure_ascii, std::string& out) {
  out += '"';
  for (size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default: {
        char buf[16];
        if (c < 0x20 || (ensure_ascii && c == 0x7f)) {
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else if (ensure_ascii && c >= 0x80) {
          // Decode one UTF-8 character; escape it as \uXXXX (a surrogate pair above U+FFFF).
          const size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
          uint32_t cp = len == 1 ? c : c & (0xFF >> (len + 1));
          for (size_t k = 1; k < len && i + k < s.size(); ++k) {
            cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
          }
          i += len - 1;
          if (cp >= 0x10000) {
            cp -= 0x10000;
            std::snprintf(buf, sizeof(buf), "\\u%04x\\u%04x", 0xD800 + (cp >> 10),
                          0xDC00 + (cp & 0x3FF));
          } else {
            std::snprintf(buf, sizeof(buf), "\\u%04x", cp);
          }
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
      }
    }
  }
  out += '"';
}

void json_dump(const Value& v, const JsonOptions& options, int depth, std::string& out) {
  const std::optional<int>& indent = options.indent;
  const std::string item_sep =
      options.separators ? options.separators->first : (indent ? "," : ", ");
  const std::string key_sep = options.separators ? options.separators->second : ": ";
  auto newline = [&](int d) {
    if (indent) {
      out += '\n';
      out.append(static_cast<size_t>(std::max(0, *indent) * d), ' ');
    }
  };
  switch (v.kind()) {
    case Value::Kind::kNone:
      out += "null";
      return;
    case Value::Kind::kBool:
      out += v.as_bool() ? "true" : "false";
      return;
    case Value::Kind::kInt:
      out += std::to_string(v.as_int());
      return;
    case Value::Kind::kFloat: {
      const double f = v.as_float();
      out += std::isnan(f)   ? "NaN"
             : std::isinf(f) ? (f > 0 ? "Infinity" : "-Infinity")
                             : python_float_repr(f);
      return;
    }
    case Value::Kind::kString:
      json_string(v.as_string(), options.ensure_ascii, out);
      return;
    case Value::Kind::kList: {
      const ValueList& items = v.as_list();
      if (items.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) {
          out += item_sep;
        }
        newline(depth + 1);
        json_dump(items[i], options, depth + 1, out);
      }
      newline(depth);
      out += ']';
      return;
    }
    case Value::Kind::kDict: {
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& item : v.as_dict().items) {
        items.push_back(&item);
      }
      if (items.empty()) {
        out += "{}";
        return;
      }
      if (options.sort_keys) {
        std::stable_sort(items.begin(), items.end(),
                         [](const auto* a, const auto* b) { return a->first < b->first; });
      }
      out += '{';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) {
          out += item_sep;
        }
        newline(depth + 1);
        json_string(items[i]->first, options.ensure_ascii, out);
        out += key_sep;
        json_dump(items[i]->second, options, depth + 1, out);
      }
      newline(depth);
      out += '}';
      return;
    }
    default:
      fail("Object of type " + std::string(v.is_undefined() ? "Undefined" : "function") +
           " is not JSON serializable");
  }
}

}  // namespace

std::string Value::to_json(const JsonOptions& options) const {
  std::string out;
  json_dump(*this, options, 0, out);
  return out;
}

ValueList Value::iterate() const {
  switch (kind_) {
    case Kind::kUndefined:
      return {};
    case Kind::kList:
      return *list_;
    case Kind::kDict: {
      ValueList keys;
      for (const auto& [k, v] : dict_->items) {
        keys.push_back(string(k));
      }
      return keys;
    }
    case Kind::kString: {
      ValueList chars;
      for (const std::string& c : utf8_chars(string_)) {
        chars.push_back(string(c));
      }
      return chars;
    }
    default:
      fail("'" + std::string(kind_ == Kind::kNone ? "NoneType" : repr()) +
           "' object is not iterable");
  }
}

int64_t Value::length() const {
  switch (kind_) {
    case Kind::kUndefined:
      return 0;
    case Kind::kString:
      return static_cast<int64_t>(utf8_length(string_));
    case Kind::kList:
      return static_cast<int64_t>(list_->size());
    case Kind::kDict:
      return static_cast<int64_t>(dict_->items.size());
    default:
      fail("object of type '" + repr() + "' has no len()");
  }
}

bool operator==(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) {
      return a.as_float() == b.as_float();
    }
    return a.as_int() == b.as_int();
  }
  if (a.kind() != b.kind()) {
    return false;
  }
  switch (a.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return true;
    case Value::Kind::kString:
      return a.as_string() == b.as_string();
    case Value::Kind::kList:
      return a.is_tuple() == b.is_tuple() && a.as_list() == b.as_list();
    case Value::Kind::kDict: {
      const auto& x = a.as_dict().items;
      const auto& y = b.as_dict().items;
      if (x.size() != y.size()) {
        return false;
      }
      for (const auto& [k, v] : x) {
        const Value* w = b.as_dict().find(k);
        if (w == nullptr || !(v == *w)) {
          return false;
        }
      }
      return true;
    }
    case Value::Kind::kFunction:
      return &a.as_function() == &b.as_function();
    default:
      return false;
  }
}

bool less_than(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) {
      return a.as_float() < b.as_float();
    }
    return a.as_int() < b.as_int();
  }
  if (a.is_string() && b.is_string()) {
    return a.as_string() < b.as_string();
  }
  if (a.is_list() && b.is_list()) {
    const ValueList& x = a.as_list();
    const ValueList& y = b.as_list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!(x[i] == y[i])) {
        return less_than(x[i], y[i]);
      }
    }
    return x.size() < y.size();
  }
  fail("'<' not supported between " + a.repr() + " and " + b.repr());
}

std::string python_float_repr(double f) {
  if (std::isnan(f)) {
    return "nan";
  }
  if (std::isinf(f)) {
    return f > 0 ? "inf" : "-inf";
  }
  if (f == 0) {
    return std::signbit(f) ? "-0.0" : "0.0";
  }
  // The shortest digits that read back as f, in scientific form d.ddde±x.
  char buf[40];
  for (int precision = 0; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof(buf), "%.*e", precision, f);
    if (std::strtod(buf, nullptr) == f) {
      break;
    }
  }
  std::string sci(buf);
  const size_t e = sci.find('e');
  const int exponent = std::atoi(sci.c_str() + e + 1);
  std::string mantissa = sci.substr(0, e);
  const bool negative = mantissa[0] == '-';
  if (negative) {
    mantissa.erase(0, 1);
  }
  std::string digits;
  for (char c : mantissa) {
    if (c != '.') {
      digits += c;
    }
  }
  std::string out;
  if (exponent < -4 || exponent >= 16) {
    out = digits.substr(0, 1);
    if (digits.size() > 1) {
      out += "." + digits.substr(1);
    }
    char exp_buf[16];
    std::snprintf(exp_buf, sizeof(exp_buf), "e%c%02d", exponent < 0 ? '-' : '+',
                  std::abs(exponent));
    out += exp_buf;
  } else if (exponent < 0) {
    out = "0." + std::string(static_cast<size_t>(-exponent - 1), '0') + digits;
  } else {
    const auto int_digits = static_cast<size_t>(exponent + 1);
    if (digits.size() <= int_digits) {
      out = digits + std::string(int_digits - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, int_digits) + "." + digits.substr(int_digits);
    }
  }
  return negative ? "-" + out : out;
}

std::string python_string_repr(std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (ch == quote || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (ch == '\n') {
      out += "\\n";
    } else if (ch == '\r') {
      out += "\\r";
    } else if (ch == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    } else {
      out += ch;
    }
  }
  out += quote;
  return out;
}

}  // namespace crescent::model::jinja
