#!/usr/bin/env bash
# test_store.sh BIN SRC — the routed experts in tiers (--gpu-mem /
# --expert-slots, model/store.c) give the bits of every expert on the
# backend: on the bundled model and a synthetic one, a store of a few slots
# (most experts in host memory) with each way forced in turn (copy into
# staging slots, compute on the CPU, both mixed) and the cost model's choice
# gives logits bitwise equal to the ordinary run's, for two sequences in one
# batch, a sequence alone and token-by-token decoding; the report says the
# forced way was taken (copies only, CPU only, both). A load file puts the
# resident slots on its layer. Too little memory for the dense weights, more
# slots than --gpu-mem holds and a copy without a slot are errors naming the
# sizes. DSV4_TEST_BACKEND (default cpu) picks the backend, STORE_MODELS the
# models (default: the bundled one and synth:tiny).
set -u
BIN=$1
SRC=$2
T=$(mktemp -d)
. "$(dirname "$0")/check_lib.sh"
. "$(dirname "$0")/serve_lib.sh"
trap 'serve_cleanup; rm -rf "$T"' EXIT
BE=${DSV4_TEST_BACKEND:-cpu}
MODELS=${STORE_MODELS:-"$SRC/models/kjv synth:tiny synth:tiny:6:2"}

same() { # A B N: the N sequences' logits files equal
  local i
  for ((i = 0; i < $3; i++)); do cmp -s "$1.$i.f32" "$2.$i.f32" || return 1; done
}
pct() { # WHAT FILE: the percentage the report gives WHAT ("in slots", "copied", "on the CPU")
  sed -n "s/.*expert picks: \(.*\)/\1/p" "$2" | tr ',;' '\n\n' | grep "% $1" | head -1 | sed 's/^ *\([0-9.]*\)%.*/\1/'
}

for M in $MODELS; do
  name=${M##*/}
  V=$("$BIN" info -m "$M" 2>/dev/null | sed -n 's/.*vocab \([0-9]*\).*/\1/p' | head -1)
  V=${V:-1000}
  a=$(python3 -c "print(','.join(str((i * 7919 + 13) % $V) for i in range(40)))")
  b=$(python3 -c "print(','.join(str((i * 104729 + 7) % $V) for i in range(23)))")
  "$BIN" logits -m "$M" --backend "$BE" --tokens "$a" --tokens "$b" -o "$T/ref" 2>"$T/err" ||
    { bad "$name: the ordinary run: $(cat "$T/err")"; continue; }
  for way in copy cpu mixed auto; do
    "$BIN" logits -m "$M" --backend "$BE" --tokens "$a" --tokens "$b" -o "$T/st" --expert-slots 5 \
      --tier-path "$way" 2>"$T/rep" || { bad "$name $way: $(cat "$T/rep")"; continue; }
    same "$T/ref" "$T/st" 2 && ok "$name: --expert-slots 5 --tier-path $way: two sequences' logits = every expert bound (bits)" ||
      bad "$name $way: logits differ from every expert bound"
    c=$(pct copied "$T/rep")
    u=$(pct "on the CPU" "$T/rep")
    case $way in
    copy) [ "$c" != 0.0 ] && [ "$u" = 0.0 ] ;;
    cpu) [ "$c" = 0.0 ] && [ "$u" != 0.0 ] ;;
    mixed) [ "$c" != 0.0 ] && [ "$u" != 0.0 ] ;;
    auto) [ -n "$c" ] && [ -n "$u" ] ;;
    esac && ok "$name $way: ${c}% of the picks copied, ${u}% on the CPU" ||
      bad "$name $way: the report does not show the forced way: $(cat "$T/rep")"
  done
  "$BIN" logits -m "$M" --backend "$BE" --tokens "$b" -o "$T/alone" --expert-slots 3 --tier-path mixed 2>"$T/err" &&
    cmp -s "$T/alone.0.f32" "$T/ref.1.f32" && ok "$name: the second sequence alone, 3 slots, mixed = in the batch (bits)" ||
    bad "$name: alone with the store differs: $(cat "$T/err")"
  "$BIN" logits -m "$M" --backend "$BE" --tokens "$a" --tokens "$b" -o "$T/dec" --prefill-chunk 1 --expert-slots 4 \
    --tier-path mixed 2>"$T/err" && same "$T/ref" "$T/dec" 2 &&
    ok "$name: token-by-token decoding, 4 slots, mixed = the whole prefill without a store (bits)" ||
    bad "$name: decoding with the store differs: $(cat "$T/err")"
done

# the CPU's experts through a CPU backend of the store's own (as beside a
# GPU: x downloaded, the rows uploaded), a test hook
if [ -n "${DSV4_TEST_HOOKS:-}" ] && [ "$BE" = cpu ]; then
  M=$SRC/models/kjv
  a=$(python3 -c "print(','.join(str((i * 7919 + 13) % 6000) for i in range(40)))")
  b=$(python3 -c "print(','.join(str((i * 104729 + 7) % 6000) for i in range(23)))")
  "$BIN" logits -m "$M" --tokens "$a" --tokens "$b" -o "$T/ref" 2>/dev/null
  for way in cpu mixed; do
    DSV4_TEST_STORE_OWN_CPU=1 "$BIN" logits -m "$M" --tokens "$a" --tokens "$b" -o "$T/own" --expert-slots 5 \
      --tier-path $way 2>"$T/err" && same "$T/ref" "$T/own" 2 &&
      ok "kjv $way, the CPU's experts on a backend of their own: logits = every expert bound (bits)" ||
      bad "own CPU backend, $way: $(cat "$T/err")"
  done
fi

# synth:tiny:6:2: layers 2-5 read the experts of layers 0-1, so host memory
# holds a third of them (and the logits are not tiny:6's)
"$BIN" logits -m synth:tiny:6 --backend "$BE" --tokens 1,2,3,4,5 -o "$T/t6" --expert-slots 4 --tier-path cpu 2>"$T/r6" &&
  "$BIN" logits -m synth:tiny:6:2 --backend "$BE" --tokens 1,2,3,4,5 -o "$T/t62" --expert-slots 4 --tier-path cpu 2>"$T/r62" ||
  bad "synth:tiny:6 / 6:2: $(cat "$T/r6" "$T/r62")"
hostkb() { # the report's bytes in host memory, in kB
  sed -n 's/.*(\([0-9.]*\) \([kMG]\)B in host memory[^)]*).*/\1 \2/p' "$1" |
    awk '{ print $1 * ($2 == "k" ? 1 : $2 == "M" ? 1e3 : 1e6) }'
}
h6=$(hostkb "$T/r6")
h62=$(hostkb "$T/r62")
[ -n "$h6" ] && [ -n "$h62" ] && python3 -c "import sys; sys.exit(abs($h62 * 3 - $h6) > 0.02 * $h6)" &&
  ! cmp -s "$T/t6.0.f32" "$T/t62.0.f32" && ok "synth:tiny:6:2 holds $h62 kB of experts in host memory, a third of tiny:6's $h6" ||
  bad "shared expert layers: $h62 kB vs $h6 kB; $(cat "$T/r62")"

# placement from load: all the load on the last layer puts the resident slots there
M=$SRC/models/kjv
for e in 1 3 5 7 9 11; do echo "5 $e 100"; done >"$T/load" # 6 experts, 8 slots: 4 resident
a=$(python3 -c "print(','.join(str((i * 7919 + 13) % 6000) for i in range(40)))")
"$BIN" logits -m "$M" --backend "$BE" --tokens "$a" -o "$T/ld" --expert-slots 8 --tier-path cpu --expert-load "$T/load" \
  2>"$T/rep" || bad "load file: $(cat "$T/rep")"
by=$(sed -n 's/.*in slots by layer: //p' "$T/rep")
set -- $by
[ "$#" = 6 ] && [ "$1" = 0% ] && [ "$6" != 0% ] && ok "--expert-load on layer 5: slots serve layer 5 only ($by)" ||
  bad "--expert-load: by layer '$by'"

# re-placement: decoding 80 tokens one at a time (more than DS_STORE_REPLACE_STEPS
# steps) from a load file that names experts of layer 5 only moves resident
# slots to the experts the steps chose, and the logits keep their bits
a=$(python3 -c "print(','.join(str((i * 7919 + 13) % 6000) for i in range(80)))")
"$BIN" logits -m "$M" --backend "$BE" --tokens "$a" -o "$T/r0" 2>"$T/err" &&
  "$BIN" logits -m "$M" --backend "$BE" --tokens "$a" -o "$T/r1" --prefill-chunk 1 --expert-slots 32 --tier-path mixed \
    --expert-load "$T/load" 2>"$T/rep" || bad "re-placement run: $(cat "$T/err" "$T/rep")"
n=$(sed -n 's/.*experts, \([0-9]*\) of them re-placed.*/\1/p' "$T/rep")
cmp -s "$T/r0.0.f32" "$T/r1.0.f32" && [ "${n:-0}" -gt 0 ] &&
  ok "80 decode steps from a layer-5 load file: $n experts re-placed, logits = every expert bound (bits)" ||
  bad "re-placement: $n re-placed; $(cat "$T/rep")"

# sizes: the bundled model's dense bytes from its safetensors headers (not its
# MTP block's: bound only with --mtp), and
# as the backend holds them (the error's; norms in f32, the hash table in
# 32 bits: within 2% of the headers')
hdr=$(python3 - "$M" <<'PY'
import glob, json, struct, sys
d = 0
for f in glob.glob(sys.argv[1] + "/*.safetensors"):
    with open(f, "rb") as fh:
        n = struct.unpack("<Q", fh.read(8))[0]
        h = json.loads(fh.read(n))
    d += sum(v["data_offsets"][1] - v["data_offsets"][0] for k, v in h.items()
             if k != "__metadata__" and ".ffn.experts." not in k and not k.startswith("mtp."))
print(d)
PY
)
"$BIN" logits -m "$M" --backend "$BE" --tokens 1,2,3 -o "$T/x" --gpu-mem 0.005 2>"$T/err" && bad "--gpu-mem below the dense weights ran"
dense=$(sed -n 's/.*does not hold the dense weights ([0-9.]* GB, \([0-9]*\) bytes.*/\1/p' "$T/err")
[ -n "$dense" ] && python3 -c "import sys; sys.exit(abs($dense - $hdr) > 0.02 * $hdr)" &&
  ok "--gpu-mem 0.005: $(cat "$T/err") (headers: $hdr bytes)" || bad "--gpu-mem below dense: $(cat "$T/err")"
dense=${dense:-$hdr}
gb=$(python3 -c "print(($dense + 1000) / 1e9)") # not one slot (an expert is ~106 kB)
"$BIN" logits -m "$M" --backend "$BE" --tokens 1,2,3 -o "$T/x" --gpu-mem "$gb" --tier-path copy 2>"$T/err" &&
  bad "--tier-path copy without a slot ran" ||
  { grep -q "copies experts into slots, and --gpu-mem .* holds none" "$T/err" && ok "copy without a slot: $(cat "$T/err")" ||
    bad "copy without a slot: $(cat "$T/err")"; }
"$BIN" logits -m "$M" --backend "$BE" --tokens 1,2,3 -o "$T/x" --gpu-mem "$gb" --tier-path cpu 2>"$T/err" >/dev/null &&
  grep -q "expert tiers: 0 slots" "$T/err" && ok "--gpu-mem just over the dense weights, cpu: runs with 0 slots" ||
  bad "0 slots on the CPU path: $(cat "$T/err")"
"$BIN" logits -m "$M" --backend "$BE" --tokens 1,2,3 -o "$T/x" --gpu-mem "$gb" --expert-slots 2 2>"$T/err" &&
  bad "--expert-slots over --gpu-mem ran" ||
  { grep -q "expert-slots 2: --gpu-mem .* holds 0 slots" "$T/err" && ok "slots over --gpu-mem: $(cat "$T/err")" ||
    bad "slots over --gpu-mem: $(cat "$T/err")"; }
if [ -n "${DSV4_TEST_HOOKS:-}" ]; then # a host of 8 MiB: less than the bundled model's 10.2 MB of experts
  DSV4_TEST_MEM_TOTAL_MB=8 "$BIN" logits -m "$M" --backend "$BE" --tokens 1,2,3 -o "$T/x" --expert-slots 4 2>"$T/err" &&
    bad "experts over the host's memory ran" ||
    { grep -q "the routed experts (0.010 GB) do not fit this host's memory (0.008 GB)" "$T/err" &&
      ok "a host too small: $(cat "$T/err")" || bad "host too small: $(cat "$T/err")"; }
fi
"$BIN" logits -m "$M" --backend "$BE" --tokens 1,2,3 -o "$T/x" --gpu-mem -1 2>"$T/err" && bad "--gpu-mem -1 ran" ||
  { grep -q "gpu-mem -1: must be" "$T/err" && ok "--gpu-mem -1: $(cat "$T/err")" || bad "--gpu-mem -1: $(cat "$T/err")"; }
# the server: /metrics counts the picks by way, per layer and in all
bin=$BIN work=$T
serve_args=(-m "$SRC/models/kjv" --backend "$BE")
start_server tiers --expert-slots 5 --tier-path mixed
reply=$(curl -s -m 120 -H 'Content-Type: application/json' \
  --data-binary '{"prompt":"In the beginning","max_tokens":8}' "$url/v1/completions")
curl -s -m 30 "$url/metrics" >"$T/metrics"
stop_server "$pid"
grep -q '"completion_tokens":8' <<<"$reply" || bad "serve with tiers: reply $reply"
val() { sed -n "s/^dsv4_expert_tier_picks_total{way=\"$1\"} //p" "$T/metrics"; }
c=$(val copied) u=$(val cpu) h=$(val slot)
nl=$(grep -c '^dsv4_expert_tier_picks_total{layer=' "$T/metrics")
[ "${c:-0}" -gt 0 ] && [ "${u:-0}" -gt 0 ] && [ -n "$h" ] && [ "$nl" = 18 ] &&
  grep -q '^dsv4_expert_tier_copies_total [1-9]' "$T/metrics" &&
  ok "serve --expert-slots 5 --tier-path mixed: /metrics picks in slots $h, copied $c, on the CPU $u ($nl per-layer lines)" ||
  bad "/metrics with tiers: $(grep expert_tier "$T/metrics" | head -5)"

finish test_store
