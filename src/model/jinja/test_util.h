#pragma once
// Renders a template for the jinja unit tests; the failure's message when it fails.

#include <nlohmann/json.hpp>
#include <string>

#include "model/jinja/template.h"

namespace crescent::model::jinja {

inline std::string render_text(const std::string& source, const nlohmann::ordered_json& vars =
                                                              nlohmann::ordered_json::object()) {
  auto t = Template::parse(source);
  if (!t.is_ok()) {
    return "PARSE ERROR: " + t.status().message();
  }
  auto r = t->render(vars);
  return r.is_ok() ? *r : "ERROR: " + r.status().message();
}

}  // namespace crescent::model::jinja
