#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds the release and sanitizer trees and
# runs every test in each. Exits non-zero on any failure.
#   scripts/test.sh            release + ASan/UBSan + TSan (what CI runs)
#   scripts/test.sh release    one preset only (release, asan or tsan)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh

presets=("$@")
if ((${#presets[@]} == 0)); then presets=(release asan tsan); fi
jobs=$(nproc)

for preset in "${presets[@]}"; do
  echo "== $preset: configure + build"
  cmake --preset "$preset" >/dev/null
  cmake --build --preset "$preset" -j "$jobs"
  echo "== $preset: test"
  label_args=()
  # The sanitizer trees run the unit and multi-process tests but not the slow model-size ones.
  if [ "$preset" != release ]; then label_args=(-LE slow); fi
  ctest --preset "$preset" -j "$jobs" --timeout 600 "${label_args[@]}"
done
echo "== all test presets passed: ${presets[*]}"
