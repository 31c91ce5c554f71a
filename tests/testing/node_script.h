#pragma once
// Runs a Node.js script of the source tree (tests that drive crescent with the official
// `openai` npm client from tools/npm) and collects what it printed.

#include <string>
#include <vector>

namespace crescent::testing {

// gtest failures (fatal in the caller's test) when node or tools/npm/node_modules/openai is
// missing: scripts/setup.sh installs both, so their absence is a broken setup, not a skip.
void require_node_and_openai();

// Runs `node CRESCENT_SOURCE_DIR/script args... 2>&1`. True when it exited 0 and printed
// `success_line`; *out gets everything it printed.
bool run_node_script(const std::string& script, const std::vector<std::string>& args,
                     const std::string& success_line, std::string* out);

}  // namespace crescent::testing
