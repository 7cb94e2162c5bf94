#!/usr/bin/env bash
# dsv4 check on the fixture models: every request must give one unique
# output over random batches, chunkings and thread counts; and the checker
# itself must catch a batch-dependent engine (--self-test perturbs logits by
# batch size, so the check has to fail).
set -u
DSV4="$1"
SRC="$2"
pass=0
fail=0
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
run "check catches batch dependence" 1 "$DSV4" check -m "$SRC/tests/fixtures/tiny" --trials 2 --self-test
run "check rejects a bad mode" 2 "$DSV4" check -m "$SRC/tests/fixtures/tiny" --mode sometimes
echo "$pass passed, $fail failed"
[ $fail = 0 ]
