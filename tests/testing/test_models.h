#pragma once
// Test models made by the real `crescent make-model` binary, once, in test_models_dir(), shared
// by every test process (ctest runs tests in parallel: the model is written to a temporary
// directory and renamed into place, so a reader never sees a half-written model) and, with the
// CMake presets, by the release and sanitizer trees: make-model writes the same bytes whichever
// build runs it.

#include <string>

namespace crescent::testing {

// Returns the directory of the model made with `crescent make-model --preset preset --seed
// seed` (another seed: another checkpoint of the same shape). Aborts the test binary with a
// message if the model cannot be made.
std::string ensure_test_model(const std::string& preset, int seed = 0);

// The directory the test models live in (CMake's CRESCENT_TEST_MODELS_DIR; default
// <build tree>/test-models, build/test-models with the presets).
std::string test_models_dir();

// Path of the built crescent binary.
std::string crescent_binary();

}  // namespace crescent::testing
