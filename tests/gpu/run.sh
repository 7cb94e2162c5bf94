#!/usr/bin/env bash
# run.sh PROBE TEST [ARGS...] — ctest's runner of the GPU tests (LABELS gpu):
# exits 77 (skipped) when PROBE finds no CUDA device, else runs TEST.
probe=$1
shift
"$probe" || exit 77
exec "$@"
