#!/usr/bin/env bash
# bench-long.sh — prefill and decode speed against the context length: one
# `dsv4 bench` per length on the same model, and a table of prefill tokens/s
# and decode ms/token at each length next to their values at the first length
# (the reference, 4,096 tokens by default).
#   scripts/bench-long.sh [-m DIR | --synth NAME:LAYERS] [--lengths 4096,8192,...] [--gen N]
#                         [bench options: --backend cuda, --threads N, ...]
# A --synth model is written once to a scratch directory (DSV4_BENCH_DIR,
# default /dev/shm, removed afterwards) instead of being built for every
# length. DSV4=path/to/dsv4 picks the binary (default build/dsv4).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${DSV4:-build/dsv4}
lengths=4096,8192,32768,131072,524288,1048576
gen=16
model= synth=
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    -m | --model) model=$2; shift 2 ;;
    --synth) synth=$2; shift 2 ;;
    --lengths) lengths=$2; shift 2 ;;
    --gen) gen=$2; shift 2 ;;
    -h | --help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) extra+=("$1"); shift ;;
  esac
done
[ -x "$bin" ] || { echo "bench-long: $bin: no such binary (build first, or set DSV4)" >&2; exit 2; }
[ -n "$model" ] || [ -n "$synth" ] || { echo "bench-long: give -m DIR or --synth NAME:LAYERS" >&2; exit 2; }
[[ "$lengths" =~ ^[0-9]+(,[0-9]+)*$ ]] || { echo "bench-long: --lengths $lengths: a list of token counts" >&2; exit 2; }
if [ -n "$synth" ]; then
  like=${synth%%:*} layers=
  [ "$like" != "$synth" ] && layers=${synth#*:}
  model=$(mktemp -d "${DSV4_BENCH_DIR:-/dev/shm}/dsv4-bench-long.XXXXXX")
  trap 'rm -rf "$model"' EXIT
  echo "bench-long: writing synth $synth to $model"
  "$bin" synth --like "$like" ${layers:+--layers "$layers"} -o "$model" >/dev/null
fi
rows=()
first_p= first_d=
for L in ${lengths//,/ }; do
  echo "---- context $L"
  out=$("$bin" bench -m "$model" --prompt "$L" --gen "$gen" "${extra[@]}" 2>&1) || {
    echo "$out" | tail -5
    rows+=("$(printf '%9s | %s' "$L" "failed: $(echo "$out" | tail -1)")")
    continue
  }
  echo "$out" | grep -E '^(prefill|decode|memory) '
  # prefill: "... tokens/s" (first number before tokens/s); decode: "... ms/token"
  p=$(echo "$out" | grep -m1 '^prefill' | grep -oE '[0-9.]+ tokens/s' | head -1 | cut -d' ' -f1)
  d=$(echo "$out" | grep -m1 '^decode' | grep -oE '[0-9.]+ ms/token' | head -1 | cut -d' ' -f1)
  mem=$(echo "$out" | grep -m1 "the sequence's state" | grep -oE "state [0-9.]+ GB" | cut -d" " -f2 || true)
  [ -n "$first_p" ] || first_p=$p first_d=$d
  rows+=("$(awk -v L="$L" -v p="$p" -v d="$d" -v fp="$first_p" -v fd="$first_d" -v m="${mem:--}" \
    'BEGIN { printf "%9d | %12.0f | %6.2fx | %10.3f | %6.2fx | %s", L, p, p / fp, d, d / fd, m }')")
done
echo
echo "context   | prefill tok/s | vs first | decode ms/token | vs first | state GB"
printf '%s\n' "${rows[@]}"
