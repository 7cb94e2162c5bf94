#!/usr/bin/env bash
# gpu-test.sh — builds the CUDA backend and runs the GPU tests, then prints a
# summary. On the lease machine (CUDA 13, maybe without libcjson / libpcre2,
# which the CPU targets need at configure time) pass a build made elsewhere:
#   DSV4_CUDA_BUILD=/path/to/build-cuda scripts/gpu-test.sh   (skips the build)
# Other variables: BUILD_DIR (default build-cuda), JOBS (default 2), BENCH=1
# (also time the decode products: GB/s per storage kind at T = 1, 8, 64, 256).
# The CUDA runtime is linked statically: the binaries need only the driver.
# If a shared CUDA library is still not found at run time:
#   export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH
set -u
cd "$(dirname "$0")/.."
JOBS=${JOBS:-2}
if [ -n "${DSV4_CUDA_BUILD:-}" ]; then
  B=$DSV4_CUDA_BUILD
  echo "gpu-test: using the prebuilt $B"
else
  B=${BUILD_DIR:-build-cuda}
  NVCC=/usr/local/cuda/bin/nvcc
  extra=()
  [ -x "$NVCC" ] && extra+=(-DCMAKE_CUDA_COMPILER="$NVCC")
  cmake -S . -B "$B" -DDSV4_CUDA=ON "${extra[@]}" >"$B.configure.log" 2>&1 ||
    { echo "gpu-test: configure failed (see $B.configure.log)"; tail -20 "$B.configure.log"; exit 1; }
  cmake --build "$B" -j"$JOBS" --target dsv4cuda test_cuda_ops ||
    { echo "gpu-test: build failed"; exit 1; }
fi
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

failed=0
summary=()
run() { # name command...
  local name=$1; shift
  local log; log=$(mktemp)
  "$@" 2>&1 | tee "$log"
  local rc=${PIPESTATUS[0]}
  local last; last=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$log" | tail -1)
  rm -f "$log"
  case $rc in
    0) summary+=("PASS $name ${last:+($last)}") ;;
    77) summary+=("SKIP $name (no GPU)") ;;
    *) summary+=("FAIL $name rc=$rc ${last:+($last)}"); failed=1 ;;
  esac
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true
run test_cuda_ops "$B/test_cuda_ops" ${BENCH:+--bench}

echo "---- gpu-test summary ----"
printf '%s\n' "${summary[@]}"
exit $failed
