#!/usr/bin/env bash
# test_serve_long.sh — a long request through `dsv4 serve` on the bundled
# model: a completion of a ~12,000-token prompt (seeded sampling, logprobs)
# alone, then the same request while six short ones run beside it, must come
# back byte for byte the same; a prompt over --ctx gets 400
# context_length_exceeded. The server prefills the long prompt in chunks
# between the short requests' decode steps (docs/server.md).
set -euo pipefail
bin="$1"
src="$2"
work="$PWD/serve_long_test"
rm -rf "$work"
mkdir -p "$work"
# shellcheck source=tests/serve_lib.sh
. "$src/tests/serve_lib.sh"
serve_args=(-m "$src/models/kjv")
start_server srv --ctx 16384 --max-seqs 8
# a long prompt of verses' words (deterministic), and one over --ctx
python3 - "$work" <<'PY'
import json, random, sys
w = ("and the lord said unto moses behold i will make thee a great nation in the land "
     "which i shall give thee for an everlasting possession so that thy seed shall be as "
     "the stars of heaven and as the sand which is upon the sea shore").split()
r = random.Random(7)
def body(n, seed, mt):
    return json.dumps({"model": "kjv", "prompt": " ".join(r.choice(w) for _ in range(n)), "max_tokens": mt,
                       "seed": seed, "temperature": 1.0, "logprobs": 5})
open(sys.argv[1] + "/long.json", "w").write(body(11000, 11, 24))
open(sys.argv[1] + "/over.json", "w").write(body(20000, 12, 4))
for i in range(6):
    open(sys.argv[1] + f"/short{i}.json", "w").write(body(40, 100 + i, 64))
PY
post() { # BODY_FILE OUT_FILE -> status
  curl -s -o "$2" -w '%{http_code}' -H 'Content-Type: application/json' --data-binary "@$1" "$url/v1/completions"
}
strip() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(json.dumps([d['choices'], d['usage']]))" "$1"; }
st=$(post "$work/long.json" "$work/alone")
[ "$st" = 200 ] || { cat "$work/alone"; fail "long request alone: status $st"; }
n=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['usage']['prompt_tokens'])" "$work/alone")
[ "$n" -ge 10000 ] || fail "the long prompt is $n tokens (want >= 10,000)"
echo "long request alone: $n prompt tokens"
spids=()
for i in 0 1 2; do post "$work/short$i.json" "$work/s$i" >/dev/null & spids+=($!); done
sleep 0.2
post "$work/long.json" "$work/beside" >"$work/st" &
lp=$!
for i in 3 4 5; do post "$work/short$i.json" "$work/s$i" >/dev/null & spids+=($!); done
wait "$lp"
for p in "${spids[@]}"; do wait "$p"; done
[ "$(cat "$work/st")" = 200 ] || { cat "$work/beside"; fail "long request beside short ones: status $(cat "$work/st")"; }
[ "$(strip "$work/alone")" = "$(strip "$work/beside")" ] || fail "the long request beside six short ones differs from it alone"
echo "ok   the long request beside six short ones = alone (text, logprobs, usage)"
st=$(post "$work/over.json" "$work/over")
[ "$st" = 400 ] && grep -q context_length_exceeded "$work/over" || { cat "$work/over"; fail "a prompt over --ctx: status $st"; }
echo "ok   a prompt over --ctx: 400 context_length_exceeded"
stop_server "$pid"
echo "test_serve_long: 3 passed, 0 failed"
