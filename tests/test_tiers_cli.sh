#!/usr/bin/env bash
# test_tiers_cli.sh BIN SRC — `dsv4 tiers` from a config alone: V4-Flash's
# shape (synth:flash, nothing written) gets floor(GB / expert bytes) slots,
# an expert being its three 4096 x 2048 MXFP4 matrices (half a byte a value,
# one E8M0 scale per 32); a load file puts the one slot on its hottest expert
# and the hit rate is that expert's share; bad input is named.
set -u
BIN=$1
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() {
    fail=$((fail + 1))
    echo "FAIL: $*" >&2
}

eb=$((3 * 4096 * 2048 * 17 / 32)) # bytes of one V4-Flash expert
slots=$((120000000000 / eb))
"$BIN" tiers -m synth:flash --gpu-mem 120 --batch 1,8 --trials 8 >"$T/out" 2>"$T/err" && ok || bad "tiers: exit $?: $(cat "$T/err")"
grep -q "43 layers x 256 routed experts (6 active)" "$T/out" && ok || bad "shape: $(head -1 "$T/out")"
grep -q "^slots *$slots of 11008 experts" "$T/out" && ok || bad "want $slots slots: $(grep slots "$T/out")"
[ "$(grep -cE '^ +(1|8) ' "$T/out")" = 2 ] && ok || bad "one row per batch: $(cat "$T/out")"

# the load: layer 7 expert 200 has 1000 tokens, every other expert 1; one slot
{
    echo "# LAYER EXPERT TOKENS"
    for l in $(seq 0 42); do for e in $(seq 0 255); do
        if [ "$l" = 7 ] && [ "$e" = 200 ]; then echo "$l $e 1000"; else echo "$l $e 1"; fi
    done; done
} >"$T/load"
one=$(awk -v b="$eb" 'BEGIN { printf "%.6f", 1.5 * b / 1e9 }')
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
expect 2 "--pcie: 0: must be" -m synth:flash --gpu-mem 1 --pcie 0
expect 2 "--cpu-read: inf: must be" -m synth:flash --gpu-mem 1 --cpu-read inf
expect 1 "$T/nope/config.json" -m "$T/nope" --gpu-mem 1
expect 1 "synth:huge" -m synth:huge --gpu-mem 1
echo "7 300 5" >"$T/badload"
expect 1 "$T/badload line 1" -m synth:flash --gpu-mem 1 --expert-load "$T/badload"

echo "tiers_cli: $pass passed, $fail failed"
[ "$fail" -eq 0 ] && [ "$pass" -gt 0 ]
