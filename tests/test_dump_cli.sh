#!/usr/bin/env bash
# test_dump_cli.sh — `dsv4 logits --dump PREFIX` writes every named
# intermediate of each step (forward.h's list) with an index, and its
# "logits" files hold exactly the logits `-o` writes.
set -uo pipefail
bin="$1"
src="$2"
T="$(mktemp -d)"
trap 'rm -rf "$T"' EXIT
. "$(dirname "$0")/check_lib.sh"

m="$src/tests/fixtures/q128"
# one step (whole prefill): two sequences of 3 and 2 tokens
"$bin" logits -m "$m" --tokens 1,2,3 --tokens 4,5 -o "$T/out" --dump "$T/d" >"$T/log" 2>&1 && ok || bad "logits --dump: $(cat "$T/log")"
# 1 embed + 5 layers x 11 + 3 head intermediates
n="$(wc -l <"$T/d.index")"
[ "$n" -eq 59 ] && ok || bad "index has $n lines, want 59"
grep -q " attn_out 4 5 256\$" "$T/d.index" && ok || bad "no layer-4 attn_out [5][256] in the index"
grep -q " logits -1 5 512\$" "$T/d.index" && ok || bad "no logits [5][512] in the index"
cat "$T/out.0.f32" "$T/out.1.f32" >"$T/both"
cmp -s "$T/both" "$T/d.0.-1.logits.f32" && ok || bad "the dumped logits differ from -o's"
size="$(stat -c %s "$T/d.0.2.ffn_res.f32")"
[ "$size" -eq $((5 * 4 * 256 * 4)) ] && ok || bad "ffn_res file has $size bytes"
# chunked: one file set per step, named by step
"$bin" logits -m "$m" --tokens 1,2,3 -o "$T/c" --prefill-chunk 1 --dump "$T/e" >"$T/log" 2>&1 && ok || bad "chunked --dump"
[ -f "$T/e.2.-1.logits.f32" ] && [ ! -e "$T/e.3.-1.logits.f32" ] && ok || bad "3 steps should give step files 0..2"
# an unwritable prefix is an error, not a silent success
"$bin" logits -m "$m" --tokens 1,2 -o "$T/x" --dump "$T/nodir/d" >"$T/log" 2>&1 && bad "--dump to a missing directory succeeded" || ok
grep -q "cannot write" "$T/log" && ok || bad "message for an unwritable dump: $(cat "$T/log")"
finish
