#!/usr/bin/env bash
# gpu-test.sh — the GPU suite, on a machine with an NVIDIA GPU (the lease
# machine): builds the CUDA backend (or takes a build made elsewhere), runs
#   1. test_cuda_ops: every op against a double-precision reference, and
#      bitwise alone = inside batches of 2, 7, 64 per op; MXFP4 products and
#      the routed experts bitwise equal to the CPU backend's (docs/numerics.md);
#      test_kernels on this machine's CPU (its SIMD paths against the portable one);
#   2. the model tests on the GPU (DSV4_TEST_BACKEND=cuda): test_reference
#      (oracle logits within 1e-4; chunked prefill 1..129 / whole, batch order
#      and greedy decode bitwise), test_batch (alone = inside batches at any
#      position, bitwise), test_intermediates (per-layer vs the oracle),
#      test_long (decode = prefill at a context of 100,000 tokens, bitwise),
#      test_mtp (speculative decoding: --mtp 0..4 give the same tokens and logits);
#   3. dsv4 check --backend cuda (random batches and chunkings: one output per
#      request) and repeatability across processes; CUDA graphs = direct
#      launches, the shared expert on the main stream (DSV4_CUDA_SIDE=0) = on
#      its side stream (the default), the compressors and indexer on the side
#      lane (the default) = in issue order (DSV4_CUDA_LANES=0), bitwise (graph_bits);
#   4. GPU vs CPU on the bundled model: the same 64 greedy tokens, max |Δlogit|;
#   5. bad input: no such GPU, a bad DSV4_CUDA_GRAPH_OPS / _SIDE / _LANES, a sequence larger than GPU memory;
#   6b. expert parallelism: mpirun -np 2 / 3 --backend cuda = one process (bits);
#   6. with BENCH=1: dsv4 bench --backend cuda on synth flash models (4 and 8
#      layers, written here), the kernel timings, the shared expert on the
#      main stream against the side stream (DSV4_CUDA_SIDE), the lanes off
#      against on (DSV4_CUDA_LANES); with 2 GPUs and mpirun
#      also the full 43-layer flash shape expert parallel over both
#      (-m synth:flash: ~165 GB of host memory in /dev/shm, ~5 minutes);
# and prints a summary. Variables:
#   DSV4_CUDA_BUILD=DIR  a build made elsewhere (skip the build; the lease
#                        machine may lack libcjson: put it in DIR/lib;
#                        scripts/gpu-pack.sh packs a build with its libraries)
#   DSV4_MPI_ROOT=DIR    an Open MPI tree copied from a Debian machine (6b)
#   BENCH=1              also the benchmarks (needs ~55 GB for the synth models)
#   SYNTH_DIR=DIR        where the synth models are written (default /dev/shm
#                        when it has room for them: 8 GB, 60 with BENCH=1;
#                        else /tmp, where writing them can take minutes:
#                        docs/journal/cuda.md)
#   TESTS=0              skip 1-5 (the benchmarks alone)
#   ONLY="a b"           run only the named parts (test_cuda_ops, ep_gpu, ...)
#   JOBS (default 8)
set -u
cd "$(dirname "$0")/.."
root=$PWD
JOBS=${JOBS:-8}
if [ -n "${DSV4_CUDA_BUILD:-}" ]; then
  B=$DSV4_CUDA_BUILD
  echo "gpu-test: using the prebuilt $B"
else
  B=${BUILD_DIR:-build-cuda}
  cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=Release -DDSV4_CUDA=ON -DDSV4_TEST_HOOKS=ON >"$B.configure.log" 2>&1 ||
    { echo "gpu-test: configure failed (see $B.configure.log)"; tail -20 "$B.configure.log"; exit 1; }
  cmake --build "$B" -j"$JOBS" || { echo "gpu-test: build failed"; exit 1; }
fi
export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# an Open MPI copied from another machine (the lease machine has none): the
# tree of Debian's openmpi-bin / libopenmpi3 / libpmix2 under DSV4_MPI_ROOT
# (usr/, etc/, lib/ with their shared libraries), relocated by OPAL_PREFIX
if [ -n "${DSV4_MPI_ROOT:-}" ]; then
  R=$DSV4_MPI_ROOT
  export OPAL_PREFIX=$R/usr OPAL_SYSCONFDIR=$R/etc/openmpi PMIX_INSTALL_PREFIX=$R/usr/lib/x86_64-linux-gnu/pmix2
  export PATH=$R/usr/bin:$PATH LD_LIBRARY_PATH=$R/lib:$R/usr/lib/x86_64-linux-gnu:$LD_LIBRARY_PATH
  export OMPI_MCA_btl=self,vader OMPI_MCA_pml=ob1 OMPI_MCA_mtl=^ofi,psm,psm2 OMPI_MCA_osc=^ucx
  [ -e "$R/usr/bin/mpirun" ] || ln -s orterun "$R/usr/bin/mpirun"
fi
# mpirun as root (the lease machine), more ranks than cores allowed (6b)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export DSV4_SOURCE_DIR=$root
bin=$B/dsv4
if [ -z "${SYNTH_DIR:-}" ]; then
  need=$([ -n "${BENCH:-}" ] && echo 60 || echo 8)
  avail=$(df -B1G --output=avail /dev/shm 2>/dev/null | tail -1 | tr -d ' ')
  SYNTH_DIR=/tmp
  [ "${avail:-0}" -ge "$need" ] 2>/dev/null && SYNTH_DIR=/dev/shm
fi
echo "gpu-test: synth models under $SYNTH_DIR"
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT

failed=0
summary=()
run() { # name command...
  local name=$1; shift
  if [ -n "${ONLY:-}" ] && ! [[ " $ONLY " == *" $name "* ]]; then summary+=("skip $name (ONLY=$ONLY)"); return; fi
  local log=$T/log.$name t0=$SECONDS
  "$@" >"$log" 2>&1
  local rc=$?
  cat "$log"
  local last; last=$(grep -E '[0-9]+ passed, [0-9]+ failed' "$log" | tail -1)
  if [ "$rc" -eq 0 ]; then summary+=("PASS $name ${last:+($last)} $((SECONDS - t0)) s")
  else summary+=("FAIL $name rc=$rc ${last:+($last)}"); failed=1; fi
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true
"$bin" info -m models/kjv | head -2

if [ "${TESTS:-1}" != 0 ]; then
# 1. ops (and again with the shared expert on the main stream: its ops
#    against the same references, alone = in batches)
run test_cuda_ops "$B/test_cuda_ops"
# the CPU kernels on this machine's CPU (AVX-512 VNNI paths a CI machine may lack)
run test_kernels "$B/test_kernels"
run test_cuda_ops_noside env DSV4_CUDA_SIDE=0 "$B/test_cuda_ops"
# 2. the model on the GPU
export DSV4_TEST_BACKEND=cuda
run test_reference "$B/test_reference"
run test_batch "$B/test_batch"
run test_intermediates "$B/test_intermediates"
run test_long "$B/test_long"
run test_mtp "$B/test_mtp"
unset DSV4_TEST_BACKEND
# 3. the determinism checker, and the same logits in two processes
run check_q128 "$bin" check -m tests/fixtures/q128 --backend cuda --trials 30 --mode mixed
run check_kjv "$bin" check -m models/kjv --backend cuda --trials 20 --mode mixed
repeat() {
  local toks; toks=$(python3 -c "print(','.join(str((i * 7919 + 13) % 6000) for i in range(300)))")
  "$bin" logits -m models/kjv --backend cuda --tokens "$toks" -o "$T/r1" &&
    "$bin" logits -m models/kjv --backend cuda --tokens "$toks" -o "$T/r2" --prefill-chunk 37 &&
    cmp "$T/r1.0.f32" "$T/r2.0.f32" && echo "1 passed, 0 failed: two processes (whole, chunks of 37) bitwise equal"
}
run repeat_processes repeat
# 3b. CUDA graphs (docs/cuda.md): steps of up to 64 tokens are captured and
#     replayed; the bits must equal the direct launches (DSV4_CUDA_GRAPH=0):
#     token by token (one sequence, then two in one step) and chunks of 5;
#     with the default pieces (8 ops), pieces of 1 op and one graph a step
graph_bits() {
  local toks b n=0 f=0 c
  toks=$(python3 -c "print(','.join(str((i * 7919 + 13) % 6000) for i in range(120)))")
  b=$(python3 -c "print(','.join(str((i * 104729 + 7) % 6000) for i in range(90)))")
  for c in "1 1" "1 2" "5 1"; do
    set -- $c
    local args=(--tokens "$toks"); [ "$2" = 2 ] && args+=(--tokens "$b")
    DSV4_CUDA_GRAPH=0 "$bin" logits -m models/kjv --backend cuda "${args[@]}" --prefill-chunk "$1" -o "$T/gr0" >/dev/null &&
      DSV4_CUDA_GRAPH_STATS=1 "$bin" logits -m models/kjv --backend cuda "${args[@]}" --prefill-chunk "$1" -o "$T/gr1" \
        >/dev/null 2>"$T/gr.err" || { f=$((f + 1)); echo "FAIL chunk $1, $2 seqs: run"; cat "$T/gr.err"; continue; }
    cat "$T/gr.err"
    local ok=1 i
    for ((i = 0; i < $2; i++)); do cmp -s "$T/gr0.$i.f32" "$T/gr1.$i.f32" || ok=0; done
    if [ $ok = 1 ] && grep -q "cuda graphs: [1-9]" "$T/gr.err"; then n=$((n + 1)); echo "ok   chunk $1, $2 seqs: graphs = direct launches (bits)"
    else f=$((f + 1)); echo "FAIL chunk $1, $2 seqs: graph logits differ (or no graph replayed)"; fi
    # the paths a variable switches, each with direct launches (docs/cuda.md)
    local v
    for v in "DSV4_CUDA_SIDE=0:the shared expert on the main stream" \
      "DSV4_CUDA_LANES=0:the compressors and indexer in issue order"; do
      ok=0
      if env "${v%%:*}" DSV4_CUDA_GRAPH=0 "$bin" logits -m models/kjv --backend cuda "${args[@]}" --prefill-chunk "$1" \
        -o "$T/grv" >/dev/null 2>&1; then
        ok=1
        for ((i = 0; i < $2; i++)); do cmp -s "$T/gr0.$i.f32" "$T/grv.$i.f32" || ok=0; done
      fi
      if [ $ok = 1 ]; then n=$((n + 1)); echo "ok   chunk $1, $2 seqs: ${v#*:} (${v%%:*}) = the default (bits)"
      else f=$((f + 1)); echo "FAIL chunk $1, $2 seqs: ${v#*:} (${v%%:*}) differs from the default (or did not run)"; fi
    done
    # captured steps against direct launches: the step in pieces of 1 op and in
    # one graph (DSV4_CUDA_GRAPH_OPS; default 8; the lanes on: a branch's fork
    # and join stay in one piece), and in issue order in pieces of 8
    local o
    for o in "DSV4_CUDA_GRAPH_OPS=1" "DSV4_CUDA_GRAPH_OPS=0" "DSV4_CUDA_LANES=0 DSV4_CUDA_GRAPH_OPS=8"; do
      # shellcheck disable=SC2086
      env $o "$bin" logits -m models/kjv --backend cuda "${args[@]}" --prefill-chunk "$1" -o "$T/gro" \
        >/dev/null 2>&1 || { f=$((f + 1)); echo "FAIL chunk $1, $2 seqs, $o: run"; continue; }
      ok=1
      for ((i = 0; i < $2; i++)); do cmp -s "$T/gr0.$i.f32" "$T/gro.$i.f32" || ok=0; done
      if [ $ok = 1 ]; then n=$((n + 1)); echo "ok   chunk $1, $2 seqs: $o (GRAPH_OPS=0: one graph) = direct launches (bits)"
      else f=$((f + 1)); echo "FAIL chunk $1, $2 seqs: $o differs from direct launches"; fi
    done
  done
  echo "$n passed, $f failed"
  [ "$f" -eq 0 ]
}
run graph_bits graph_bits
# 4. GPU vs CPU on the bundled model
cpu_vs_gpu() {
  local prompt="4,25,9,113,7,58,311,12"
  "$bin" generate -m models/kjv --tokens "$prompt" -n 64 --backend cpu >"$T/g.cpu" &&
    "$bin" generate -m models/kjv --tokens "$prompt" -n 64 --backend cuda >"$T/g.cuda" || return 1
  local all; all="$prompt,$(tr -s ' \n' ',' <"$T/g.cpu" | sed 's/,$//')"
  "$bin" logits -m models/kjv --tokens "$all" -o "$T/l.cpu" --backend cpu &&
    "$bin" logits -m models/kjv --tokens "$all" -o "$T/l.cuda" --backend cuda || return 1
  python3 - "$T" <<'PY'
import array, sys
t = sys.argv[1]
a = array.array('f'); a.frombytes(open(t + '/l.cpu.0.f32', 'rb').read())
b = array.array('f'); b.frombytes(open(t + '/l.cuda.0.f32', 'rb').read())
d = max(abs(x - y) for x, y in zip(a, b))
same = open(t + '/g.cpu').read().split() == open(t + '/g.cuda').read().split()
print(f"greedy 64 tokens: {'same' if same else 'DIFFERENT'} text on cpu and cuda; max |logit cpu - cuda| = {d:.3g} over {len(a)} logits")
print(f"{int(same) + int(d <= 1e-3)} passed, {2 - int(same) - int(d <= 1e-3)} failed")
sys.exit(0 if same and d <= 1e-3 else 1)
PY
}
run cpu_vs_gpu cpu_vs_gpu
# 5. bad input
bad_input() {
  local n=0 f=0
  "$bin" logits -m tests/fixtures/q128 --tokens 1,2 -o "$T/x" --backend cuda --gpu 63 >"$T/e" 2>&1
  if [ $? -eq 1 ] && grep -q "^dsv4 logits: cuda" "$T/e"; then n=$((n + 1)); else f=$((f + 1)); cat "$T/e"; fi
  cat "$T/e"
  # a bad tuning variable is named, not ignored
  DSV4_CUDA_GRAPH_OPS=eight "$bin" logits -m tests/fixtures/q128 --tokens 1,2 -o "$T/x" --backend cuda >"$T/e" 2>&1
  if [ $? -eq 1 ] && grep -q "DSV4_CUDA_GRAPH_OPS='eight'" "$T/e"; then n=$((n + 1)); else f=$((f + 1)); fi
  cat "$T/e"
  local sw
  for sw in SIDE LANES; do
    env "DSV4_CUDA_$sw=yes" "$bin" logits -m tests/fixtures/q128 --tokens 1,2 -o "$T/x" --backend cuda >"$T/e" 2>&1
    if [ $? -eq 1 ] && grep -q "DSV4_CUDA_$sw='yes'" "$T/e"; then n=$((n + 1)); else f=$((f + 1)); fi
    cat "$T/e"
  done
  # a model larger than the GPU's memory (DSV4_CUDA_FREE_MIB leaves 8 MiB free)
  DSV4_CUDA_FREE_MIB=8 "$bin" logits -m models/kjv --tokens 1,2 -o "$T/x" --backend cuda >"$T/e" 2>&1
  if [ $? -eq 1 ] && grep -q "map_weights: the weights need" "$T/e"; then n=$((n + 1)); else f=$((f + 1)); fi
  cat "$T/e"
  # a step that does not fit: the model fits in 64 MiB, a 1,000,000-token sequence does not
  DSV4_CUDA_FREE_MIB=64 timeout 120 "$bin" generate -m models/kjv --tokens 1,2 -n 1000000 --backend cuda >"$T/e" 2>&1
  if [ $? -eq 1 ] && grep -q "out of memory\|device memory" "$T/e"; then n=$((n + 1)); else f=$((f + 1)); fi
  cat "$T/e"
  echo "$n passed, $f failed"
  [ "$f" -eq 0 ]
}
run bad_input bad_input
# 6b. expert parallelism on the GPU (docs/ep.md): mpirun -np 2 and 3 with the
#     CUDA backend (a host's rank r on GPU r mod the GPUs present) give the
#     single-process GPU logits bit for bit: fixtures and the bundled model,
#     two sequences in one step, chunked prefill
ep_gpu() {
  local n=0 f=0 spec dir a b r
  for spec in "tests/fixtures/q128 512" "tests/fixtures/tiny 331" "models/kjv 6000"; do
    set -- $spec
    dir=$1
    a=$(awk -v V="$2" 'BEGIN { s = 17; for (i = 0; i < 200; i++) { s = (s * 1103515245 + 12345) % 2147483648; printf "%s%d", (i ? "," : ""), int(s / 65536) % V } }')
    b=$(awk -v V="$2" 'BEGIN { s = 99; for (i = 0; i < 41; i++) { s = (s * 1103515245 + 12345) % 2147483648; printf "%s%d", (i ? "," : ""), int(s / 65536) % V } }')
    "$bin" logits -m "$dir" --tokens "$a" --tokens "$b" -o "$T/ep.one" --backend cuda >/dev/null 2>&1 ||
      { f=$((f + 1)); echo "FAIL $dir: single-process logits"; continue; }
    for r in 2 3 2r; do # data-parallel attention (the default) on 2 and 3 ranks; replicated on 2
      local att="" mode="data parallel"
      [ "$r" = 2r ] && att="--ep-attention replicated" mode="replicated"
      if ! timeout "${EP_TIMEOUT:-600}" mpirun -np "${r%r}" "$bin" logits -m "$dir" --tokens "$a" --tokens "$b" -o "$T/ep.np$r" \
        --backend cuda --prefill-chunk 7 $att >"$T/ep.out" 2>"$T/ep.err"; then
        f=$((f + 1)); echo "FAIL $dir: mpirun -np $r"; tail -20 "$T/ep.err"; continue
      fi
      grep -q "expert parallel over ${r%r} ranks" "$T/ep.err" || { f=$((f + 1)); echo "FAIL $dir: not expert parallel"; continue; }
      for i in 0 1; do
        if cmp -s "$T/ep.one.$i.f32" "$T/ep.np$r.$i.f32"; then n=$((n + 1)); echo "ok   $dir seq $i: EP=${r%r} ($mode attention) on the GPU = one process (bits)"
        else f=$((f + 1)); echo "FAIL $dir seq $i: EP=${r%r} ($mode attention) logits differ from one process"; fi
      done
    done
  done
  echo "$n passed, $f failed"
  [ "$f" -eq 0 ]
}
if ! "$bin" info -m models/kjv 2>/dev/null | grep -q "^ranks *expert parallelism over MPI"; then
  summary+=("SKIP ep_gpu (this build has no MPI: configure with -DDSV4_MPI=ON for expert parallelism)")
elif command -v mpirun >/dev/null; then
  run ep_gpu ep_gpu
else
  summary+=("SKIP ep_gpu (no mpirun: set PATH / DSV4_MPI_ROOT)")
fi
fi
# 6c. expert tiers on the GPU (docs/tiers.md): a store of a few slots with
#     each path forced (copies into slots, the CPU's experts, mixed) and the
#     cost model's choice = every expert bound, bitwise, alone, in a batch and
#     decoding; the bundled model, synth:tiny and a flash-shaped model of two
#     layers (written once under SYNTH_DIR)
if [ "${TESTS:-1}" != 0 ]; then
  run store env DSV4_TEST_HOOKS=1 DSV4_TEST_BACKEND=cuda bash tests/test_store.sh "$bin" "$root"
  d=$SYNTH_DIR/flash2
  [ -f "$d/config.json" ] || "$bin" synth --like flash --layers 2 -o "$d" >/dev/null 2>&1
  run store_flash2 env DSV4_TEST_HOOKS=1 DSV4_TEST_BACKEND=cuda STORE_MODELS="$d" bash tests/test_store.sh "$bin" "$root"
fi
# 6. speed
if [ -n "${BENCH:-}" ]; then
  for L in 4 8; do
    d=$SYNTH_DIR/flash$L
    [ -f "$d/config.json" ] || "$bin" synth --like flash --layers "$L" -o "$d" >/dev/null 2>&1
    run "bench_flash$L" "$bin" bench -m "$d" --backend cuda --prompt 512 --gen 32 --batch 8,64,256
  done
  # the experts in tiers: half of flash 4's 1,024 experts in slots, uniform routing
  run bench_tiers4 "$bin" bench -m "$SYNTH_DIR/flash4" --backend cuda --prompt 512 --gen 32 --batch 8,64 \
    --expert-slots 512
  # the whole V4-Flash shape on this GPU: 43 layers sharing 4 layers' experts
  # (13 GB of host memory), slots in 3/4 of the GPU's memory (TIER_GB)
  mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1)
  tgb=${TIER_GB:-$(awk -v m="${mib:-81559}" 'BEGIN { printf "%d", m * 1.048576 * 0.75 / 1000 }')}
  run bench_tiers_flash "$bin" bench -m synth:flash:43:4 --backend cuda --gpu-mem "$tgb" --prompt 2048 --gen 64 \
    --batch 8,64,256
  run kernels "$B/test_cuda_ops" --bench
  # a switch's two settings (the same bits: graph_bits), interleaved: flash 4
  # layers, three rounds: the shared expert on the main stream against the
  # side stream (the default); the lanes (docs/cuda.md "Lanes") off / on
  ab() {
    local r s
    for r in 1 2 3; do
      for s in 0 1; do
        echo "== round $r: $1=$s"
        env "$1=$s" "$bin" bench -m "$SYNTH_DIR/flash4" --backend cuda --prompt 512 \
          --gen 128 --batch 8,64 2>&1 | grep -E "^(prefill|decode|batch) " || return 1
      done
    done
  }
  run bench_side ab DSV4_CUDA_SIDE
  run bench_lanes ab DSV4_CUDA_LANES
  # the full V4-Flash shape (43 layers, 256 experts, ~156 GB) expert parallel
  # over two GPUs, each rank generating only its share in memory (docs/ep.md)
  if command -v mpirun >/dev/null && [ "$(nvidia-smi -L 2>/dev/null | wc -l)" -ge 2 ]; then
    run bench_ep_flash mpirun -np 2 "$bin" bench -m synth:flash --backend cuda --prompt 2048 --gen 16 --batch 16,64,256
  else
    summary+=("SKIP bench_ep_flash (needs mpirun and 2 GPUs)")
  fi
fi

echo "---- gpu-test summary ----"
printf '%s\n' "${summary[@]}"
exit $failed
