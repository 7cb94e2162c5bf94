#!/usr/bin/env bash
# bench-serve.sh — the server's decode throughput against the engine alone.
#
#   scripts/bench-serve.sh [-b BUILD] [-m MODEL] [--conc 1,8,32] [--tokens 48] [--rounds 3]
#                          [--load auto|copy|mmap] [--engine-args "ARGS"] [--serve-args "ARGS"]
#                          [--mode waves|free] [--temperature T]
#
# Starts `dsv4 serve` once on MODEL, then for each round and each
# concurrency N runs, back to back, `dsv4 bench --batch N` (decode tok/s of
# ds_forward alone: N sequences, TOKENS steps) and tools/bench_serve.py at
# concurrency N against the server (N streaming completions of TOKENS
# tokens at a time: decode tok/s, TTFT, TPOT). Interleaving the two in time is
# what makes the ratio mean something on a machine whose speed drifts. Prints
# every measurement, then per N: the server/bench ratio (median and range
# over the rounds), both rates, TTFT and TPOT p50 / p99 (medians over rounds)
# and the cores the load generator itself kept busy (median; on a machine
# with few cores that CPU is taken from the server it measures, which the
# target's comparison does not assume).
#
# MODEL may be the bundled model (default, models/kjv) or a checkpoint
# without a tokenizer (`dsv4 synth --like flash --layers 4 -o D`): then a
# directory of links to it plus the bundled tokenizer is served (ids the
# tokenizer lacks are masked; the prompts are a few words either way).
# --load (default auto) goes to both the server and bench: `--load mmap` lets
# the two share one page-cache copy of a model too large for two (the flash
# shape, 16 GB, on a 24 GB machine). --engine-args adds options to both `dsv4
# bench` and `dsv4 serve` (e.g. "--backend cuda", or "--threads 8" to leave a
# machine's other cores to the load generator). --serve-args adds options to
# `dsv4 serve` only (e.g. "--batch-wait 0" to measure the server without its
# wait for requests sent together). --mode (default waves) goes to the load
# generator: waves sends each round's N requests together and the next round
# when all have ended (prefills together, then N streams decoding, as `bench
# --batch N`); free lets each of the N workers send its next request as soon
# as its last ended (new prompts prefilled inside the others' decoding).
# --temperature (default 0.8: the whole distribution sampled, the costliest
# draws; 0: greedy) goes to the load generator.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="$root/build"
model="$root/models/kjv"
conc="1,8,32"
tokens=48
rounds=3
load=auto
serve_args=""
engine_args=""
mode=waves
temperature=0.8
while [ $# -gt 0 ]; do
  case "$1" in
  -b) build="$2"; shift 2 ;;
  -m) model="$2"; shift 2 ;;
  --conc) conc="$2"; shift 2 ;;
  --tokens) tokens="$2"; shift 2 ;;
  --rounds) rounds="$2"; shift 2 ;;
  --load) load="$2"; shift 2 ;;
  --engine-args) engine_args="$2"; shift 2 ;;
  --serve-args) serve_args="$2"; shift 2 ;;
  --mode) mode="$2"; shift 2 ;;
  --temperature) temperature="$2"; shift 2 ;;
  -h | --help) sed -n 2,36p "$0"; exit 0 ;;
  *) echo "bench-serve.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
done
dsv4="$build/dsv4"
[ -x "$dsv4" ] || { echo "bench-serve.sh: no $dsv4 (build first)" >&2; exit 1; }
model="$(cd "$model" && pwd)"
work="$(mktemp -d)"
pid=""
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT

serve_dir="$model"
if [ ! -f "$model/tokenizer.json" ]; then
  serve_dir="$work/model"
  mkdir "$serve_dir"
  for f in "$model"/*; do ln -s "$f" "$serve_dir/"; done
  ln -s "$root/models/kjv/tokenizer.json" "$serve_dir/tokenizer.json"
  [ -f "$root/models/kjv/tokenizer_config.json" ] && ln -s "$root/models/kjv/tokenizer_config.json" "$serve_dir/"
fi
max=$(echo "$conc" | tr , '\n' | sort -n | tail -1)
"$dsv4" serve -m "$serve_dir" --load "$load" --port 0 --max-seqs "$max" --max-queue $((4 * max)) --cache-seqs 0 $engine_args $serve_args \
  >"$work/serve.out" 2>"$work/serve.err" &
pid=$!
url=""
for _ in $(seq 1 600); do
  url=$(sed -n 's/^listening on //p' "$work/serve.out")
  [ -n "$url" ] && break
  kill -0 "$pid" 2>/dev/null || { cat "$work/serve.err" >&2; exit 1; }
  sleep 0.2
done
[ -n "$url" ] || { echo "bench-serve.sh: the server did not start" >&2; exit 1; }
echo "model $model; server $url ($(tail -1 "$work/serve.err")); $tokens tokens per stream; $rounds rounds; load generator --mode $mode --temperature $temperature"
echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"

res="$work/results"
: >"$res"
for r in $(seq 1 "$rounds"); do
  for n in $(echo "$conc" | tr , ' '); do
    b=$("$dsv4" bench -m "$model" --load "$load" --prompt 28 --gen "$tokens" --batch "$n" $engine_args 2>&1 |
      sed -n "s/^batch $n *decode .*ms\/step, \([0-9.]*\) tokens\/s.*/\1/p")
    [ -n "$b" ] || { echo "bench-serve.sh: dsv4 bench --batch $n gave no number" >&2; exit 1; }
    s=$(python3 "$root/tools/bench_serve.py" "$url" --conc "$n" --tokens "$tokens" --rounds 2 --mode "$mode" --temperature "$temperature" --json)
    echo "$r $n $b $s" >>"$res"
    echo "round $r  N=$n  bench $b tok/s  server $s  (load $(cut -d' ' -f1 /proc/loadavg))"
  done
done

python3 - "$res" <<'PY'
import json, sys, statistics as st
rows = {}
for line in open(sys.argv[1]):
    r, n, b, s = line.split(' ', 3)
    rows.setdefault(int(n), []).append((float(b), json.loads(s)))
print()
print('   N  server/bench decode: median [min, max]   bench tok/s   server decode tok/s   '
      'ttft p50 / p99 (s)   tpot p50 / p99 (s)   client cores')
for n in sorted(rows):
    ratios = [s['decode_tok_s'] / b for b, s in rows[n]]
    med = lambda k: st.median(s[k] for _, s in rows[n])
    print(f'{n:4d}  {st.median(ratios):6.3f} [{min(ratios):.3f}, {max(ratios):.3f}]'
          f'{st.median(b for b, _ in rows[n]):22.1f}{med("decode_tok_s"):22.1f}'
          f'   {med("ttft_p50"):.4f} / {med("ttft_p99"):.4f}   {med("tpot_p50"):.4f} / {med("tpot_p99"):.4f}'
          f'   {med("client_cpu"):.2f}')
PY

# where the server's scheduler thread spent its steps, over the whole run (every N and round)
python3 - "$url" <<'PY'
import re, sys, urllib.request
m = urllib.request.urlopen(sys.argv[1] + '/metrics', timeout=30).read().decode()
steps = float(re.search(r'^dsv4_steps_total (\S+)', m, re.M).group(1))
ph = dict(re.findall(r'^dsv4_step_phase_seconds_total\{phase="(\w+)"\} (\S+)', m, re.M))
tot = sum(float(v) for v in ph.values())
print(f'\nserver: {steps:.0f} steps; the scheduler thread per step: ' +
      ', '.join(f'{k} {float(v) / steps * 1e3:.3f} ms' for k, v in ph.items()) +
      f' (forward {float(ph.get("forward", 0)) / tot:.1%} of it)' if steps and tot else '\nserver: no steps')
PY
