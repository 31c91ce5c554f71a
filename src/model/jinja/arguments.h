#pragma once
// Reading a call's arguments the way Python binds them: by position, else by keyword, else a
// default. For the filters, tests, methods and globals (builtins.h, filters.h).

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "model/jinja/value.h"

namespace crescent::model::jinja {

// The argument at `index` or named `name`, else `fallback`.
const Value& arg(const CallArgs& args, size_t index, std::string_view name, const Value& fallback);
// The argument as a string; unset for a missing, None or undefined one.
std::optional<std::string> optional_string(const CallArgs& args, size_t index,
                                           std::string_view name);
int64_t int_arg(const CallArgs& args, size_t index, std::string_view name, int64_t fallback);
bool bool_arg(const CallArgs& args, size_t index, std::string_view name, bool fallback);
// A dotted attribute path ("function.name") looked up the way selectattr/map/sort do.
Value attribute_path(const Value& v, const std::string& path);
// The positional arguments from `from` on (a test's arguments after its name).
CallArgs rest_args(const CallArgs& args, size_t from);

}  // namespace crescent::model::jinja
