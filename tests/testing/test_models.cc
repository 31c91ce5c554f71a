#include "testing/test_models.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace crescent::testing {

std::string crescent_binary() {
  return std::string(CRESCENT_BINARY_DIR) + "/apps/crescent";
}

std::string test_models_dir() {
  return CRESCENT_TEST_MODELS_DIR;
}

std::string ensure_test_model(const std::string& preset, int seed) {
  namespace fs = std::filesystem;
  const fs::path root = test_models_dir();
  const std::string name = seed == 0 ? preset : preset + "-seed" + std::to_string(seed);
  const fs::path dir = root / name;
  if (fs::exists(dir / "config.json"))
    return dir.string();
  fs::create_directories(root);
  const fs::path tmp = root / (name + ".tmp." + std::to_string(::getpid()));
  std::string cmd = crescent_binary() + " make-model --preset " + preset + " --seed " +
                    std::to_string(seed) + " --out " + tmp.string() + " > " + tmp.string() +
                    ".log 2>&1";
  if (std::system(cmd.c_str()) != 0) {
    std::fprintf(stderr, "cannot make test model '%s': %s failed (see %s.log)\n", preset.c_str(),
                 cmd.c_str(), tmp.string().c_str());
    std::abort();
  }
  std::error_code ec;
  fs::rename(tmp, dir, ec);  // loses the race harmlessly if another process got there first
  if (ec)
    fs::remove_all(tmp);
  fs::remove(tmp.string() + ".log", ec);
  return dir.string();
}

}  // namespace crescent::testing
