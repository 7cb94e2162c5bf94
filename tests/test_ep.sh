#!/usr/bin/env bash
# test_ep.sh — expert parallelism under mpirun (docs/ep.md): 2 ranks and 3
# ranks (oversubscribed on a 2-core machine) give logits bitwise equal to the
# pinned hashes of tests/fixtures/pinned/logits.sha256 (computed by main
# before EP existed; MXFP4 models' pins renewed with the integer MXFP4 products) and to the single-process engine, with batches, chunked
# prefill, other placements (a file with replicas; load-balanced with
# redundant experts), sampled generation and dsv4 check; a rank that fails to
# load or fails mid-run ends the job with a message naming it, never a hang.
# Skipped (77) when mpirun is not installed.
set -u
bin="$1"
src="$2"
command -v mpirun >/dev/null || { echo "skip: no mpirun (apt-get install openmpi-bin libopenmpi-dev)"; exit 77; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 # 3 ranks on 2 cores
export OMP_WAIT_POLICY=PASSIVE # idle OpenMP threads sleep: ranks share 2 cores with other jobs
export ASAN_OPTIONS="${ASAN_OPTIONS:-}:detect_leaks=0" # Open MPI's own allocations at exit
pins="$src/tests/fixtures/pinned/logits.sha256"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
. "$(dirname "$0")/check_lib.sh"
mpi() { # ranks command... (a 1200 s guard: a hang fails instead of blocking CI)
  local n="$1"
  shift
  timeout 1200 mpirun -np "$n" "$@"
}

# the token lists of test_pinned_logits.sh (a 32-bit LCG)
tokens() { # vocab n seed
  awk -v V="$1" -v N="$2" -v S="$3" 'BEGIN { s = S; for (i = 0; i < N; i++) {
    s = (s * 1103515245 + 12345) % 2147483648; printf "%s%d", (i ? "," : ""), int(s / 65536) % V } }'
}
pin() { awk -v k="$1" '$1 == k { print $2 }' "$pins"; }
hash() { sha256sum <"$1" | cut -d' ' -f1; }

# 1. the pinned logits, over 2 and 3 ranks (whole batch / chunks of 7, one thread)
for spec in "tiny tests/fixtures/tiny 331 333" "q128 tests/fixtures/q128 512 333" "kjv models/kjv 6000 300"; do
  set -- $spec
  name="$1" dir="$src/$2" vocab="$3" len="$4"
  a="$(tokens "$vocab" "$len" 17)"
  b="$(tokens "$vocab" 41 99)"
  "$bin" logits -m "$dir" --tokens "$a" --tokens "$b" -o "$tmp/$name.one" >/dev/null 2>&1
  if ! mpi 2 "$bin" logits -m "$dir" --tokens "$a" --tokens "$b" -o "$tmp/$name.np2" --threads 1 \
    >"$tmp/out" 2>"$tmp/err"; then
    bad "$name: mpirun -np 2 failed"; cat "$tmp/err"; continue
  fi
  grep -q "expert parallel over 2 ranks" "$tmp/err" || bad "$name: no 'expert parallel over 2 ranks' (built without MPI?)"
  mpi 3 "$bin" logits -m "$dir" --tokens "$a" --tokens "$b" -o "$tmp/$name.np3" --prefill-chunk 7 --threads 1 \
    >/dev/null 2>"$tmp/err" || { bad "$name: mpirun -np 3 failed"; cat "$tmp/err"; }
  for i in 0 1; do
    want="$(pin "$name.$i")"
    for v in one np2 np3; do
      got="$(hash "$tmp/$name.$v.$i.f32" 2>/dev/null)"
      [ -n "$want" ] && [ "$got" = "$want" ] && ok "$name.$i $v: pinned logits" ||
        bad "$name.$i $v: logits hash $got, pinned $want"
    done
  done
done

# 2. batches: four sequences in one step, other ranks and placements; each
#    sequence's logits equal the single-process run of it alone
dir="$src/models/kjv"
A="$(tokens 6000 130 5)" B="$(tokens 6000 7 6)" C="$(tokens 6000 64 7)" D="$(tokens 6000 1 8)"
for s in A B C D; do "$bin" logits -m "$dir" --tokens "${!s}" -o "$tmp/alone.$s" >/dev/null 2>&1; done
n_layers=$(python3 -c "import json; print(json.load(open('$dir/config.json'))['num_hidden_layers'])")
n_exp=$(python3 -c "import json; print(json.load(open('$dir/config.json'))['n_routed_experts'])")
# placement file: expert e on rank (e*7)%3, experts 0-3 also on every rank; layer 1 reversed
{
  echo "# test placement"
  for ((e = 0; e < n_exp; e++)); do
    if [ $e -lt 4 ]; then echo "* $e 0 1 2"; else echo "* $e $(((e * 7) % 3))"; fi
  done
  for ((e = 0; e < n_exp; e++)); do echo "1 $e $((2 - e % 3))"; done
} >"$tmp/placement"
# a load file (as dsv4 stats --load-out writes it): skewed, so replicas go to the hot experts
for ((l = 0; l < n_layers; l++)); do for ((e = 0; e < n_exp; e++)); do
  echo "$l $e $(((e * 37 + l) % 11 * (e % 5 == 0 ? 20 : 1)))"
done; done >"$tmp/load"
check_batch() { # label ranks extra-args...
  local label="$1" n="$2"
  shift 2
  if ! mpi "$n" "$bin" logits -m "$dir" --tokens "$A" --tokens "$B" --tokens "$C" --tokens "$D" -o "$tmp/b" \
    --prefill-chunk 9 "$@" >/dev/null 2>"$tmp/err"; then
    bad "$label: failed"; cat "$tmp/err"; return
  fi
  local i=0 same=1
  for s in A B C D; do cmp -s "$tmp/b.$i.f32" "$tmp/alone.$s.0.f32" || same=0; i=$((i + 1)); done
  [ $same = 1 ] && ok "$label: 4-sequence chunked batch == each sequence alone, single process" || bad "$label: logits differ"
}
check_batch "np 2 round robin" 2
check_batch "np 3 placement file with replicas" 3 --placement "$tmp/placement"
check_batch "np 3 by load, 6 redundant experts" 3 --expert-load "$tmp/load" --redundant-experts 6
check_batch "np 4 by load, no replicas" 4 --expert-load "$tmp/load" --threads 1
check_batch "np 3 replicated attention" 3 --ep-attention replicated

# 2b. data-parallel attention: each sequence runs its attention on one home rank,
#     the live sequence with the fewest live sequences (lowest rank on a tie), so
#     A B C D go to ranks 0 1 0 1 (2 ranks) and 0 1 2 0 (3 ranks); the leader's
#     report counts each rank's attention rows (replicated: every rank all rows)
declare -A len=([A]=130 [B]=7 [C]=64 [D]=1)
rows_line() { # ranks homes-of-A-B-C-D...
  local n="$1" r k=0 names=(A B C D)
  shift
  local -a c=()
  for ((r = 0; r < n; r++)); do c[r]=0; done
  for r in "$@"; do c[r]=$((c[r] + len[${names[k]}])); k=$((k + 1)); done
  echo "${c[*]}"
}
for spec in "2 data:parallel 0 1 0 1" "3 data:parallel 0 1 2 0" "2 replicated -1"; do
  set -- $spec
  n="$1" mode="${2/:/ }"
  shift 2
  if [ "$1" = -1 ]; then want="$(printf '202 %.0s' $(seq "$n") | sed 's/ $//')" extra="--ep-attention replicated"
  else want="$(rows_line "$n" "$@")" extra=""; fi
  mpi "$n" "$bin" logits -m "$dir" --tokens "$A" --tokens "$B" --tokens "$C" --tokens "$D" -o "$tmp/r" $extra \
    >/dev/null 2>"$tmp/err"
  got="$(grep -o "attention rows per rank ($mode): [0-9 ]*" "$tmp/err" | sed 's/.*: //')"
  [ "$got" = "$want" ] && ok "np $n $mode attention: rows per rank $got" || { bad "np $n $mode: rows per rank '$got', want '$want'"; cat "$tmp/err"; }
done

# 2c. dsv4 stats (the route hook sees every rank's rows) writes the load file of one process
head -c 3000 "$dir/heldout.txt" >"$tmp/text"
"$bin" stats -m "$dir" --file "$tmp/text" --window 96 --load-out "$tmp/load1" >/dev/null 2>&1
mpi 3 "$bin" stats -m "$dir" --file "$tmp/text" --window 96 --load-out "$tmp/load3" >/dev/null 2>"$tmp/err"
[ -s "$tmp/load1" ] && cmp -s "$tmp/load1" "$tmp/load3" && ok "stats over 3 ranks: the load file of one process" ||
  { bad "stats over 3 ranks: load file differs"; tail -3 "$tmp/err"; }

# 3. sampled generation: the same tokens as one process
g="--tokens $(tokens 6000 20 11) -n 24 --temperature 0.9 --top-p 0.95 --seed 7"
"$bin" generate -m "$dir" $g >"$tmp/g1" 2>/dev/null
mpi 3 "$bin" generate -m "$dir" $g >"$tmp/g3" 2>/dev/null
[ -s "$tmp/g1" ] && cmp -s "$tmp/g1" "$tmp/g3" && ok "generate: 3 ranks sample the same tokens" || bad "generate differs"

# 4. dsv4 check under mpirun (its reference and trials all run over the ranks);
#    50 trials in the plain trees, 10 in the sanitizer tree (several times slower)
trials=50
ldd "$bin" 2>/dev/null | grep -q libasan && trials=10
out="$(mpi 2 "$bin" check -m "$src/tests/fixtures/tiny" --trials $trials --seed 11 2>&1)" &&
  echo "$out" | grep -q "check: OK" && ok "check --trials $trials, 2 ranks" || { bad "check, 2 ranks"; echo "$out" | tail -5; }
out="$(mpi 3 "$bin" check -m "$src/tests/fixtures/q128" --trials 6 --mode mixed --seed 12 2>&1)" &&
  echo "$out" | grep -q "check: OK" && ok "check --trials 6 mixed, 3 ranks" || { bad "check, 3 ranks"; echo "$out" | tail -5; }

# 5. -m synth:tiny: built in memory, each rank writing only its experts (the
#    others are holes) — the bits of the checkpoint `dsv4 synth` writes to disk
"$bin" synth --like tiny -o "$tmp/synth" >/dev/null 2>&1
S="--tokens $(tokens 331 40 3) --tokens $(tokens 331 9 4)"
"$bin" logits -m "$tmp/synth" $S -o "$tmp/sd" >/dev/null 2>&1
for n in 1 2 3; do
  m="-m synth:tiny"
  [ $n = 2 ] && m="--synth tiny" # the same model by the option's spelling
  mpi $n "$bin" logits $m $S -o "$tmp/s$n" >/dev/null 2>&1
  cmp -s "$tmp/sd.0.f32" "$tmp/s$n.0.f32" && cmp -s "$tmp/sd.1.f32" "$tmp/s$n.1.f32" && [ -s "$tmp/sd.0.f32" ] &&
    ok "synth:tiny over $n ranks == the synth checkpoint on disk" || bad "synth:tiny over $n ranks differs"
done

# 5b. the server over 2 ranks (data-parallel attention): 4 concurrent sampled
#     completions give the texts one process gives them one at a time
serve_texts() { # out-prefix ranks...
  local pre="$1"
  shift
  "$@" serve -m "$dir" --port 0 --threads 1 >"$pre.out" 2>"$pre.err" &
  local pid=$! url="" i
  for ((i = 0; i < 600; i++)); do
    url=$(sed -n 's/^listening on //p' "$pre.out" 2>/dev/null) # the shell may not have made it yet
    [ -n "$url" ] && break
    sleep 0.1
  done
  [ -n "$url" ] || { echo "no server: $(tail -3 "$pre.err")"; kill $pid 2>/dev/null; return 1; }
  local -a cs=()
  for i in 1 2 3 4; do
    curl -s --max-time 600 "$url/v1/completions" -o "$pre.$i" \
      -d "{\"prompt\":\"And God said $i\",\"max_tokens\":20,\"temperature\":0.8,\"seed\":$i}" &
    cs+=($!)
  done
  wait "${cs[@]}"
  kill -TERM $pid
  wait $pid 2>/dev/null
  for i in 1 2 3 4; do
    python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["choices"][0]["text"])' "$pre.$i" ||
      { echo "request $i: $(head -c 300 "$pre.$i")"; }
  done
}
if command -v curl >/dev/null; then
  t1="$(serve_texts "$tmp/sv1" "$bin" 2>&1)"
  t2="$(serve_texts "$tmp/sv2" timeout 300 mpirun -np 2 "$bin" 2>&1)"
  [ -n "$t1" ] && [ "$t1" = "$t2" ] && grep -q "attention: data parallel" "$tmp/sv2.err" &&
    ok "serve over 2 ranks: 4 concurrent sampled completions = one process" ||
    { bad "serve over 2 ranks differs"; echo "one: $t1"; echo "two: $t2"; tail -3 "$tmp/sv2.err"; }
fi

# 6. failures end the job with a message naming the rank (timeout: a hang fails)
expect_fail() { # label regex ranks args...
  local label="$1" re="$2"
  shift 2
  timeout 120 mpirun "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  if [ $rc -eq 124 ]; then bad "$label: hung (killed after 120 s)"; return; fi
  if [ $rc -ne 0 ] && grep -Eq "$re" "$tmp/err"; then ok "$label: exit $rc, '$(grep -Eo "$re" "$tmp/err" | head -1)'"; else
    bad "$label: exit $rc, stderr:"; cat "$tmp/err"; fi
}
L="logits -m $dir --tokens 1,2,3 -o $tmp/f"
# the fault hooks are compiled only with -DDSV4_TEST_HOOKS=ON (ctest then sets DSV4_TEST_HOOKS=1)
if [ "${DSV4_TEST_HOOKS:-0}" = 1 ]; then
  expect_fail "rank 1 fails to load (test hook)" "rank 1 of 2 failed to load: DSV4_EP_FAIL_RANK" \
    -np 2 -x DSV4_EP_FAIL_RANK=1 "$bin" $L
else
  echo "skip rank 1 fails to load, rank 1 fails its 3rd step (a build without DSV4_TEST_HOOKS)"
fi
mkdir -p "$tmp/broken"
cp "$dir/config.json" "$dir/tokenizer.json" "$tmp/broken/"
cp "$dir/model.safetensors.index.json" "$tmp/broken/" &&
  head -c 1000 "$dir/model-00001-of-00003.safetensors" >"$tmp/broken/model-00001-of-00003.safetensors" ||
  echo '{}' >"$tmp/broken/model.safetensors.index.json"
expect_fail "rank 2 has a broken checkpoint" "rank 2 of 3 failed to load: .*broken" \
  -np 2 "$bin" $L : -np 1 "$bin" logits -m "$tmp/broken" --tokens 1,2,3 -o "$tmp/f"
echo "* 0 5" >"$tmp/badplace"
expect_fail "placement names rank 5 of 2" "placement file .*badplace line 1: rank '5' is not in \[0, 2\)" \
  -np 2 "$bin" $L --placement "$tmp/badplace"
if [ "${DSV4_TEST_HOOKS:-0}" = 1 ]; then
  expect_fail "rank 1 fails its 3rd step" "rank 1: a step: DSV4_EP_FAIL_STEP" \
    -np 2 -x DSV4_EP_FAIL_STEP=1:3 "$bin" generate -m "$dir" --tokens 1,2,3 -n 10
fi
expect_fail "intermediates under data-parallel attention" "dump them with --ep-attention replicated" \
  -np 2 "$bin" $L --dump "$tmp/dump"

finish
