#pragma once
// A Jinja2 template as transformers compiles chat templates: an immutable sandboxed jinja2
// environment with trim_blocks, lstrip_blocks and loop controls, the globals raise_exception,
// strftime_now, range, namespace and dict, and transformers' tojson filter. parse() once, then
// render() any number of times, from any thread. Every error (syntax, unknown tag or filter,
// type error, raise_exception) is an InvalidArgument whose message names the template line.

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "core/status.h"

namespace crescent::model::jinja {

struct Stmt;

class Template {
 public:
  static Result<Template> parse(std::string_view source);

  // `variables` is a JSON object whose members are the template's variables.
  Result<std::string> render(const nlohmann::ordered_json& variables) const;

 private:
  explicit Template(std::shared_ptr<const std::vector<std::unique_ptr<Stmt>>> body)
      : body_(std::move(body)) {}
  std::shared_ptr<const std::vector<std::unique_ptr<Stmt>>> body_;
};

}  // namespace crescent::model::jinja
