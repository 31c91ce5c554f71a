#include "model/jinja/template.h"

#include <exception>

#include "model/jinja/evaluator.h"
#include "model/jinja/parser.h"

namespace crescent::model::jinja {
namespace {

Status template_error(const std::string& message, int line) {
  return invalid_argument("chat template error at line " + std::to_string(line) + ": " + message);
}

}  // namespace

Result<Template> Template::parse(std::string_view source) {
  try {
    return Template(std::make_shared<const StmtList>(jinja::parse(source)));
  } catch (const Error& e) {
    return template_error(e.what(), e.line());
  } catch (const std::exception& e) {
    return template_error(e.what(), 0);
  }
}

Result<std::string> Template::render(const nlohmann::ordered_json& variables) const {
  ValueDict vars;
  if (variables.is_object()) {
    for (const auto& [k, v] : variables.items()) {
      vars.set(k, Value::from_json(v));
    }
  }
  Evaluator evaluator(std::move(vars));
  try {
    return evaluator.render(*body_);
  } catch (const Error& e) {
    return template_error(e.what(), e.line() ? e.line() : evaluator.line());
  } catch (const std::exception& e) {
    return template_error(e.what(), evaluator.line());
  }
}

}  // namespace crescent::model::jinja
