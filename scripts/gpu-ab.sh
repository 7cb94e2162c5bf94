#!/usr/bin/env bash
# gpu-ab.sh BASE NEW [ROUNDS] — two builds of dsv4 side by side on one GPU:
# whether NEW gives BASE's bits, then `dsv4 bench` alternating between them.
# BASE, NEW: folders with dsv4 and lib/ (what gpu-pack.sh packs as b/), e.g.
#   tar -xJf base.tar.xz -C /tmp/base && tar -xJf new.tar.xz -C /tmp/new &&
#   scripts/gpu-ab.sh /tmp/base/b /tmp/new/b 3
# The model is written once (dsv4 synth, by NEW) and read by every run, so a
# round costs the bench itself, not the ~16 GB of random weights that
# -m synth:flash:4 builds on every run.
# Environment:
#   AB_MODEL     the model (default: flash 4 layers, written once to AB_DIR)
#   AB_DIR       where that model is written (default /dev/shm/dsv4-ab-flash4 where
#                /dev/shm has 20 GB free, else $TMPDIR or /tmp)
#   AB_BACKEND   cuda (default) or cpu
#   AB_BENCH     bench's arguments (default: --prompt 512 --gen 128 --batch 8)
#   AB_TIMEOUT   seconds a run of dsv4 may take (default 120; the synth: 600)
#   AB_ENV_BASE, AB_ENV_NEW  VAR=value words for BASE's / NEW's runs: one build
#                against itself under two settings, e.g. BASE = NEW and
#                AB_ENV_BASE=DSV4_CUDA_STRM_PIECES=1
# Bits: the logits of two sequences token by token (graphs), in chunks of 7 and
# whole, and of the bundled model, cmp'ed; "same bits" or "DIFFERENT" each.
# Speed: each round runs BASE then NEW (odd rounds) or NEW then BASE (even),
# and the summary gives each binary's batch-1 ms/token (each run, the mean).
set -uo pipefail
[ $# -ge 2 ] || { echo "usage: gpu-ab.sh BASE NEW [ROUNDS]" >&2; exit 2; }
ROUNDS=${3:-3}
for d in "$1" "$2"; do
  [ -x "$d/dsv4" ] || { echo "gpu-ab: $d/dsv4 missing (a gpu-pack.sh folder: dsv4 and lib/)" >&2; exit 2; }
done
BASE=$(cd "$1" && pwd) NEW=$(cd "$2" && pwd)
MODEL=${AB_MODEL:-}
[ -z "$MODEL" ] || MODEL=$(realpath "$MODEL")
case "$ROUNDS" in '' | *[!0-9]*) echo "gpu-ab: ROUNDS must be a number, not '$ROUNDS'" >&2; exit 2 ;; esac
BACKEND=${AB_BACKEND:-cuda}
BENCH=${AB_BENCH:---prompt 512 --gen 128 --batch 8}
TMO=${AB_TIMEOUT:-120}
cd "$(dirname "$0")/.."
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
LDP=${LD_LIBRARY_PATH:-}
EB=${AB_ENV_BASE:-} EN=${AB_ENV_NEW:-}
for w in $EB $EN; do
  [[ "$w" == [A-Za-z_]*=* ]] || { echo "gpu-ab: AB_ENV_BASE / AB_ENV_NEW take VAR=value words, not '$w'" >&2; exit 2; }
done
# run DIR VARS dsv4-args...: VARS (unquoted: VAR=value words) for that run only
# shellcheck disable=SC2086
run() { local d=$1 e=$2; shift 2; env $e LD_LIBRARY_PATH="$d/lib:/usr/local/cuda/lib64:$LDP" timeout "$TMO" "$d/dsv4" "$@"; }

if [ -z "$MODEL" ]; then
  # /dev/shm where it has room for the ~16 GB (a container's may be small), else /tmp
  room=$(df -Pk /dev/shm 2>/dev/null | awk 'NR == 2 {print $4}')
  def=/dev/shm/dsv4-ab-flash4
  [ -f "$def/model.safetensors.index.json" ] || [ "${room:-0}" -ge $((20 * 1024 * 1024)) ] ||
    def=${TMPDIR:-/tmp}/dsv4-ab-flash4
  MODEL=${AB_DIR:-$def}
  # the index is the writer's last file: without it the model is incomplete
  if [ ! -f "$MODEL/model.safetensors.index.json" ]; then
    echo "gpu-ab: writing the flash 4-layer synth to $MODEL"
    TMO=600 run "$NEW" "" synth --like flash --layers 4 -o "$MODEL" || { echo "gpu-ab: dsv4 synth failed" >&2; exit 1; }
  fi
fi
echo "gpu-ab: model $MODEL, backend $BACKEND, $(command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
echo "gpu-ab: base $BASE${EB:+ with $EB}, new $NEW${EN:+ with $EN}"

# ---- bits
# 40 tokens spread over the model's vocabulary (at most 6000: the bundled model's)
toks() { python3 -c "import json,sys; v=min(6000,json.load(open(sys.argv[1]+'/config.json'))['vocab_size']); print(','.join(str((i * 7919 + 13) % v) for i in range(40)))" "$1"; }
tm=$(toks "$MODEL") tk=$(toks models/kjv) || { echo "gpu-ab: cannot read the models' config.json" >&2; exit 1; }
fail=0
for v in base new; do
  d=$BASE e=$EB; [ $v = new ] && d=$NEW e=$EN
  run "$d" "$e" logits -m "$MODEL" --backend "$BACKEND" --tokens "$tm" --tokens 5,6,7,8,9 --prefill-chunk 1 -o "$W/$v.c1" >/dev/null 2>"$W/$v.err" &&
    run "$d" "$e" logits -m "$MODEL" --backend "$BACKEND" --tokens "$tm" --tokens 5,6,7,8,9 --prefill-chunk 7 -o "$W/$v.c7" >/dev/null 2>>"$W/$v.err" &&
    run "$d" "$e" logits -m "$MODEL" --backend "$BACKEND" --tokens "$tm" --tokens 5,6,7,8,9 -o "$W/$v.whole" >/dev/null 2>>"$W/$v.err" &&
    run "$d" "$e" logits -m models/kjv --backend "$BACKEND" --tokens "$tk" -o "$W/$v.kjv" >/dev/null 2>>"$W/$v.err" ||
    { echo "gpu-ab: $v's logits failed:"; tail -3 "$W/$v.err"; fail=1; }
done
if [ $fail = 0 ]; then
  for f in c1.0 c1.1 c7.0 c7.1 whole.0 whole.1 kjv.0; do
    if cmp -s "$W/base.$f.f32" "$W/new.$f.f32"; then echo "same bits  $f"; else echo "DIFFERENT  $f"; fail=1; fi
  done
fi

# ---- speed
for r in $(seq 1 "$ROUNDS"); do
  order="base new"; [ $((r % 2)) = 0 ] && order="new base"
  for v in $order; do
    d=$BASE e=$EB; [ $v = new ] && d=$NEW e=$EN
    # shellcheck disable=SC2086
    out=$(run "$d" "$e" bench -m "$MODEL" --backend "$BACKEND" $BENCH 2>&1)
    line=$(printf '%s\n' "$out" | grep -E '^decode .* ms/token' | head -1)
    [ -n "$line" ] || { echo "gpu-ab: round $r $v: no decode line"; printf '%s\n' "$out" | tail -3; continue; }
    printf 'round %d %-4s %s\n' "$r" "$v" "$line"
    printf '%s\n' "$out" | grep -E '^batch +[0-9]+ +decode' | sed "s/^/round $r $v /"
    printf '%s %s\n' "$v" "$(printf '%s\n' "$line" | sed -E 's/.*: ([0-9.]+) ms\/token.*/\1/')" >>"$W/ms"
  done
done
if [ -s "$W/ms" ]; then
  awk '{ s[$1] += $2; n[$1]++; l[$1] = l[$1] " " $2 }
       END { for (v in s) printf "%-4s batch 1 ms/token:%s  (mean %.3f)\n", v, l[v], s[v] / n[v] }' "$W/ms" | sort
fi
exit $fail
