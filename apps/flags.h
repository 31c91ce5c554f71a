#pragma once
// A small command-line flag parser for the subcommands: --name VALUE or --name=VALUE,
// boolean --name / --no-name, typed values checked at parse time, and generated --help text.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/status.h"

namespace crescent::apps {

class FlagParser {
 public:
  FlagParser(std::string usage_line, std::string description);

  // Registers a flag bound to *target, which holds the default value.
  void add(const std::string& name, std::string* target, const std::string& help);
  void add(const std::string& name, int64_t* target, const std::string& help);
  void add(const std::string& name, int* target, const std::string& help);
  void add(const std::string& name, double* target, const std::string& help);
  void add(const std::string& name, bool* target, const std::string& help);
  // A flag that may repeat: every value is appended.
  void add_repeated(const std::string& name, std::vector<std::string>* target,
                    const std::string& help);
  // Marks a flag as required (an error if absent).
  void require(const std::string& name);

  // Parses args. Positional arguments are collected into positional(). A --help request
  // returns OK and sets help_requested().
  Status parse(const std::vector<std::string>& args);
  bool help_requested() const { return help_requested_; }
  const std::vector<std::string>& positional() const { return positional_; }
  bool was_set(const std::string& name) const;
  std::string help_text() const;

  // Parses, prints help or the error; returns -1 to continue, else the exit code to return.
  int parse_or_exit_code(const std::vector<std::string>& args);

 private:
  enum class Kind { kString, kInt64, kInt, kDouble, kBool, kRepeated };
  struct Flag {
    Kind kind;
    void* target;
    std::string help;
    std::string default_text;
    bool required = false;
    bool set = false;
  };
  Status assign(const std::string& name, Flag& flag, const std::string& value);

  std::string usage_line_;
  std::string description_;
  std::map<std::string, Flag> flags_;
  std::vector<std::string> order_;
  std::vector<std::string> positional_;
  bool help_requested_ = false;
};

}  // namespace crescent::apps
