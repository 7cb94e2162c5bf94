#!/usr/bin/env bash
# test.sh — builds three trees and runs the tests:
#   build/           Release: every test; the CUDA backend compiles here when nvcc is
#                    found (it runs only on a GPU machine: scripts/gpu-test.sh)
#   build-asan/      Release + AddressSanitizer + UndefinedBehaviorSanitizer: every test
#   build-portable/  Release without SIMD (the portable kernels): the kernel,
#                    oracle and format tests
# Exits non-zero if any configure, build or test step fails.
set -euo pipefail
cd "$(dirname "$0")/.."

jobs="${JOBS:-2}"
failed=()

run_tree() { # label dir ctest-regex cmake-args...
  local label="$1" dir="$2" tests="$3"
  shift 3
  echo
  echo "================================================================"
  echo "== $label: $dir"
  echo "================================================================"
  if cmake -S . -B "$dir" "$@" &&
     cmake --build "$dir" -j"$jobs" &&
     ctest --test-dir "$dir" --output-on-failure -R "$tests"; then
    echo "== $label: OK"
  else
    echo "== $label: FAILED"
    failed+=("$label")
  fi
}

run_tree "Release" build . -DCMAKE_BUILD_TYPE=Release
run_tree "ASan+UBSan" build-asan . -DCMAKE_BUILD_TYPE=Release -DDSV4_SANITIZE=ON -DDSV4_CUDA=OFF
# the portable kernels alone (no SIMD): they build, agree with the oracle and
# handle every storage kind (the slow whole-model suites run in the trees above)
run_tree "Portable" build-portable "test_(kernels|reference|backend_errors|config|safetensors|chat|sampler|pinned_logits)\$" \
  -DCMAKE_BUILD_TYPE=Release -DDSV4_SIMD=OFF -DDSV4_CUDA=OFF

echo
if [ "${#failed[@]}" -ne 0 ]; then
  echo "test.sh: FAILED: ${failed[*]}"
  exit 1
fi
echo "test.sh: all trees passed"
