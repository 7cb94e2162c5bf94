#!/usr/bin/env bash
# test_nompi.sh — a build without MPI (-DDSV4_MPI=OFF; registered only in
# such builds: CMakeLists.txt) says so in `dsv4 info`, and refuses to run
# when a launcher started it as one of several ranks (each rank would run
# the whole model alone and write the same outputs): a message naming the
# launcher's variable and the fix, exit 1, nothing written. One rank is fine.
set -u
bin="$1"
src="$2"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
. "$(dirname "$0")/check_lib.sh"

if "$bin" info -m "$src/models/kjv" >"$tmp/info" 2>&1 && grep -q "^ranks *one process (no MPI in this build)" "$tmp/info"; then
  ok "info: one process (no MPI in this build)"
else
  bad "info does not say the build has no MPI"; cat "$tmp/info"
fi

for v in OMPI_COMM_WORLD_SIZE=2 PMI_SIZE=3 MV2_COMM_WORLD_SIZE=4; do
  n="${v#*=}"
  env "$v" "$bin" logits -m "$src/models/kjv" --tokens 1,2,3 -o "$tmp/out" >"$tmp/o" 2>"$tmp/e"
  rc=$?
  if [ "$rc" -eq 1 ] && grep -q "started as one of $n MPI ranks ($v), but this build has no MPI" "$tmp/e" &&
    grep -q -- "-DDSV4_MPI=ON" "$tmp/e" && ! ls "$tmp"/out* >/dev/null 2>&1; then
    ok "$v: refused (exit 1, the variable and the fix named, nothing written)"
  else
    bad "$v: rc $rc, nothing refused"; cat "$tmp/e"
  fi
done

if OMPI_COMM_WORLD_SIZE=1 "$bin" logits -m "$src/models/kjv" --tokens 1,2,3 -o "$tmp/one" >/dev/null 2>"$tmp/e" &&
  [ -s "$tmp/one.0.f32" ]; then
  ok "OMPI_COMM_WORLD_SIZE=1: one rank runs"
else
  bad "OMPI_COMM_WORLD_SIZE=1: did not run"; cat "$tmp/e"
fi

finish
