#!/usr/bin/env bash
# layers.sh — the include structure of src/ (ctest: test_layers). Dependencies
# run one way, from the top of this list to the bottom:
#
#   6  cli/, bench/     the dsv4 command; bench/ holds `dsv4 bench --kernels`
#                       (its own library, dsv4bench, linked by the command only;
#                       it parses options with cli/opts.h, so it sits beside cli/)
#   5  runtime/         backend choice, model loading (synth: included),
#                       generation, batching, the scheduler, the OpenAI API;
#      ep/launch.*, ep/follow.*
#                       expert parallelism's launch: every rank binds its
#                       share of the model, the followers run the leader's steps
#   4  model/           the DeepSeek-V4 forward pass over the backend interface
#   3  backend/         the compute interface and its CPU and CUDA backends
#   2  ep/ (the rest)   expert parallelism's MPI session, placement, the
#                       leader's messages and the exchange plan: plain
#                       communication, below the model that calls its exchange
#                       and the CUDA transport (backend/cuda/ep_nccl.cu) that
#                       carries a plan out
#   1  tensor/, format/, text/
#                       weights, config.json and safetensors, the tokenizer and
#                       chat templates (text/ is used by runtime/ and cli/)
#   0  common/          errors, files, clocks
#
# A file may include files of its own rank or below. Besides:
#   - no file-level #include cycle in src/;
#   - nothing in src/cli/ includes backend/cpu/... (backends are reached
#     through backend/backend.h and runtime/backend_select.h);
#   - backend/cuda/... is included only inside src/backend/cuda/, by
#     src/runtime/backend_select.c (which opens the backend), and by the CUDA
#     kernel benchmark src/bench/*.cu (which times the backend's kernels alone).
# Exits 1 naming each file and include at fault; 0 when there is none.
set -euo pipefail
cd "$(dirname "$0")/.."

list=$(mktemp)
trap 'rm -f "$list"' EXIT
# FILE<TAB>INCLUDED (as resolved: a path under src/, or the text as written
# when it names no file there: a generated file)
find src -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' \) | LC_ALL=C sort | while read -r f; do
  d=$(dirname "$f")
  sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$f" | while read -r inc; do
    if [ -f "src/$inc" ]; then
      printf '%s\t%s\t%s\n' "$f" "src/$inc" "$inc"
    elif [ -f "$d/$inc" ]; then
      printf '%s\t%s\t%s\n' "$f" "$(realpath --relative-to=. "$d/$inc")" "$inc"
    else
      printf '%s\t%s\t%s\n' "$f" "?" "$inc"
    fi
  done
done >"$list"

awk -F'\t' '
function rank(p) {
  if (p ~ /^src\/(cli|bench)\//) return 6
  if (p ~ /^src\/runtime\// || p ~ /^src\/ep\/(launch|follow)\.[ch]$/) return 5
  if (p ~ /^src\/model\//) return 4
  if (p ~ /^src\/backend\//) return 3
  if (p ~ /^src\/ep\//) return 2
  if (p ~ /^src\/(tensor|format|text)\//) return 1
  if (p ~ /^src\/common\//) return 0
  return -1
}
function bad(f, inc, why) { printf "layers.sh: %s: #include \"%s\": %s\n", f, inc, why; nbad++ }
# depth-first search for a cycle through u; stack holds the path
function visit(u,    i, j, v) {
  state[u] = 1
  path[++depth] = u
  for (i = 1; i <= nout[u]; i++) {
    v = out[u, i]
    if (state[v] == 1) {
      cyc = v
      for (j = depth; j >= 1 && path[j] != v; j--) cyc = path[j] " -> " cyc
      bad(u, incname[u, v], "an include cycle: " v " -> " cyc)
    } else if (!state[v]) visit(v)
  }
  depth--
  state[u] = 2
}
{
  f = $1; t = $2; inc = $3
  if (t == "?") next
  if (!((f, t) in incname)) { out[f, ++nout[f]] = t; incname[f, t] = inc; files[f] = 1 }
  if (f ~ /^src\/cli\// && t ~ /^src\/backend\/cpu\//)
    bad(f, inc, "the command reaches into the CPU backend (use backend/backend.h or runtime/)")
  if (t ~ /^src\/backend\/cuda\// && f !~ /^src\/backend\/cuda\// && f != "src/runtime/backend_select.c" && f !~ /^src\/bench\/.*\.cu$/)
    bad(f, inc, "the CUDA backend is opened by runtime/backend_select.c only")
  rf = rank(f); rt = rank(t)
  if (rf < 0) bad(f, inc, "a file outside the layers of scripts/layers.sh (add its directory there)")
  else if (rt < 0) bad(f, inc, "includes a file outside the layers of scripts/layers.sh")
  else if (rt > rf) bad(f, inc, sprintf("a layer includes one above it (rank %d includes rank %d; see scripts/layers.sh)", rf, rt))
}
END {
  n = 0
  for (f in files) order[++n] = f
  # a fixed order, so a report names the same cycle every time
  for (i = 2; i <= n; i++) { x = order[i]; for (j = i - 1; j >= 1 && order[j] > x; j--) order[j + 1] = order[j]; order[j + 1] = x }
  for (i = 1; i <= n; i++) if (!state[order[i]]) visit(order[i])
  if (nbad) { printf "layers.sh: %d violation%s\n", nbad, (nbad > 1 ? "s" : ""); exit 1 }
  printf "layers.sh: %d includes in %d files, no violation\n", NR, n
}' "$list"
