#!/usr/bin/env bash
# test_serve_mtp.sh — speculative decoding in `dsv4 serve` (--mtp K) on a
# tiny synth model with an MTP block (random weights, the bundled model's
# tokenizer): the same greedy and seeded requests, each sent alone next to
# another request, then all at once (the batch over --mtp-max-batch: speculation
# ends mid-request), then continuing their conversations (prefix reuse with the
# block's state), give the same text, tokens and logprobs -- the JSON numbers
# compared as text -- from a server without speculation (--mtp 0) and from
# servers with --mtp 3:
#   b: the block's own drafts (random weights: rejected, every verify step rewound);
#   c: (a build with DSV4_TEST_HOOKS) drafts from an oracle, the tokens server a
#      sampled, every 4th one broken: drafts accepted and rejected, checked by
#      the /metrics counters and each response's usage.
set -euo pipefail
bin="$1"
work="$PWD/serve_mtp_test"
rm -rf "$work"
mkdir -p "$work"
src="$2"
# shellcheck source=tests/serve_lib.sh
. "$src/tests/serve_lib.sh"
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}quarantine_size_mb=8"

model="$work/model"
"$bin" synth --like tiny --mtp --vocab 6000 -o "$model" >/dev/null
cp "$src/models/kjv/tokenizer.json" "$src/models/kjv/tokenizer_config.json" "$model/"

serve_args=(-m "$model" --threads 2)
post() { # URL BODY OUT
  local st
  st=$(curl -s -o "$3" -w '%{http_code}' -H 'Content-Type: application/json' --data-binary "$2" "$1/v1/completions")
  [ "$st" = 200 ] || fail "status $st for $2: $(head -c 300 "$3")"
}

prompts=("In the beginning" "And the LORD said" "Blessed are the" "The heavens declare" "Now these are the names"
  "For God so loved")
body() { # I [PREFIX]: greedy for even i, seeded sampling (with a penalty) for odd i
  local i="$1" p="${prompts[$(($1 / 2))]}${2:-}"
  python3 -c 'import json,sys
i=int(sys.argv[1]); b={"prompt":sys.argv[2],"max_tokens":20+i,"logprobs":3}
if i%2: b.update(temperature=0.9,top_p=0.95,seed=100+i,frequency_penalty=0.3)
else: b.update(temperature=0)
print(json.dumps(b))' "$i" "$p"
}
noise='{"prompt":"Thou shalt","max_tokens":30,"temperature":0.7,"seed":5}'
n=$((${#prompts[@]} * 2))

run_rounds() { # NAME: the same requests against $url, answers in $work/NAME.*
  local name="$1" i w
  for i in $(seq 0 $((n - 1))); do # alone, next to another request
    post "$url" "$noise" "$work/$name.r.noise.$i" &
    w=$!
    post "$url" "$(body "$i")" "$work/$name.r.solo.$i"
    wait "$w"
  done
  local ws=()
  for i in $(seq 0 $((n - 1))); do
    post "$url" "$(body "$i")" "$work/$name.r.all.$i" &
    ws+=($!)
  done
  post "$url" "$noise" "$work/$name.r.noise"
  for w in "${ws[@]}"; do wait "$w" || fail "a concurrent request failed"; done
  for i in $(seq 0 $((n - 1))); do # the conversation goes on: a prompt extending the last one and its reply
    local more
    more=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["choices"][0]["text"] + " And")' \
      "$work/$name.r.solo.$i")
    post "$url" "$(body "$i" "$more")" "$work/$name.r.next.$i"
  done
}
# text, finish_reason and logprobs (numbers as the server wrote them)
canon() {
  python3 -c 'import json,sys
j=json.load(open(sys.argv[1]),parse_float=str,parse_int=str)
c=j["choices"][0]
print(json.dumps([c["text"],c["finish_reason"],c["logprobs"]],sort_keys=True))' "$1"
}
compare() { # A B
  local f k
  for f in "$work/$1".r.*; do
    k="${f#"$work/$1"}"
    [ -f "$work/$2$k" ] || fail "$2$k missing"
    [ "$(canon "$f")" = "$(canon "$work/$2$k")" ] || fail "$1$k and $2$k differ:
$(canon "$f" | head -c 600)
$(canon "$work/$2$k" | head -c 600)"
  done
}
metric() { curl -s "$1/metrics" | sed -n "s/^$2 //p"; }

hooks="${DSV4_TEST_HOOKS:-0}"
DSV4_TEST_MTP_RECORD="$work/oracle" start_server a --mtp 0 --ctx 512
a_pid="$pid"
run_rounds a
grep -q "rejected_prediction_tokens" "$work/a.r.solo.0" && fail "usage reports drafts without --mtp"
stop_server "$a_pid"
echo "ok   server a (--mtp 0): $((n * 3 + n + 1)) requests"

start_server b --mtp 3 --ctx 512
b_url="$url"
b_pid="$pid"
run_rounds b
compare a b
drafted=$(metric "$b_url" dsv4_mtp_draft_tokens_total)
[ "${drafted:-0}" -gt 0 ] || fail "server b drafted no tokens"
grep -q '"rejected_prediction_tokens":[1-9]' "$work/b.r.solo.0" || fail "usage: no drafts in $(cat "$work/b.r.solo.0")"
accepted=$(metric "$b_url" dsv4_mtp_accepted_tokens_total)
stop_server "$b_pid"
echo "ok   server b (--mtp 3, the block's drafts): the same bits; $accepted of $drafted drafts accepted"

if [ "$hooks" = 1 ]; then
  [ -s "$work/oracle" ] || fail "the oracle file is empty (DSV4_TEST_MTP_RECORD)"
  DSV4_TEST_MTP_ORACLE="$work/oracle" DSV4_TEST_MTP_WRONG=4 start_server c --mtp 3 --ctx 512
  c_url="$url"
  c_pid="$pid"
  run_rounds c
  compare a c
  drafted=$(metric "$c_url" dsv4_mtp_draft_tokens_total)
  accepted=$(metric "$c_url" dsv4_mtp_accepted_tokens_total)
  verify=$(metric "$c_url" dsv4_mtp_verify_total)
  [ "${accepted:-0}" -gt 0 ] || fail "server c accepted no drafts ($drafted drafted)"
  [ "$accepted" -lt "$drafted" ] || fail "server c rejected no drafts ($accepted of $drafted)"
  python3 -c 'import sys; a,v=int(sys.argv[1]),int(sys.argv[2]); assert (v+a)/v > 1.5, (a, v)' "$accepted" "$verify" ||
    fail "acceptance length $accepted / $verify too low for an oracle"
  grep -q '"accepted_prediction_tokens":[1-9]' "$work"/c.r.solo.* || fail "usage: no accepted drafts"
  stop_server "$c_pid"
  echo "ok   server c (--mtp 3, oracle drafts): the same bits; $accepted of $drafted drafts accepted in $verify verify steps"
else
  echo "skip server c, oracle drafts (a build without DSV4_TEST_HOOKS)"
fi
echo "all passed"
