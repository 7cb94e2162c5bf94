#!/usr/bin/env bash
# test_tiers_cli.sh BIN SRC — `dsv4 tiers` from a config alone: the bundled
# model gets floor((GB - dense bytes) / expert bytes) slots, both sizes summed
# from its safetensors headers; on V4-Flash's shape (synth:flash, nothing
# written) k more experts' bytes buy k more slots, an expert being its three
# 4096 x 2048 MXFP4 matrices (half a byte a value, one E8M0 scale per 32),
# and too little memory for the dense weights is an error naming them; a
# load file puts the one slot on its hottest expert and the hit rate is that
# expert's share; bad input is named. The load a
# server learned: `dsv4 serve --load-out` on the bundled model writes, at
# SIGTERM, a table of every (layer, expert) whose rows sum per layer to at
# most the tokens it ran times the experts a token takes, and `dsv4 tiers`
# reads it; an unwritable --load-out stops the server at the start.
set -u
BIN=$1
SRC=$2
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
. "$(dirname "$0")/check_lib.sh"

# the bundled model: its dense and routed bytes from the checkpoint's headers
# (its MTP block's left out: `dsv4 tiers` plans the model's layers)
read -r dense routed <<<"$(python3 - "$SRC/models/kjv" <<'PY'
import glob, json, struct, sys
dense = routed = 0
for f in glob.glob(sys.argv[1] + "/*.safetensors"):
    with open(f, "rb") as fh:
        n = struct.unpack("<Q", fh.read(8))[0]
        h = json.loads(fh.read(n))
    for k, v in h.items():
        if k != "__metadata__" and not k.startswith("mtp."):  # the MTP block: not in the model's tiers
            b = v["data_offsets"][1] - v["data_offsets"][0]
            if ".ffn.experts." in k: routed += b
            else: dense += b
print(dense, routed)
PY
)"
keb=$((routed / 96)) # 6 layers x 16 experts
want=$(((20000000 - dense) / keb))
"$BIN" tiers -m "$SRC/models/kjv" --gpu-mem 0.02 --batch 1 --trials 4 >"$T/out" 2>"$T/err" && ok || bad "tiers: exit $?: $(cat "$T/err")"
grep -q "^slots *$want of 96 experts" "$T/out" && ok || bad "bundled: want $want slots: $(grep slots "$T/out")"

eb=$((3 * 4096 * 2048 * 17 / 32)) # bytes of one V4-Flash expert
"$BIN" tiers -m synth:flash --gpu-mem 120 --batch 1,8 --trials 8 >"$T/out" 2>"$T/err" && ok || bad "tiers: exit $?: $(cat "$T/err")"
grep -q "43 layers x 256 routed experts (6 active)" "$T/out" && ok || bad "shape: $(head -1 "$T/out")"
[ "$(grep -cE '^ +(1|8) ' "$T/out")" = 2 ] && ok || bad "one row per batch: $(cat "$T/out")"
s0=$(sed -n 's/^slots *\([0-9]*\) of 11008.*/\1/p' "$T/out")
g1=$(awk -v b="$eb" 'BEGIN { printf "%.9f", 120 + 37 * b / 1e9 }')
"$BIN" tiers -m synth:flash --gpu-mem "$g1" --batch 1 --trials 1 >"$T/out" 2>"$T/err"
s1=$(sed -n 's/^slots *\([0-9]*\) of 11008.*/\1/p' "$T/out")
[ -n "$s0" ] && [ "$((s1 - s0))" = 37 ] && ok || bad "37 experts' bytes more: $s0 -> $s1 slots"

# the load: layer 7 expert 200 has 1000 tokens, every other expert 1; one slot
{
    echo "# LAYER EXPERT TOKENS"
    for l in $(seq 0 42); do for e in $(seq 0 255); do
        if [ "$l" = 7 ] && [ "$e" = 200 ]; then echo "$l $e 1000"; else echo "$l $e 1"; fi
    done; done
} >"$T/load"
one=$(awk -v b="$eb" -v s="$s0" 'BEGIN { printf "%.9f", 120 - (s - 1) * b / 1e9 }') # s0 - 1 slots fewer
"$BIN" tiers -m synth:flash --gpu-mem "$one" --expert-load "$T/load" --batch 1 --trials 4 >"$T/out" 2>"$T/err" && ok ||
    bad "tiers --expert-load: exit $?: $(cat "$T/err")"
want=$(awk 'BEGIN { printf "%.2f%%", 100 * 1000 / (1000 + 11007) }')
grep -q "^slots *1 of 11008" "$T/out" && ok || bad "one slot: $(grep slots "$T/out")"
grep -q "serve $want of the routed picks" "$T/out" && ok || bad "hit rate, want $want: $(grep load "$T/out")"

# bad input
expect() { # CODE NEEDLE ARGS...
    local code=$1 needle=$2
    shift 2
    "$BIN" tiers "$@" >/dev/null 2>"$T/err"
    local rc=$?
    [ "$rc" = "$code" ] && grep -qF -- "$needle" "$T/err" && ok || bad "tiers $*: exit $rc, stderr '$(cat "$T/err")' (want $code, '$needle')"
}
expect 2 "--gpu-mem GB is required" -m synth:flash
expect 2 "--gpu-mem: -1: must be" -m synth:flash --gpu-mem -1
expect 1 "--gpu-mem 5 GB does not hold the dense weights alone" -m synth:flash --gpu-mem 5
expect 2 "--pcie: 0: must be" -m synth:flash --gpu-mem 1 --pcie 0
expect 2 "--cpu-read: inf: must be" -m synth:flash --gpu-mem 1 --cpu-read inf
expect 1 "$T/nope/config.json" -m "$T/nope" --gpu-mem 1
expect 1 "synth:huge" -m synth:huge --gpu-mem 1
echo "7 300 5" >"$T/badload"
expect 1 "$T/badload line 1" -m synth:flash --gpu-mem 1 --expert-load "$T/badload"

# the load a server learned
"$BIN" serve -m "$SRC/models/kjv" --port 0 --load-out "$T/served" >"$T/srv.out" 2>"$T/srv.err" &
spid=$!
url=
for _ in $(seq 1 300); do
    url=$(sed -n 's/^listening on //p' "$T/srv.out")
    [ -n "$url" ] && break
    kill -0 $spid 2>/dev/null || break
    sleep 0.1
done
if [ -n "$url" ]; then
    ntok=0
    for p in "In the beginning" "And the LORD said unto Moses"; do
        curl -s -o "$T/resp" -H 'Content-Type: application/json' \
            --data-binary "{\"prompt\":\"$p\",\"max_tokens\":16,\"temperature\":0}" "$url/v1/completions"
        n=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['usage']['total_tokens'])" "$T/resp") || n=0
        ntok=$((ntok + n))
    done
    kill -TERM $spid
    wait $spid && ok || bad "serve --load-out: exit $?: $(cat "$T/srv.err")"
    [ ! -e "$T/served.tmp" ] && ok || bad "serve --load-out left its .tmp"
    python3 - "$T/served" "$ntok" <<'PY' && ok || bad "serve --load-out: the table ($ntok tokens): $(head -c 300 "$T/served")"
import sys
rows = [l.split() for l in open(sys.argv[1]) if not l.startswith("#")]
per = {}
for l, e, c in rows:
    per[int(l)] = per.get(int(l), 0.0) + float(c)
assert len(rows) == 6 * 16 and sorted(per) == list(range(6)), len(rows)
tokens = int(sys.argv[2])
assert tokens > 0 and all(0 < v <= 2 * tokens for v in per.values()), (tokens, per)
PY
    "$BIN" tiers -m "$SRC/models/kjv" --gpu-mem 0.017 --expert-load "$T/served" --batch 1 >"$T/out" 2>"$T/err" && ok ||
        bad "tiers on the served load: $(cat "$T/err")"
else
    bad "serve --load-out did not start: $(cat "$T/srv.err")"
fi
"$BIN" serve -m "$SRC/models/kjv" --port 0 --load-out "$T/no/such/dir/load" >/dev/null 2>"$T/err"
rc=$?
[ "$rc" = 1 ] && grep -qF -- "--load-out $T/no/such/dir/load: cannot write" "$T/err" && ok ||
    bad "serve --load-out unwritable: exit $rc: $(cat "$T/err")"

finish tiers_cli
