#pragma once
// The `crescent` binary's subcommands. Each lives in its own apps/cmd_*.cc file and registers
// itself with CRESCENT_REGISTER_COMMAND; main() only dispatches.

#include <string>
#include <vector>

namespace crescent::apps {

struct Command {
  std::string name;     // "generate", or "bench engine" for a two-word command
  std::string summary;  // one line for `crescent --help`
  // args excludes the command words; returns the process exit code.
  int (*run)(const std::vector<std::string>& args);
};

bool register_command(Command command);
const std::vector<Command>& registered_commands();

}  // namespace crescent::apps

#define CRESCENT_REGISTER_COMMAND(ident, name, summary, fn)                                \
  namespace {                                                                              \
  const bool ident##_registered = ::crescent::apps::register_command({name, summary, fn}); \
  }
