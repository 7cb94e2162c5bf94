#!/usr/bin/env bash
# test.sh — builds two trees and runs every test in both:
#   build/       Release
#   build-asan/  Release + AddressSanitizer + UndefinedBehaviorSanitizer
# Exits non-zero if any configure, build or test step fails.
set -euo pipefail
cd "$(dirname "$0")/.."

jobs="${JOBS:-2}"
failed=()

run_tree() {
  local label="$1" dir="$2"
  shift 2
  echo
  echo "================================================================"
  echo "== $label: $dir"
  echo "================================================================"
  if cmake -S . -B "$dir" "$@" &&
     cmake --build "$dir" -j"$jobs" &&
     ctest --test-dir "$dir" --output-on-failure; then
    echo "== $label: OK"
  else
    echo "== $label: FAILED"
    failed+=("$label")
  fi
}

run_tree "Release" build -DCMAKE_BUILD_TYPE=Release
run_tree "ASan+UBSan" build-asan -DCMAKE_BUILD_TYPE=Release -DDSV4_SANITIZE=ON

echo
if [ "${#failed[@]}" -ne 0 ]; then
  echo "test.sh: FAILED: ${failed[*]}"
  exit 1
fi
echo "test.sh: all trees passed"
