#!/usr/bin/env bash
# test_pinned_logits.sh — the logits' bits are pinned: SHA-256 of the float32
# logits of fixed token sequences on the oracle fixtures and the bundled model,
# regenerated once when MXFP4 products became exact integer sums of x quantized
# to three int8 digits and SwiGLU took common/dsmath.h's ds_expf (docs/numerics.md:
# the CPU's and the GPU's experts give the same bits), after the SIMD and the
# portable (-DDSV4_SIMD=OFF) trees gave the same hashes.
# A change of any bit fails this test; a change that is meant to alter the
# numbers must say so and regenerate tests/fixtures/pinned/logits.sha256 with
#   bash tests/test_pinned_logits.sh BUILD/dsv4 . --write
# Each model runs twice: both sequences in one batch, whole prefill, all
# threads, weights copied into memory (--load copy); and again token-chunked
# (7) on one thread, weights mapped in place (--load mmap) — both must hit the pins.
set -euo pipefail
bin="$1"
src="$2"
mode="${3:-check}"
pins="$src/tests/fixtures/pinned/logits.sha256"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# deterministic token lists: a 32-bit LCG (no dependence on any RNG library)
tokens() { # vocab n seed
  awk -v V="$1" -v N="$2" -v S="$3" 'BEGIN { s = S; for (i = 0; i < N; i++) {
    s = (s * 1103515245 + 12345) % 2147483648; printf "%s%d", (i ? "," : ""), int(s / 65536) % V } }'
}

out="$tmp/hashes"
: >"$out"
for spec in "tiny tests/fixtures/tiny 331 333" "q128 tests/fixtures/q128 512 333" "kjv models/kjv 6000 300"; do
  set -- $spec
  name="$1" dir="$src/$2" vocab="$3" len="$4"
  a="$(tokens "$vocab" "$len" 17)"
  b="$(tokens "$vocab" 41 99)"
  "$bin" logits -m "$dir" --tokens "$a" --tokens "$b" -o "$tmp/$name.whole" --load copy >/dev/null
  "$bin" logits -m "$dir" --tokens "$a" --tokens "$b" -o "$tmp/$name.chunk" --prefill-chunk 7 --threads 1 --load mmap >/dev/null
  for i in 0 1; do
    h1="$(sha256sum <"$tmp/$name.whole.$i.f32" | cut -d' ' -f1)"
    h2="$(sha256sum <"$tmp/$name.chunk.$i.f32" | cut -d' ' -f1)"
    if [ "$h1" != "$h2" ]; then
      echo "FAIL: $name sequence $i: whole-batch and chunked logits differ ($h1 vs $h2)"
      exit 1
    fi
    echo "$name.$i $h1" >>"$out"
  done
done

if [ "$mode" = "--write" ]; then
  cp "$out" "$pins"
  echo "wrote $pins"
  exit 0
fi
fail=0
while read -r key want; do
  got="$(awk -v k="$key" '$1 == k { print $2 }' "$out")"
  if [ "$got" = "$want" ]; then
    echo "ok: $key"
  else
    echo "FAIL: $key: logits hash $got, pinned $want"
    fail=1
  fi
done <"$pins"
[ "$(wc -l <"$pins")" -eq 6 ] || { echo "FAIL: $pins should hold 6 pins"; fail=1; }
[ "$fail" -eq 0 ] && echo "6 passed, 0 failed"
exit "$fail"
