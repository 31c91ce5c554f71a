#include "model/jinja/filters.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "model/jinja/arguments.h"
#include "model/jinja/builtins.h"
#include "model/jinja/strings.h"

namespace crescent::model::jinja {
namespace {

Value select(const Value& target, const CallArgs& args, bool by_attribute, bool keep) {
  ValueList out;
  const size_t test_index = by_attribute ? 1 : 0;
  const std::string attribute = by_attribute ? arg(args, 0, "", Value()).str() : "";
  const Value* test = args.get(test_index, "");
  const CallArgs test_args = rest_args(args, test_index + 1);
  for (const Value& item : target.iterate()) {
    const Value v = by_attribute ? attribute_path(item, attribute) : item;
    const bool pass = test ? apply_test(test->str(), v, test_args) : v.truthy();
    if (pass == keep) {
      out.push_back(item);
    }
  }
  return Value::list(std::move(out));
}

// The key a sort/unique compares by: the attribute, lowercased unless case-sensitive.
Value sort_key(const Value& item, const std::optional<std::string>& attribute,
               bool case_sensitive) {
  Value v = attribute ? attribute_path(item, *attribute) : item;
  if (!case_sensitive && v.is_string()) {
    return Value::string(py_lower(v.as_string()));
  }
  return v;
}

Value indent(const Value& target, const CallArgs& args) {
  const Value* width = args.get(0, "width");
  const std::string pad = width && width->is_string()
                              ? width->as_string()
                              : std::string(static_cast<size_t>(width ? width->as_int() : 4), ' ');
  const bool first = bool_arg(args, 1, "first", false);
  const bool blank = bool_arg(args, 2, "blank", false);
  const std::vector<std::string> lines = py_splitlines(target.str() + "\n");
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) {
      out += "\n";
      if (blank || !lines[i].empty()) {
        out += pad;
      }
    }
    out += lines[i];
  }
  return Value::string(first ? pad + out : out);
}

Value to_int(const Value& v, const CallArgs& args) {
  const Value fallback = arg(args, 0, "default", Value::integer(0));
  if (v.is_number()) {
    return Value::integer(v.as_int());
  }
  if (v.is_string()) {
    const std::string s = py_strip(v.as_string(), std::nullopt, true, true);
    char* end = nullptr;
    const long long i = std::strtoll(s.c_str(), &end, 10);
    if (!s.empty() && end == s.c_str() + s.size()) {
      return Value::integer(i);
    }
    const double f = std::strtod(s.c_str(), &end);
    if (!s.empty() && end == s.c_str() + s.size()) {
      return Value::integer(static_cast<int64_t>(f));
    }
  }
  return fallback;
}

Value to_float(const Value& v, const CallArgs& args) {
  const Value fallback = arg(args, 0, "default", Value::number(0));
  if (v.is_number()) {
    return Value::number(v.as_float());
  }
  if (v.is_string()) {
    const std::string s = py_strip(v.as_string(), std::nullopt, true, true);
    char* end = nullptr;
    const double f = std::strtod(s.c_str(), &end);
    if (!s.empty() && end == s.c_str() + s.size()) {
      return Value::number(f);
    }
  }
  return fallback;
}

Value round_filter(const Value& v, const CallArgs& args) {
  const int64_t precision = int_arg(args, 0, "precision", 0);
  const std::string method = arg(args, 1, "method", Value::string("common")).str();
  const double scale = std::pow(10.0, static_cast<double>(precision));
  const double x = v.as_float() * scale;
  double r;
  if (method == "ceil") {
    r = std::ceil(x);
  } else if (method == "floor") {
    r = std::floor(x);
  } else {
    // Python's round(): halves to even (the default rounding mode).
    r = std::nearbyint(x);
  }
  return Value::number(r / scale);
}

Value min_max(const Value& target, const CallArgs& args, bool want_max) {
  const bool case_sensitive = bool_arg(args, 0, "case_sensitive", false);
  const std::optional<std::string> attribute = optional_string(args, 1, "attribute");
  const ValueList items = target.iterate();
  if (items.empty()) {
    return Value::undefined("min/max of an empty sequence");
  }
  size_t best = 0;
  for (size_t i = 1; i < items.size(); ++i) {
    const Value a = sort_key(items[i], attribute, case_sensitive);
    const Value b = sort_key(items[best], attribute, case_sensitive);
    if (want_max ? less_than(b, a) : less_than(a, b)) {
      best = i;
    }
  }
  return items[best];
}

}  // namespace

Value apply_filter(const std::string& name, const Value& target, const CallArgs& args) {
  if (name == "trim") {
    return Value::string(py_strip(target.str(), optional_string(args, 0, "chars"), true, true));
  }
  if (name == "upper") {
    return Value::string(py_upper(target.str()));
  }
  if (name == "lower") {
    return Value::string(py_lower(target.str()));
  }
  if (name == "capitalize") {
    return Value::string(py_capitalize(target.str()));
  }
  if (name == "title") {
    return Value::string(py_title(target.str()));
  }
  if (name == "length" || name == "count") {
    return Value::integer(target.length());
  }
  if (name == "first" || name == "last") {
    const ValueList items = target.iterate();
    if (items.empty()) {
      return Value::undefined("first/last of an empty sequence");
    }
    return name == "first" ? items.front() : items.back();
  }
  if (name == "join") {
    const std::string sep = arg(args, 0, "d", Value::string("")).str();
    const std::optional<std::string> attribute = optional_string(args, 1, "attribute");
    std::string out;
    bool first = true;
    for (const Value& item : target.iterate()) {
      out += (first ? "" : sep) + (attribute ? attribute_path(item, *attribute) : item).str();
      first = false;
    }
    return Value::string(std::move(out));
  }
  if (name == "default" || name == "d") {
    const bool boolean = bool_arg(args, 1, "boolean", false);
    if (target.is_undefined() || (boolean && !target.truthy())) {
      return arg(args, 0, "default_value", Value::string(""));
    }
    return target;
  }
  if (name == "items") {
    ValueList out;
    if (target.is_dict()) {
      for (const auto& [k, v] : target.as_dict().items) {
        out.push_back(Value::tuple({Value::string(k), v}));
      }
    } else if (!target.is_undefined()) {
      fail("items filter: " + target.repr() + " is not a mapping");
    }
    return Value::list(std::move(out));
  }
  if (name == "list") {
    return Value::list(target.iterate());
  }
  if (name == "string") {
    return Value::string(target.str());
  }
  if (name == "safe") {
    return target;
  }
  if (name == "escape" || name == "e" || name == "forceescape") {
    return Value::string(html_escape(target.str()));
  }
  if (name == "int") {
    return to_int(target, args);
  }
  if (name == "float") {
    return to_float(target, args);
  }
  if (name == "round") {
    return round_filter(target, args);
  }
  if (name == "abs") {
    return target.is_float() ? Value::number(std::fabs(target.as_float()))
                             : Value::integer(std::llabs(target.as_int()));
  }
  if (name == "replace") {
    const Value* count = args.get(2, "count");
    return Value::string(py_replace(target.str(), arg(args, 0, "old", Value()).str(),
                                    arg(args, 1, "new", Value()).str(),
                                    count && count->is_number() ? count->as_int() : -1));
  }
  if (name == "tojson") {
    // transformers' tojson(x, ensure_ascii=False, indent=None, separators=None,
    // sort_keys=False).
    JsonOptions options;
    options.ensure_ascii = bool_arg(args, 0, "ensure_ascii", false);
    const Value* indent_arg = args.get(1, "indent");
    if (indent_arg && indent_arg->is_number()) {
      options.indent = static_cast<int>(indent_arg->as_int());
    }
    const Value* separators = args.get(2, "separators");
    if (separators && !separators->is_none()) {
      if (!separators->is_list() || separators->as_list().size() != 2) {
        fail("tojson: separators must be a pair of strings");
      }
      options.separators.emplace(separators->as_list()[0].str(), separators->as_list()[1].str());
    }
    options.sort_keys = bool_arg(args, 3, "sort_keys", false);
    return Value::string(target.to_json(options));
  }
  if (name == "selectattr" || name == "rejectattr") {
    return select(target, args, true, name == "selectattr");
  }
  if (name == "select" || name == "reject") {
    return select(target, args, false, name == "select");
  }
  if (name == "map") {
    ValueList out;
    const std::optional<std::string> attribute = optional_string(args, 1000, "attribute");
    const Value* fallback = args.get(1000, "default");
    for (const Value& item : target.iterate()) {
      if (attribute) {
        Value v = attribute_path(item, *attribute);
        out.push_back(v.is_undefined() && fallback ? *fallback : v);
      } else {
        out.push_back(apply_filter(arg(args, 0, "", Value()).str(), item, rest_args(args, 1)));
      }
    }
    return Value::list(std::move(out));
  }
  if (name == "unique") {
    const bool case_sensitive = bool_arg(args, 0, "case_sensitive", false);
    const std::optional<std::string> attribute = optional_string(args, 1, "attribute");
    ValueList out;
    ValueList seen;
    for (const Value& item : target.iterate()) {
      const Value key = sort_key(item, attribute, case_sensitive);
      if (std::find(seen.begin(), seen.end(), key) == seen.end()) {
        seen.push_back(key);
        out.push_back(item);
      }
    }
    return Value::list(std::move(out));
  }
  if (name == "sort") {
    const bool reverse = bool_arg(args, 0, "reverse", false);
    const bool case_sensitive = bool_arg(args, 1, "case_sensitive", false);
    const std::optional<std::string> attribute = optional_string(args, 2, "attribute");
    ValueList items = target.iterate();
    std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
      const Value x = sort_key(a, attribute, case_sensitive);
      const Value y = sort_key(b, attribute, case_sensitive);
      return reverse ? less_than(y, x) : less_than(x, y);
    });
    return Value::list(std::move(items));
  }
  if (name == "reverse") {
    ValueList items = target.iterate();
    std::reverse(items.begin(), items.end());
    if (target.is_string()) {
      std::string out;
      for (const Value& c : items) {
        out += c.as_string();
      }
      return Value::string(std::move(out));
    }
    return Value::list(std::move(items));
  }
  if (name == "indent") {
    return indent(target, args);
  }
  if (name == "wordcount") {
    return Value::integer(count_words(target.str()));
  }
  if (name == "min" || name == "max") {
    return min_max(target, args, name == "max");
  }
  if (name == "sum") {
    const std::optional<std::string> attribute = optional_string(args, 0, "attribute");
    Value total = arg(args, 1, "start", Value::integer(0));
    for (const Value& item : target.iterate()) {
      total = binary_op("+", total, attribute ? attribute_path(item, *attribute) : item);
    }
    return total;
  }
  if (name == "format") {
    return percent_format(target.str(), args.positional);
  }
  if (name == "dictsort") {
    if (!target.is_dict()) {
      fail("dictsort: " + target.repr() + " is not a mapping");
    }
    const bool case_sensitive = bool_arg(args, 0, "case_sensitive", false);
    const bool by_value = arg(args, 1, "by", Value::string("key")).str() == "value";
    const bool reverse = bool_arg(args, 2, "reverse", false);
    ValueList items;
    for (const auto& [k, v] : target.as_dict().items) {
      items.push_back(Value::tuple({Value::string(k), v}));
    }
    std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
      const Value x = sort_key(a.as_list()[by_value ? 1 : 0], std::nullopt, case_sensitive);
      const Value y = sort_key(b.as_list()[by_value ? 1 : 0], std::nullopt, case_sensitive);
      return reverse ? less_than(y, x) : less_than(x, y);
    });
    return Value::list(std::move(items));
  }
  if (name == "batch") {
    const int64_t size = int_arg(args, 0, "linecount", 1);
    const Value* fill = args.get(1, "fill_with");
    ValueList out;
    ValueList row;
    for (const Value& item : target.iterate()) {
      row.push_back(item);
      if (static_cast<int64_t>(row.size()) == size) {
        out.push_back(Value::list(std::move(row)));
        row.clear();
      }
    }
    if (!row.empty()) {
      while (fill && !fill->is_none() && static_cast<int64_t>(row.size()) < size) {
        row.push_back(*fill);
      }
      out.push_back(Value::list(std::move(row)));
    }
    return Value::list(std::move(out));
  }
  fail("no filter named '" + name + "'");
}

}  // namespace crescent::model::jinja
