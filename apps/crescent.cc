// main() of the `crescent` binary: finds the subcommand and runs it.

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "apps/command.h"

namespace crescent::apps {

namespace {
std::vector<Command>& commands() {
  static std::vector<Command> all;
  return all;
}

void print_usage(FILE* out) {
  std::fprintf(out,
               "crescent: LLM serving with disaggregated prefill and decode\n\n"
               "usage: crescent COMMAND [ARGS...]   (crescent COMMAND --help for its flags)\n\n"
               "commands:\n");
  std::vector<Command> sorted = commands();
  std::sort(sorted.begin(), sorted.end(),
            [](const Command& a, const Command& b) { return a.name < b.name; });
  for (const auto& c : sorted) {
    std::fprintf(out, "  %-18s %s\n", c.name.c_str(), c.summary.c_str());
  }
}
}  // namespace

bool register_command(Command command) {
  commands().push_back(std::move(command));
  return true;
}

const std::vector<Command>& registered_commands() {
  return commands();
}

int dispatch(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    print_usage(args.empty() ? stderr : stdout);
    return args.empty() ? 2 : 0;
  }
  // Two-word commands ("bench engine") take precedence over one-word ones.
  for (size_t words = 2; words >= 1; --words) {
    if (args.size() < words)
      continue;
    std::string name = args[0];
    for (size_t i = 1; i < words; ++i) {
      name += " " + args[i];
    }
    for (const auto& c : commands()) {
      if (c.name == name) {
        return c.run(std::vector<std::string>(args.begin() + static_cast<long>(words), args.end()));
      }
    }
  }
  std::fprintf(stderr, "crescent: unknown command '%s'\n\n", args[0].c_str());
  print_usage(stderr);
  return 2;
}

}  // namespace crescent::apps

int main(int argc, char** argv) {
  return crescent::apps::dispatch(argc, argv);
}
