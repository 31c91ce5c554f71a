#pragma once
// jinja2's filters (trim, join, selectattr, map, sort, indent, ...) with transformers' tojson.
// Errors are jinja::Error.

#include <string>

#include "model/jinja/value.h"

namespace crescent::model::jinja {

// `target | name(args)`; an error for an unknown filter.
Value apply_filter(const std::string& name, const Value& target, const CallArgs& args);

}  // namespace crescent::model::jinja
