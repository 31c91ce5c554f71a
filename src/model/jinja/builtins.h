#pragma once
// jinja2's tests and globals, transformers' raise_exception and strftime_now, Python's operators
// on values, and the Python str/dict methods templates call. Errors are jinja::Error. (The
// filters are in filters.h.)

#include <optional>
#include <string>

#include "model/jinja/value.h"

namespace crescent::model::jinja {

// `target is name(args)`; an error for an unknown test.
bool apply_test(const std::string& name, const Value& target, const CallArgs& args);
// Whether `name` is a method of `target`'s Python type (str.strip, dict.items, ...).
bool has_method(const Value& target, const std::string& name);
// target.name(args) for a method that has_method() accepts.
Value call_method(const Value& target, const std::string& name, const CallArgs& args);
// range, namespace, dict, raise_exception, strftime_now.
ValueDict make_globals();

// Python's binary operators on values: + - * / // % ** and `in`.
Value binary_op(const std::string& op, const Value& a, const Value& b);
bool contains(const Value& container, const Value& item);
// Python's printf-style `fmt % args` (%s %r %d %i %x %f %e %g %%, with flags and widths).
Value percent_format(const std::string& fmt, const ValueList& args);

}  // namespace crescent::model::jinja
