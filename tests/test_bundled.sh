#!/usr/bin/env bash
# The bundled model (models/kjv) against transformers (models/kjv/reference.json,
# computed in float32 on the same quantized weights):
#  - held-out perplexity equal to 1e-4 relative (the issue asks for 3
#    significant digits; both sides are fp32 on identical weights, so they
#    agree to ~1e-6 and 1e-4 leaves room only for rounding, not for a bug);
#  - `dsv4 run -p "And God said"` with no -m, from the repository root,
#    prints transformers' greedy continuation;
#  - `dsv4 stats` reports the expert load of every layer, matching the
#    reference's max/mean to 1e-3;
#  - its trained MTP block: `generate --mtp 1..4` (greedy and sampled) gives the
#    tokens of `--mtp 0`, with drafts accepted (an untrained or unloaded block
#    accepts next to none), and `dsv4 check --mtp 3` finds every speculative
#    request bit for bit equal to the plain one.
set -u
DSV4="$1"
SRC="$2"
K="$SRC/models/kjv"
. "$(dirname "$0")/check_lib.sh"
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT

python3 - "$K/reference.json" "$T" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
open(f"{sys.argv[2]}/ppl", "w").write(repr(r["perplexity"]["ppl"]))
g = [x for x in r["greedy"] if x["prompt"] == "And God said"][0]
open(f"{sys.argv[2]}/text", "w", encoding="utf-8").write(g["text"])
open(f"{sys.argv[2]}/n", "w").write(str(len(g["tokens"])))
load = r["expert_load_heldout"]
open(f"{sys.argv[2]}/load", "w").write(json.dumps(load))
PY

if "$DSV4" perplexity -m "$K" --file "$K/heldout.txt" >"$T/out" 2>"$T/err"; then
    got=$(sed -n 's/^perplexity: //p' "$T/out")
    want=$(cat "$T/ppl")
    if python3 -c "import sys; a,b=float(sys.argv[1]),float(sys.argv[2]); sys.exit(0 if abs(a-b)/b < 1e-4 else 1)" "$got" "$want"; then
        ok "held-out perplexity $got = transformers $want (within 1e-4 relative)"
    else
        bad "held-out perplexity $got != transformers $want"
    fi
else
    bad "dsv4 perplexity failed: $(cat "$T/err")"
fi

(cd "$SRC" && "$DSV4" run -p "And God said" -n "$(cat "$T/n")" >"$T/run" 2>"$T/err")
if cmp -s "$T/run" "$T/text"; then ok "dsv4 run (bundled model by default): '$(head -c 60 "$T/run")...'"; else
    bad "dsv4 run: '$(cat "$T/run")' != transformers '$(cat "$T/text")' ($(cat "$T/err"))"; fi

if "$DSV4" stats -m "$K" --file "$K/heldout.txt" >"$T/stats" 2>"$T/err"; then
    if python3 - "$T/stats" "$T/load" <<'PY'; then ok "dsv4 stats: per-layer max/mean matches the reference"; else bad "dsv4 stats differs from the reference"; cat "$T/stats"; fi
import json, re, sys
text = open(sys.argv[1]).read()
load = json.load(open(sys.argv[2]))
got = [float(m.group(1)) for m in re.finditer(r"^\s*\d+\s+(?:hash|routed)\s+([0-9.]+)", text, re.M)]
want = [load[k]["max_over_mean"] for k in sorted(load, key=int)]
print("stats max/mean:", got, "reference:", [round(w, 3) for w in want])
sys.exit(0 if len(got) == len(want) and all(abs(a - b) < 1e-3 for a, b in zip(got, want)) else 1)
PY
else
    bad "dsv4 stats failed: $(cat "$T/err")"
fi
# speculative decoding with the bundled block: the same tokens, and real acceptance
P=0,4,25,9,113,7,58,311,12
for samp in "" "--temperature 0.8 --seed 5"; do
    # shellcheck disable=SC2086
    "$DSV4" generate -m "$K" --tokens "$P" -n 96 $samp >"$T/g0" 2>"$T/err" || bad "generate --mtp 0: $(cat "$T/err")"
    for k in 1 2 3 4; do
        # shellcheck disable=SC2086
        "$DSV4" generate -m "$K" --tokens "$P" -n 96 --mtp $k $samp >"$T/gk" 2>"$T/err" ||
            bad "generate --mtp $k: $(cat "$T/err")"
        acc=$(sed -n 's/^mtp: [0-9]* steps, \([0-9]*\) of \([0-9]*\) drafts accepted.*/\1 \2/p' "$T/err")
        # shellcheck disable=SC2086
        set -- $acc
        if ! cmp -s "$T/gk" "$T/g0"; then bad "--mtp $k ${samp:-greedy}: other tokens than --mtp 0"
        elif [ $# -ne 2 ] || [ "$1" -lt $(($2 / 10)) ]; then bad "--mtp $k ${samp:-greedy}: drafts accepted: '${acc:-none}' (at least a tenth expected: a random block accepts next to none)"
        else ok "--mtp $k ${samp:-greedy}: the tokens of --mtp 0; $1 of $2 drafts accepted"; fi
    done
done
if "$DSV4" check -m "$K" --mtp 3 --trials 2 --requests 6 --gen 24 >"$T/check" 2>&1; then
    ok "dsv4 check --mtp 3: $(tail -n 1 "$T/check")"
else
    bad "dsv4 check --mtp 3: $(tail -n 5 "$T/check")"
fi
finish
