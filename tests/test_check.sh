#!/usr/bin/env bash
# dsv4 check on the fixture models: every request must give one unique
# output over random batches, chunkings and thread counts; and the checker
# itself must catch a batch-dependent engine (--self-test perturbs logits by
# batch size, so the check has to fail); with --mtp, speculative decoding
# must give the plain run's bits.
set -u
DSV4="$1"
SRC="$2"
. "$(dirname "$0")/check_lib.sh"
run() { # name expected-status command...
    local name="$1" want="$2"
    shift 2
    out=$("$@" 2>&1)
    local rc=$?
    if [ $rc -eq "$want" ]; then pass=$((pass + 1)); echo "ok   $name: $(echo "$out" | tail -1)"; else
        fail=$((fail + 1)); echo "FAIL $name: exit $rc, want $want"; echo "$out" | tail -8; fi
}
for m in tiny q128; do
    run "check $m mixed" 0 "$DSV4" check -m "$SRC/tests/fixtures/$m" --trials 4 --mode mixed --seed 3
    run "check $m single" 0 "$DSV4" check -m "$SRC/tests/fixtures/$m" --trials 2 --mode single --seed 4
    run "check $m prefix" 0 "$DSV4" check -m "$SRC/tests/fixtures/$m" --trials 2 --mode prefix --seed 5
done
# speculative decoding (--mtp K) against the plain reference, bit for bit: a
# synth model with an MTP block (the fixtures have none: check says so)
M=$(mktemp -d)
"$DSV4" synth --like tiny --mtp -o "$M" >/dev/null
for k in 1 3; do
    run "check mtp $k" 0 "$DSV4" check -m "$M" --trials 2 --mode mixed --seed $((6 + k)) --max-prompt 80 --gen 12 --mtp $k
done
out=$("$DSV4" check -m "$M" --trials 1 --seed 9 --max-prompt 40 --gen 10 --mtp 2 2>&1)
if echo "$out" | grep -q "forced drafts: [1-9]"; then pass=$((pass + 1)); echo "ok   check mtp: forced drafts accepted"; else
    fail=$((fail + 1)); echo "FAIL check mtp: no forced draft accepted"; echo "$out" | tail -5; fi
rm -rf "$M"
run "check --mtp without a block" 1 "$DSV4" check -m "$SRC/tests/fixtures/tiny" --trials 1 --mtp 2
run "check catches batch dependence" 1 "$DSV4" check -m "$SRC/tests/fixtures/tiny" --trials 2 --self-test
run "check rejects a bad mode" 2 "$DSV4" check -m "$SRC/tests/fixtures/tiny" --mode sometimes
# process to process: two separate runs (1 thread, whole prefill, both sequences batched /
# 3 threads, chunks of 7, the sequences in the other order) write byte-identical logits
T=$(mktemp -d)
A=$(python3 -c "import random; r=random.Random(7); print(','.join(str(r.randrange(512)) for _ in range(150)))")
B=$(python3 -c "import random; r=random.Random(8); print(','.join(str(r.randrange(512)) for _ in range(90)))")
"$DSV4" logits -m "$SRC/tests/fixtures/q128" --tokens "$A" --tokens "$B" -o "$T/x" --threads 1 &&
"$DSV4" logits -m "$SRC/tests/fixtures/q128" --tokens "$B" --tokens "$A" -o "$T/y" --threads 3 --prefill-chunk 7
if cmp -s "$T/x.0.f32" "$T/y.1.f32" && cmp -s "$T/x.1.f32" "$T/y.0.f32" && [ -s "$T/x.0.f32" ]; then
    pass=$((pass + 1)); echo "ok   logits identical across processes, threads, chunking and batch order"
else
    fail=$((fail + 1)); echo "FAIL logits differ across processes"
fi
rm -rf "$T"
finish
