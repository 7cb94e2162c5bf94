#!/usr/bin/env bash
# test_backend_cli.sh — choosing a backend: `info` names the backends of the
# build; an unknown backend, and `cuda` where the build has none or the
# machine has no GPU, end in one clear line naming the backend, exit 1, no
# crash; the CPU named explicitly gives the default's bits.
set -uo pipefail
bin="$1"
src="$2"
T="$(mktemp -d)"
trap 'rm -rf "$T"' EXIT
. "$(dirname "$0")/check_lib.sh"
m="$src/tests/fixtures/q128"

"$bin" info -m "$m" >"$T/info" 2>&1 && grep -q "^backends   cpu" "$T/info" && ok || bad "info lacks the backends line"
"$bin" logits -m "$m" --tokens 1,2,3 -o "$T/a" --backend tpu >"$T/out" 2>&1
rc=$?
[ "$rc" -eq 1 ] && ok || bad "--backend tpu: exit $rc, want 1"
grep -q "unknown backend 'tpu' (this build has: cpu" "$T/out" && ok || bad "--backend tpu: $(cat "$T/out")"
"$bin" logits -m "$m" --tokens 1,2,3 -o "$T/a" --backend cpu >/dev/null 2>&1 && ok || bad "--backend cpu failed"
"$bin" logits -m "$m" --tokens 1,2,3 -o "$T/b" >/dev/null 2>&1 && cmp -s "$T/a.0.f32" "$T/b.0.f32" && ok ||
  bad "--backend cpu differs from the default"
# cuda: either not built, or built and (on this machine) no usable GPU; with a
# GPU (the lease machine) it must run
"$bin" logits -m "$m" --tokens 1,2,3 -o "$T/c" --backend cuda >"$T/out" 2>&1
rc=$?
if grep -q "cpu cuda" "$T/info"; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    [ "$rc" -eq 0 ] && ok || bad "--backend cuda on a GPU machine: $(cat "$T/out")"
  else
    [ "$rc" -eq 1 ] && grep -q "^dsv4 logits: cuda" "$T/out" && ok || bad "--backend cuda without a GPU: rc $rc: $(cat "$T/out")"
  fi
else
  [ "$rc" -eq 1 ] && grep -q "this build has no CUDA backend" "$T/out" && ok || bad "--backend cuda, not built: $(cat "$T/out")"
fi
"$bin" logits -m "$m" --tokens 1,2 -o "$T/d" --gpu -1 >"$T/out" 2>&1
[ $? -eq 2 ] && ok || bad "--gpu -1 should be a usage error: $(cat "$T/out")"
finish
