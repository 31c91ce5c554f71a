#pragma once
// Test models made by the real `crescent make-model` binary, once per build tree, shared by
// every test process (ctest runs tests in parallel: the model is written to a temporary
// directory and renamed into place, so a reader never sees a half-written model).

#include <string>

namespace crescent::testing {

// Returns the directory of the model made with `crescent make-model --preset preset --seed
// seed` (another seed: another checkpoint of the same shape). Aborts the test binary with a
// message if the model cannot be made.
std::string ensure_test_model(const std::string& preset, int seed = 0);

// Path of the built crescent binary.
std::string crescent_binary();

}  // namespace crescent::testing
