#!/usr/bin/env bash
# test.sh — builds four trees and runs the tests, then a fuzz smoke run:
#   build/           Release: every test; the CUDA backend compiles here when nvcc is
#                    found (it runs only on a GPU machine: scripts/gpu-test.sh)
#   build-asan/      Release + AddressSanitizer + UndefinedBehaviorSanitizer: every test
#   build-portable/  Release without SIMD (the portable kernels) and without MPI:
#                    the kernel, oracle and format tests, and a build without MPI
#                    started by mpirun (test_nompi)
#   build-clang/     clang Release: the kernel, oracle, format and text tests
#   build-fuzz/      clang + libFuzzer + ASan/UBSan: every fuzz target for
#                    FUZZ_SECONDS (default 20) from its seed corpus (scripts/fuzz.sh)
# Every tree builds with the full warning set and -Werror (DSV4_WERROR=ON) and
# the test-only fault hooks (DSV4_TEST_HOOKS=ON);
# scripts/format-check.sh checks .clang-format on the files it lists.
# Exits non-zero if any configure, build, test or fuzz step fails.
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

run_tree "Release" build . -DCMAKE_BUILD_TYPE=Release -DDSV4_WERROR=ON -DDSV4_TEST_HOOKS=ON
run_tree "ASan+UBSan" build-asan . -DCMAKE_BUILD_TYPE=Release -DDSV4_SANITIZE=ON -DDSV4_WERROR=ON -DDSV4_TEST_HOOKS=ON -DDSV4_CUDA=OFF
# the portable kernels alone (no SIMD, no MPI): they build, agree with the oracle and
# handle every storage kind (the slow whole-model suites run in the trees above)
run_tree "Portable" build-portable "test_(kernels|reference|backend_errors|config|safetensors|chat|sampler|pinned_logits|nompi)\$" \
  -DCMAKE_BUILD_TYPE=Release -DDSV4_SIMD=OFF -DDSV4_WERROR=ON -DDSV4_TEST_HOOKS=ON -DDSV4_CUDA=OFF -DDSV4_MPI=OFF
# the second compiler: clang builds everything warning-free and agrees on the fast suites
run_tree "Clang" build-clang "test_(kernels|reference|backend_errors|config|safetensors|chat|sampler|tokenizer|badinput|pinned_logits|opts|cli_help|grammar|mtp)\$" \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_COMPILER=clang -DDSV4_WERROR=ON -DDSV4_TEST_HOOKS=ON -DDSV4_CUDA=OFF

echo
if bash scripts/format-check.sh; then
  echo "== Format: OK"
else
  echo "== Format: FAILED"
  failed+=("Format")
fi

echo
echo "================================================================"
echo "== Fuzz smoke: build-fuzz"
echo "================================================================"
if bash scripts/fuzz.sh "${FUZZ_SECONDS:-20}"; then
  echo "== Fuzz smoke: OK"
else
  echo "== Fuzz smoke: FAILED"
  failed+=("Fuzz smoke")
fi

echo
if [ "${#failed[@]}" -ne 0 ]; then
  echo "test.sh: FAILED: ${failed[*]}"
  exit 1
fi
echo "test.sh: all trees passed"
