#!/usr/bin/env bash
# test_run_cli.sh BIN SRC — `dsv4 run`, `dsv4 chat`, `dsv4 perplexity` and
# `dsv4 stats` end to end on the quantized random-weight fixture q128 (vocab
# 512) with a 512-token tokenizer cut from tests/fixtures/tokenizer/tok_small.json
# (the 3 special tokens, the 256 byte tokens, its first 231 merges, then
# DeepSeek's 22 added tokens at ids 490..511).
set -u
BIN=$1
SRC=$2
. "$(dirname "$0")/check_lib.sh"
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT

expect_eq() { if [ "$2" == "$3" ]; then ok; else bad "$1: got '$2', want '$3'"; fi; }
expect_ne() { if [ "$2" != "$3" ]; then ok; else bad "$1: both '$2'"; fi; }
# expect_rc NAME WANT_RC CMD...: runs CMD, stdout/stderr in $T/out, $T/err
expect_rc() {
    local name=$1 want=$2
    shift 2
    "$@" >"$T/out" 2>"$T/err"
    local rc=$?
    if [ "$rc" -eq "$want" ]; then ok; else bad "$name: exit $rc, want $want ($(head -c 300 "$T/err"))"; fi
    if grep -q "Sanitizer\|runtime error" "$T/err"; then bad "$name: sanitizer report: $(head -c 600 "$T/err")"; fi
}
expect_err() { if grep -qF -- "$2" "$T/err"; then ok; else bad "$1: stderr lacks '$2': $(head -c 300 "$T/err")"; fi; }
expect_out() { if grep -qF -- "$2" "$T/out"; then ok; else bad "$1: stdout lacks '$2': $(head -c 300 "$T/out")"; fi; }

# ---- the model: q128 + a tokenizer of 512 ids
M=$T/model
cp -r "$SRC/tests/fixtures/q128" "$M"
python3 - "$SRC/tests/fixtures/tokenizer/tok_small.json" "$M/tokenizer.json" 512 <<'PY' || { echo "cannot build tokenizer"; exit 1; }
import json, sys
src, dst, V = sys.argv[1], sys.argv[2], int(sys.argv[3])
d = json.load(open(src, encoding="utf-8"))
added = [a for a in d["added_tokens"] if a["id"] < 3 or 3000 <= a["id"] <= 3021]
after = [a for a in added if a["id"] >= 3000]
cut = V - len(after)  # model tokens keep their ids < cut
vocab = {t: i for t, i in d["model"]["vocab"].items() if i < cut}
merges = [m for m in d["model"]["merges"] if vocab.get(m[0] + m[1], cut) < cut]
for k, a in enumerate(after):
    a["id"] = cut + k
    vocab[a["content"]] = a["id"]
assert sorted(vocab.values()) == list(range(V)), "ids must be exactly 0..V-1"
d["added_tokens"], d["model"]["vocab"], d["model"]["merges"] = added, vocab, merges
json.dump(d, open(dst, "w", encoding="utf-8"), ensure_ascii=False)
PY
BOS=0
EOS=1
P="In the beginning God created"
PIDS=$("$BIN" tokenize -m "$M" --text "$P")

# ---- help
expect_rc "run --help" 0 "$BIN" run --help
expect_out "run --help" "usage: dsv4 run"
expect_rc "chat --help" 0 "$BIN" chat --help
expect_rc "perplexity --help" 0 "$BIN" perplexity --help
expect_out "perplexity --help" "exp(total NLL"
expect_rc "stats --help" 0 "$BIN" stats --help
"$BIN" --help | grep -q "perplexity" && ok || bad "dsv4 --help lists perplexity"

# ---- run: greedy, deterministic, equal to generate + detokenize
expect_rc "run greedy" 0 "$BIN" run -m "$M" -p "$P" -n 12
cp "$T/out" "$T/greedy1"
expect_err "run prints prompt speed" "prompt: "
expect_err "run prints generation speed" "tokens/s"
prompt_n=$(sed -n 's/^prompt: \([0-9]*\) tokens.*/\1/p' "$T/err")
expect_eq "prompt tokens = BOS + ids" "$prompt_n" "$(($(echo "$PIDS" | wc -w) + 1))"
expect_rc "run greedy again" 0 "$BIN" run -m "$M" -p "$P" -n 12
cmp -s "$T/out" "$T/greedy1" && ok || bad "greedy twice gives the same text"
gen=$("$BIN" generate -m "$M" --tokens "$BOS $PIDS" -n 12 --stop $EOS)
"$BIN" detokenize -m "$M" --lossy --skip-special --ids "$gen" >"$T/want"
cmp -s "$T/greedy1" "$T/want" && ok || bad "run stream = detokenize(generate ids) (greedy)"
n_gen=$(echo "$gen" | wc -w)
expect_eq "-n respected" "$(sed -n 's/^generated: \([0-9]*\) tokens.*/\1/p' "$T/err")" "$n_gen"
[ "$n_gen" -le 12 ] && ok || bad "at most -n tokens ($n_gen)"
expect_rc "run -n 3" 0 "$BIN" run -m "$M" -p "$P" -n 3
gen3=$("$BIN" generate -m "$M" --tokens "$BOS $PIDS" -n 3 --stop $EOS)
expect_eq "-n 3 tokens" "$(sed -n 's/^generated: \([0-9]*\) tokens.*/\1/p' "$T/err")" "$(echo "$gen3" | wc -w)"
"$BIN" detokenize -m "$M" --lossy --skip-special --ids "$gen3" >"$T/want3"
cmp -s "$T/out" "$T/want3" && ok || bad "-n 3 text"
expect_rc "run -n 0" 0 "$BIN" run -m "$M" -p "$P" -n 0
expect_eq "-n 0 prints nothing" "$(wc -c <"$T/out")" "0"

# sampled: same seed -> same text, = generate with the same options
S="--temperature 0.9 --top-k 40 --top-p 0.95 --min-p 0.01 --repeat-penalty 1.1"
expect_rc "run sampled" 0 "$BIN" run -m "$M" -p "$P" -n 16 $S --seed 7
cp "$T/out" "$T/s7"
expect_rc "run sampled again" 0 "$BIN" run -m "$M" -p "$P" -n 16 $S --seed 7 --threads 1 --prefill-chunk 2
cmp -s "$T/out" "$T/s7" && ok || bad "same seed (other threads / chunk) gives the same text"
expect_rc "run other seed" 0 "$BIN" run -m "$M" -p "$P" -n 16 $S --seed 8
cmp -s "$T/out" "$T/s7" && bad "seeds 7 and 8 give the same text" || ok
gen=$("$BIN" generate -m "$M" --tokens "$BOS $PIDS" -n 16 --stop $EOS --temperature 0.9 --top-k 40 --top-p 0.95 \
    --min-p 0.01 --seed 7)
# (generate has no --repeat-penalty: compare without it)
"$BIN" run -m "$M" -p "$P" -n 16 --temperature 0.9 --top-k 40 --top-p 0.95 --min-p 0.01 --seed 7 >"$T/s7b" 2>/dev/null
"$BIN" detokenize -m "$M" --lossy --skip-special --ids "$gen" >"$T/want"
cmp -s "$T/s7b" "$T/want" && ok || bad "run stream = detokenize(generate ids) (sampled)"

# --raw: no BOS; --special keeps special tokens in the text
gen=$("$BIN" generate -m "$M" --tokens "$PIDS" -n 10 --stop $EOS)
"$BIN" detokenize -m "$M" --lossy --ids "$gen" >"$T/want"
"$BIN" run -m "$M" -p "$P" -n 10 --raw --special >"$T/raw" 2>"$T/err"
if [ "$(echo "$gen" | awk '{print $NF}')" = "$EOS" ]; then
    gen=$(echo "$gen" | awk '{NF--; print}')
    "$BIN" detokenize -m "$M" --lossy --ids "$gen" >"$T/want"
fi
cmp -s "$T/raw" "$T/want" && ok || bad "--raw --special = detokenize(generate ids without BOS)"

# --chat: the prompt as one user message of the chat template
CH=$(printf '<｜begin▁of▁sentence｜><｜User｜>%s<｜Assistant｜></think>' "$P")
gen=$("$BIN" generate -m "$M" --tokens "$("$BIN" tokenize -m "$M" --text "$CH")" -n 8 --stop $EOS)
"$BIN" detokenize -m "$M" --lossy --skip-special --ids "$gen" >"$T/want"
expect_rc "run --chat" 0 "$BIN" run -m "$M" -p "$P" -n 8 --chat
cmp -s "$T/out" "$T/want" && ok || bad "run --chat = generate on the chat template"
expect_rc "run --chat --think" 0 "$BIN" run -m "$M" -p "$P" -n 4 --chat --think

# prompt from a file; default model from DSV4_MODEL
printf '%s' "$P" >"$T/prompt.txt"
expect_rc "run -f" 0 "$BIN" run -m "$M" -f "$T/prompt.txt" -n 12
cmp -s "$T/out" "$T/greedy1" && ok || bad "run -f = run -p"
(cd "$T" && DSV4_MODEL="$M" "$BIN" run -p "$P" -n 12 >"$T/envout" 2>"$T/err") && ok || bad "run with DSV4_MODEL: $(cat "$T/err")"
cmp -s "$T/envout" "$T/greedy1" && ok || bad "DSV4_MODEL gives the same model"

# ---- chat: piped turns, EOF / /exit, cached = re-prefilled
printf 'Hello there\nHow are you?\n' >"$T/turns"
expect_rc "chat two turns" 0 "$BIN" chat -m "$M" -n 6 --verbose <"$T/turns"
expect_eq "chat: one reply per turn" "$(grep -c '^\[prompt' "$T/err")" "2"
cp "$T/out" "$T/chat1"
expect_rc "chat --no-cache" 0 "$BIN" chat -m "$M" -n 6 --no-cache <"$T/turns"
cmp -s "$T/out" "$T/chat1" && ok || bad "chat: cached and re-prefilled conversations reply the same"
printf 'Hello there\nHow are you?\nAnd then?\n' >"$T/turns3"
expect_rc "chat -n 1 (prefix reuse)" 0 "$BIN" chat -m "$M" -n 1 --verbose <"$T/turns3"
grep -q "(11 cached)" "$T/err" && ok || bad "chat reuses the sequence: $(grep '^\[' "$T/err" | head -3)"
cp "$T/out" "$T/chatn1"
expect_rc "chat -n 1 --no-cache" 0 "$BIN" chat -m "$M" -n 1 --no-cache --verbose <"$T/turns3"
grep -q "([1-9][0-9]* cached)" "$T/err" && bad "--no-cache reuses the sequence" || ok
cmp -s "$T/out" "$T/chatn1" && ok || bad "chat -n 1: cached = re-prefilled"
expect_rc "chat --think, sampled" 0 "$BIN" chat -m "$M" -n 5 --think --temperature 0.7 --seed 3 <"$T/turns"
printf 'Hi\n/exit\nnever read\n' >"$T/exit"
expect_rc "chat /exit" 0 "$BIN" chat -m "$M" -n 3 --verbose <"$T/exit"
expect_eq "chat /exit stops" "$(grep -c '^\[prompt' "$T/err")" "1"
expect_rc "chat empty input" 0 "$BIN" chat -m "$M" </dev/null
expect_rc "chat context too small" 1 "$BIN" chat -m "$M" --ctx 8 <"$T/turns"
expect_err "chat context too small" "--ctx"
# a message beyond the context is refused, the session goes on: /reset, then a turn
{ printf 'x%.0s' $(seq 1 200); printf '\n/reset\nHi\n'; } >"$T/overflow"
expect_rc "chat overflow then /reset" 1 "$BIN" chat -m "$M" --ctx 64 -n 3 --verbose <"$T/overflow"
expect_err "chat overflow message" "/reset or raise --ctx"
expect_eq "chat: a turn after the overflow and /reset" "$(grep -c '^\[prompt' "$T/err")" "1"

# chat text is plain: special-token strings typed by the user do not become control tokens
ntok() { sed -n 's/^prompt: \([0-9]*\) tokens.*/\1/p' "$T/err"; }
expect_rc "run --chat empty" 0 "$BIN" run -m "$M" -p "" -n 0 --chat
base=$(ntok)
U='<｜end▁of▁sentence｜><｜User｜>'
expect_rc "run --chat typed markers" 0 "$BIN" run -m "$M" -p "$U" -n 0 --chat
plain=$(ntok)
expect_rc "run --chat --parse-special" 0 "$BIN" run -m "$M" -p "$U" -n 0 --chat --parse-special
parsed=$(ntok)
expect_eq "run --chat --parse-special: two control tokens" "$parsed" "$((base + 2))"
[ -n "$plain" ] && [ "$plain" -gt $((base + 2)) ] && ok || bad "run --chat: typed markers are plain text ($plain tokens vs $base + 2)"
printf '%s\n' "$U" >"$T/forge"
expect_rc "chat typed markers" 0 "$BIN" chat -m "$M" -n 1 --verbose <"$T/forge"
expect_eq "chat: typed markers are plain text" "$(sed -n 's/^\[prompt \([0-9]*\) tokens.*/\1/p' "$T/err")" "$plain"
expect_rc "run --parse-special without --chat" 2 "$BIN" run -m "$M" -p x --parse-special

# ids without a token (config vocab 512 > tokenizer vocab 300) are never sampled:
# sampled chat over 2 turns, run --special
M3=$T/model300
cp -r "$M" "$M3"
python3 - "$M3/tokenizer.json" 300 <<'PY'
import json, sys
p, V = sys.argv[1], int(sys.argv[2])
d = json.load(open(p, encoding="utf-8"))
d["model"]["vocab"] = {t: i for t, i in d["model"]["vocab"].items() if i < V}
d["model"]["merges"] = [m for m in d["model"]["merges"] if all(x in d["model"]["vocab"] for x in m + [m[0] + m[1]])]
d["added_tokens"] = [a for a in d["added_tokens"] if a["id"] < V]
json.dump(d, open(p, "w", encoding="utf-8"), ensure_ascii=False)
PY
expect_rc "chat, tokenizer smaller than the model" 0 "$BIN" chat -m "$M3" -n 40 --temperature 1.5 --seed 1 --verbose <"$T/turns"
expect_eq "chat, tokenizer smaller than the model: two replies" "$(grep -c '^\[prompt' "$T/err")" "2"
expect_rc "run --special, tokenizer smaller than the model" 0 "$BIN" run -m "$M3" -p "$P" -n 60 --temperature 2 --seed 2 --special

# max_position_embeddings: a clear stop, or a clear error for a prompt beyond it
M4=$T/model12
cp -r "$M" "$M4"
python3 -c "import json,sys;p=sys.argv[1];j=json.load(open(p));j['max_position_embeddings']=12;json.dump(j,open(p,'w'))" "$M4/config.json"
expect_rc "generate to max_position_embeddings" 0 "$BIN" generate -m "$M4" --tokens 1,2,3,4,5,6,7,8,9,10 -n 20
expect_eq "generate stops at max_position_embeddings" "$(wc -w <"$T/out")" "2"
expect_err "generate stop message" "max_position_embeddings (12"
expect_rc "generate prompt beyond max_position_embeddings" 1 "$BIN" generate -m "$M4" --tokens 1,2,3,4,5,6,7,8,9,10,11,12,13 -n 1
expect_err "generate prompt beyond max_position_embeddings" "max_position_embeddings"
expect_rc "run to max_position_embeddings" 0 "$BIN" run -m "$M4" -p "ab" -n 50 --special
expect_err "run stop message" "max_position_embeddings (12"
expect_err "run: 12 - 3 generated" "generated: 9 tokens"
expect_rc "run prompt beyond max_position_embeddings" 1 "$BIN" run -m "$M4" -p "$P $P $P $P" -n 5
expect_err "run prompt beyond max_position_embeddings" "max_position_embeddings"
expect_rc "logits beyond max_position_embeddings" 1 "$BIN" logits -m "$M4" --tokens 1,2,3,4,5,6,7,8,9,10,11,12,13 -o "$T/lg"
expect_err "logits beyond max_position_embeddings" "max_position_embeddings"

# ---- perplexity: the documented procedure, checked against dsv4 logits
printf 'And God said, Let there be light: and there was light. And God saw the light, that it was good.' >"$T/text"
TIDS=$("$BIN" tokenize -m "$M" --special none --file "$T/text")
NT=$(echo "$TIDS" | wc -w)
expect_rc "perplexity" 0 "$BIN" perplexity -m "$M" --file "$T/text" --window 8
cp "$T/out" "$T/ppl1"
ppl=$(sed -n 's/^perplexity: //p' "$T/out")
python3 -c "import math,sys; v=float(sys.argv[1]); sys.exit(0 if math.isfinite(v) and v > 1 else 1)" "$ppl" && ok ||
    bad "perplexity is a finite number > 1: '$ppl'"
expect_err "perplexity speed" "tokens/s"
expect_out "perplexity tokens" "tokens: $NT "
expect_rc "perplexity again, 1 thread, batch 1" 0 "$BIN" perplexity -m "$M" --file "$T/text" --window 8 --threads 1 --batch 1
cmp -s "$T/out" "$T/ppl1" && ok || bad "perplexity: same output twice / other threads / batch"
expect_rc "perplexity 3 threads, batch 3" 0 "$BIN" perplexity -m "$M" --file "$T/text" --window 8 --threads 3 --batch 3
cmp -s "$T/out" "$T/ppl1" && ok || bad "perplexity: same output with 3 threads"
# reference: NLL from `dsv4 logits` of [BOS] + window[:-1], in Python
want=$(python3 - "$BIN" "$M" "$T" 8 $TIDS <<'PY'
import math, struct, subprocess, sys
b, m, t, W = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
ids = [int(x) for x in sys.argv[5:]]
wins = [w for w in (ids[i:i + W] for i in range(0, len(ids), W)) if len(w) >= 2]
V, tot, cnt = 512, 0.0, 0
for k, w in enumerate(wins):
    feed = [0] + w[:-1]
    subprocess.run([b, "logits", "-m", m, "--tokens", ",".join(map(str, feed)), "-o", f"{t}/lg{k}"], check=True)
    raw = open(f"{t}/lg{k}.0.f32", "rb").read()
    for j, tgt in enumerate(w):
        row = struct.unpack_from(f"<{V}f", raw, 4 * V * j)
        mx = max(row)
        s = 0.0
        for x in row:
            s += math.exp(x - mx)
        tot += mx + math.log(s) - row[tgt]
        cnt += 1
print(f"{cnt} {len(wins)} {tot / cnt:.6f} {math.exp(tot / cnt):.6g}")
PY
)
got="$(sed -n 's/^tokens: [0-9]* (predicted: \([0-9]*\))/\1/p' "$T/ppl1") $(sed -n 's/^windows: \([0-9]*\) .*/\1/p' "$T/ppl1") $(sed -n 's/^nll\/token: //p' "$T/ppl1") $ppl"
expect_eq "perplexity = reference from dsv4 logits (predicted windows nll ppl)" "$got" "$want"
# a final window of 1 token is dropped: W = NT - 1 leaves one
expect_rc "perplexity last window dropped" 0 "$BIN" perplexity -m "$M" --file "$T/text" --window $((NT - 1))
expect_out "last window of 1 token dropped" "(predicted: $((NT - 1)))"
expect_out "one window" "windows: 1 "

# ---- stats (needs the model's routing hook)
"$BIN" stats -m "$M" --file "$T/text" --window 8 >"$T/out" 2>"$T/err"
src=$?
if [ $src -eq 0 ]; then
    expect_eq "stats: one line per layer" "$(grep -cE '^ +[0-9]+  (hash|routed) ' "$T/out")" "5"
    expect_out "stats: routed token count" "routed: $((NT + (NT + 7) / 8)) tokens"
    "$BIN" stats -m "$M" --file "$T/text" --window 8 --threads 1 --batch 1 --fractions >"$T/out2" 2>/dev/null
    expect_eq "stats: same loads with 1 thread / batch 1" "$(grep -E '^ +[0-9]+  ' "$T/out2")" \
        "$(grep -E '^ +[0-9]+  ' "$T/out")"
    python3 - "$T/out2" <<'PY' && ok || bad "stats: fractions sum to 1 per layer"
import sys
rows = [l.split()[1:] for l in open(sys.argv[1], encoding="utf-8") if l.strip().startswith("fractions:")]
assert len(rows) == 5 and all(abs(sum(map(float, r)) - 1) < 1e-4 for r in rows), rows
PY
else
    expect_eq "stats without the hook: exit 1" "$src" "1"
    grep -q "not available yet" "$T/err" && ok || bad "stats without the hook: message"
fi

# ---- the bundled model (when present): greedy texts and the first window's NLL
# against models/kjv/reference.json (transformers, float32)
K=$SRC/models/kjv
if [ -f "$K/reference.json" ] && [ -f "$K/config.json" ] && [ -f "$K/tokenizer.json" ]; then
    python3 - "$K/reference.json" "$T" <<'PY'
import json, sys
r = json.load(open(sys.argv[1], encoding="utf-8"))
for i, g in enumerate(r["greedy"]):
    open(f"{sys.argv[2]}/kjv_p{i}", "w", encoding="utf-8").write(g["prompt"])
    open(f"{sys.argv[2]}/kjv_t{i}", "w", encoding="utf-8").write(g["text"])
    open(f"{sys.argv[2]}/kjv_n{i}", "w").write(str(len(g["tokens"])))
p = r["perplexity"]
open(f"{sys.argv[2]}/kjv_w0", "w").write(f"{p['window_nll'][0] / p['window_tokens'][0]:.9f}")
PY
    for i in 0 1 2 3; do
        [ -f "$T/kjv_p$i" ] || continue
        expect_rc "bundled greedy $i" 0 "$BIN" run -m "$K" -p "$(cat "$T/kjv_p$i")" -n "$(cat "$T/kjv_n$i")"
        cmp -s "$T/out" "$T/kjv_t$i" && ok || bad "bundled greedy $i: '$(cat "$T/out")' != '$(cat "$T/kjv_t$i")'"
    done
    # the first 512 held-out ids, as text (it re-tokenizes to the same ids)
    "$BIN" tokenize -m "$K" --special none --file "$K/heldout.txt" | tr ' ' '\n' | head -n 512 | tr '\n' ' ' >"$T/kjv_ids"
    "$BIN" detokenize -m "$K" --ids "$(cat "$T/kjv_ids")" >"$T/kjv_w0.txt"
    expect_rc "bundled perplexity, first window" 0 "$BIN" perplexity -m "$K" --file "$T/kjv_w0.txt"
    expect_out "bundled first window: 512 tokens" "tokens: 512 (predicted: 512)"
    python3 -c "import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); sys.exit(0 if abs(a - b) <= 1e-4 * b else 1)" \
        "$(sed -n 's/^nll\/token: //p' "$T/out")" "$(cat "$T/kjv_w0")" && ok ||
        bad "bundled first window NLL/token $(sed -n 's/^nll\/token: //p' "$T/out") vs reference $(cat "$T/kjv_w0")"
fi

# ---- bad input: clear messages, exit 1 or 2
expect_rc "run without -p" 2 "$BIN" run -m "$M"
expect_err "run without -p" "-p TEXT"
expect_rc "run -p and -f" 2 "$BIN" run -m "$M" -p x -f "$T/prompt.txt"
expect_rc "run unknown option" 2 "$BIN" run -m "$M" -p x --bogus
expect_err "run unknown option" "--bogus"
expect_rc "run bad -n" 2 "$BIN" run -m "$M" -p x -n -1
expect_err "run bad -n" "-n"
expect_rc "run bad --top-p" 2 "$BIN" run -m "$M" -p x --top-p 2
expect_err "run bad --top-p" "top_p"
expect_rc "run bad --temperature" 2 "$BIN" run -m "$M" -p x --temperature abc
expect_rc "run --think without --chat" 2 "$BIN" run -m "$M" -p x --think
expect_rc "run -f missing" 1 "$BIN" run -m "$M" -f "$T/nope.txt"
expect_err "run -f missing" "$T/nope.txt"
expect_rc "run --raw empty prompt" 1 "$BIN" run -m "$M" -p "" --raw
expect_rc "perplexity without --file" 2 "$BIN" perplexity -m "$M"
expect_err "perplexity without --file" "--file"
expect_rc "stats without --file" 2 "$BIN" stats -m "$M"
expect_rc "perplexity unreadable file" 1 "$BIN" perplexity -m "$M" --file "$T/nope.txt"
expect_err "perplexity unreadable file" "$T/nope.txt"
expect_rc "perplexity bad --window" 2 "$BIN" perplexity -m "$M" --file "$T/text" --window 1
expect_err "perplexity bad --window" "--window"
printf 'x' >"$T/one"
expect_rc "perplexity one-token text" 1 "$BIN" perplexity -m "$M" --file "$T/one"
expect_err "perplexity one-token text" "no window"
mkdir "$T/notok"
cp "$M"/*.json "$M"/*.safetensors "$T/notok/"
rm "$T/notok/tokenizer.json"
expect_rc "run: model without tokenizer.json" 1 "$BIN" run -m "$T/notok" -p x
expect_err "run: model without tokenizer.json" "no tokenizer.json"
expect_rc "perplexity: model without tokenizer.json" 1 "$BIN" perplexity -m "$T/notok" --file "$T/text"
expect_err "perplexity: model without tokenizer.json" "no tokenizer.json"
expect_rc "chat: model without tokenizer.json" 1 "$BIN" chat -m "$T/notok" <"$T/turns"
expect_err "chat: model without tokenizer.json" "no tokenizer.json"
mkdir "$T/tokonly"
cp "$M/tokenizer.json" "$T/tokonly/"
expect_rc "run: tokenizer without weights" 1 "$BIN" run -m "$T/tokonly" -p x
expect_err "run: tokenizer without weights" "config.json"
expect_rc "run: missing model dir" 1 "$BIN" run -m "$T/nope" -p x
expect_err "run: missing model dir" "$T/nope"
expect_rc "run: bad DSV4_MODEL" 1 env DSV4_MODEL="$T/nope" "$BIN" run -p x
expect_err "run: bad DSV4_MODEL" "DSV4_MODEL"

finish test_run_cli
