#!/usr/bin/env bash
# dsv4 bench runs to the end on a fixture (here also under ASan/UBSan) and
# prints every figure it promises: bandwidth floor, prefill, decode, ratio,
# per-chunk ratios, where decode time goes, batched decode; and the kernel
# bench (`--kernels`) prints every kind against the read of the same memory;
# with --mtp K the speculative run, the verify step's cost and the implied
# speed-up.
# (It measures; it asserts no speed.)
set -u
DSV4="$1"
SRC="$2"
out=$("$DSV4" bench -m "$SRC/tests/fixtures/q128" --prompt 8 --gen 2 --batch 2,3 2>&1)
rc=$?
. "$(dirname "$0")/check_lib.sh"
check() { if echo "$out" | grep -q -- "$1"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: no '$1'"; fi; }
[ $rc -eq 0 ] && pass=$((pass + 1)) || { fail=$((fail + 1)); echo "FAIL: exit status $rc"; }
check "read bandwidth"
check "the model's mapped weights"
check "prefill .* tokens/s"
check "decode .* GB/s"
check "of the bandwidth floor"
check "chunks .* median"
check "where .* per token: .* attention .* other"
check "batch 2 .* tokens/s"
check "batch 3 .* tokens/s"
# --mtp K on a synth model with an MTP block: the speculative run, the step costs, the implied speed-up
M=$(mktemp -d)
"$DSV4" synth --like tiny --mtp -o "$M" >/dev/null
mout=$("$DSV4" bench -m "$M" --prompt 16 --gen 8 --batch 2 --mtp 2 2>&1)
rm -rf "$M"
for k in "mtp .* --mtp 2 .* acceptance length [0-9.]*" \
  "mtp .* decode step (1 token) [0-9.]* ms; verify step (3 tokens) [0-9.]* ms (x[0-9.]*); 2 drafts by the block [0-9.]* ms" \
  "mtp .* implied speed-up .* x[0-9.]* at the measured [0-9.]*, x[0-9.]* at 2.5"; do
  if echo "$mout" | grep -q -- "$k"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: bench --mtp: no '$k'"; fi
done
pout=$("$DSV4" bench -m "$SRC/tests/fixtures/q128" --prompt 8 --gen 2 --batch 2 --batch-profile 2>&1)
if echo "$pout" | grep -q "where      per step at batch 2 (profiled, ops synchronized): .* attention .* other"; then
  pass=$((pass + 1))
else
  fail=$((fail + 1)); echo "FAIL: --batch-profile: no where line for batch 2"
fi
kout=$("$DSV4" bench --kernels --mib 64 --reps 1 --tokens 8 2>&1)
[ $? -eq 0 ] && pass=$((pass + 1)) || { fail=$((fail + 1)); echo "FAIL: bench --kernels exit status"; }
for k in "read 1 .* GB/s" "BF16 K=4096 .*(" "FP8 K=1024" "FP8 K=8192" "MXFP4 K=4096 .*(" "prefill .* of 8 tokens" \
  "peak 1 .* GFLOP/s" "FP8 4096x4096 T=8 [0-9.]* (" "MXFP4 2048x4096 T=3 [0-9.]* (" "BF16 4096x4096 T=8 [0-9.]* (" \
  "experts 1 .* T=1 [0-9.]* / [0-9.]* .* T=4 [0-9.]* / [0-9.]*"; do
  if echo "$kout" | grep -q -- "$k"; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: bench --kernels: no '$k'"; fi
done
"$DSV4" bench --kernels --reps 0 >/dev/null 2>&1
[ $? -eq 2 ] && pass=$((pass + 1)) || { fail=$((fail + 1)); echo "FAIL: --kernels --reps 0 must be a usage error"; }
"$DSV4" bench --kernels --tokens 0 >/dev/null 2>&1
[ $? -eq 2 ] && pass=$((pass + 1)) || { fail=$((fail + 1)); echo "FAIL: --kernels --tokens 0 must be a usage error"; }
"$DSV4" bench -m "$SRC/tests/fixtures/q128" --batch 0 >/dev/null 2>&1
[ $? -eq 2 ] && pass=$((pass + 1)) || { fail=$((fail + 1)); echo "FAIL: --batch 0 must be a usage error"; }
# the grammar mask's cost: a schema over the bundled vocabulary
G=$(mktemp)
echo '{"type":"object","properties":{"n":{"type":"integer"},"s":{"type":"string"}},"required":["n"]}' >"$G"
gout=$("$DSV4" bench --grammar "$G" -m "$SRC/models/kjv" --tokens 300 2>&1)
if echo "$gout" | grep -q "^mask       300 tokens .*mean [0-9.]* us/token"; then pass=$((pass + 1)); else
  fail=$((fail + 1)); echo "FAIL: bench --grammar: $gout"; fi
echo '{"type":"string","format":"date"}' >"$G"
gerr=$("$DSV4" bench --grammar "$G" -m "$SRC/models/kjv" 2>&1)
[ $? -ne 0 ] && echo "$gerr" | grep -q "format" && pass=$((pass + 1)) ||
  { fail=$((fail + 1)); echo "FAIL: bench --grammar with an unsupported keyword: $gerr"; }
rm -f "$G"
echo "$out"
echo "$kout"
echo "$gout"
finish
