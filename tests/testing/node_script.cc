#include "testing/node_script.h"

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>

namespace crescent::testing {

void require_node_and_openai() {
  ASSERT_EQ(std::system("command -v node > /dev/null 2>&1"), 0)
      << "node is not installed: run scripts/setup.sh";
  ASSERT_EQ(
      std::system(("test -d " + std::string(CRESCENT_SOURCE_DIR) + "/tools/npm/node_modules/openai")
                      .c_str()),
      0)
      << "tools/npm/node_modules/openai is missing: run scripts/setup.sh";
}

bool run_node_script(const std::string& script, const std::vector<std::string>& args,
                     const std::string& success_line, std::string* out) {
  std::string cmd = "node " + std::string(CRESCENT_SOURCE_DIR) + "/" + script;
  for (const std::string& a : args) {
    cmd += " '" + a + "'";  // the tests' own arguments: URLs, model names, keys
  }
  cmd += " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) {
    return false;
  }
  char buf[512];
  while (fgets(buf, sizeof(buf), p) != nullptr) {
    *out += buf;
  }
  const int rc = pclose(p);
  return WIFEXITED(rc) && WEXITSTATUS(rc) == 0 && out->find(success_line) != std::string::npos;
}

}  // namespace crescent::testing
