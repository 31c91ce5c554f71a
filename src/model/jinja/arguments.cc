#include "model/jinja/arguments.h"

#include "model/jinja/strings.h"

namespace crescent::model::jinja {

const Value& arg(const CallArgs& args, size_t index, std::string_view name, const Value& fallback) {
  const Value* v = args.get(index, name);
  return v ? *v : fallback;
}

std::optional<std::string> optional_string(const CallArgs& args, size_t index,
                                           std::string_view name) {
  const Value* v = args.get(index, name);
  if (v == nullptr || v->is_none() || v->is_undefined()) {
    return std::nullopt;
  }
  return v->str();
}

int64_t int_arg(const CallArgs& args, size_t index, std::string_view name, int64_t fallback) {
  const Value* v = args.get(index, name);
  return v && v->is_number() ? v->as_int() : fallback;
}

bool bool_arg(const CallArgs& args, size_t index, std::string_view name, bool fallback) {
  const Value* v = args.get(index, name);
  return v ? v->truthy() : fallback;
}

Value attribute_path(const Value& v, const std::string& path) {
  Value cur = v;
  for (const std::string& part : py_split(path, std::string("."), -1)) {
    if (!cur.is_dict()) {
      return Value::undefined("no attribute '" + part + "'");
    }
    const Value* next = cur.as_dict().find(part);
    if (next == nullptr) {
      return Value::undefined("'dict object' has no attribute '" + part + "'");
    }
    cur = *next;
  }
  return cur;
}

CallArgs rest_args(const CallArgs& args, size_t from) {
  CallArgs rest;
  for (size_t i = from; i < args.positional.size(); ++i) {
    rest.positional.push_back(args.positional[i]);
  }
  return rest;
}

}  // namespace crescent::model::jinja
