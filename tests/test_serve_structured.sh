#!/usr/bin/env bash
# test_serve_structured.sh — structured output of `dsv4 serve` on the bundled model, checked by
# code that is not ours: random JSON schemas through response_format json_schema, every
# completed reply validated by ajv (and a seeded reply the same alone and under load); tool
# calls with tool_choice "required" through the Vercel AI SDK and LangChain JS, their arguments
# validated; json_schema / json_object through the openai client; parallel tool calls (several in
# one reply, or one with parallel_tool_calls false) and 40 tools, each call validated by ajv;
# schema errors as 400s naming the keyword. The npm packages are installed from the registry into the build tree.
set -euo pipefail
bin="$1"
src="$2"
model="$src/models/kjv"
work="$PWD/serve_structured_test"
rm -rf "$work"
mkdir -p "$work"
key="test-key-$$"
# shellcheck source=tests/serve_lib.sh
. "$src/tests/serve_lib.sh"

nm="$PWD/node_structured"
if [ ! -d "$nm/node_modules/@langchain/openai" ]; then
  npm install --silent --no-audit --no-fund --prefix "$nm" openai@4 ajv@8 ai@6 @ai-sdk/openai-compatible@2 \
    @langchain/openai@1 >/dev/null || fail "npm install (needs the npm registry)"
fi
export NODE_PATH="$nm/node_modules"
cp "$src/tests/serve_structured.mjs" "$nm/serve_structured.mjs"

serve_args=(-m "$model" --api-key "$key")
start_server srv --max-seqs 16

post() { # BODY -> status; the body in $work/resp
  curl -s -o "$work/resp" -w '%{http_code}' -H "Authorization: Bearer $key" -H 'Content-Type: application/json' \
    --data-binary "$1" "$url/v1/chat/completions"
}
expect_400() { # WHAT BODY NEEDLE
  local st
  st=$(post "$2")
  [ "$st" = 400 ] || fail "$1: status $st: $(head -c 300 "$work/resp")"
  grep -q -- "$3" "$work/resp" || fail "$1: the error does not name $3: $(head -c 300 "$work/resp")"
}
msg='"messages":[{"role":"user","content":"hi"}]'
expect_400 'response_format "json"' "{$msg,\"response_format\":\"json\"}" response_format
expect_400 'an unknown response_format type' "{$msg,\"response_format\":{\"type\":\"yaml\"}}" yaml
expect_400 'json_schema without a schema' "{$msg,\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"a\"}}}" schema
for kw in pattern format minimum allOf not patternProperties uniqueItems; do
  case $kw in
    pattern | format) s="{\"type\":\"string\",\"$kw\":\"x\"}" ;;
    minimum) s='{"type":"integer","minimum":1}' ;;
    allOf | not) s="{\"$kw\":[{}]}" ;;
    patternProperties) s='{"type":"object","patternProperties":{}}' ;;
    uniqueItems) s='{"type":"array","uniqueItems":true}' ;;
  esac
  expect_400 "the keyword $kw" "{$msg,\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"a\",\"schema\":$s}}}" "'$kw'"
done
expect_400 'a tool schema with an unsupported keyword' \
  "{$msg,\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"pattern\":\"x\"}}}}}],\"tool_choice\":\"required\"}" "'pattern'"

# dsv4 run --json-schema: the output validates (ajv); an unsupported keyword is named
cat >"$work/schema.json" <<'JSON'
{"type":"object","properties":{"who":{"type":"string","maxLength":12},"n":{"type":"integer"},
 "tags":{"type":"array","items":{"enum":["a","b"]},"maxItems":2}},"required":["who","n"],"additionalProperties":false}
JSON
for seed in 1 2 3; do
  "$bin" run -m "$model" -p "In the beginning" -n 80 --temperature 1 --seed $seed --json-schema "$work/schema.json" \
    >"$work/run.json" 2>"$work/run.err" || fail "run --json-schema: $(cat "$work/run.err")"
  grep -q 'end of sentence' "$work/run.err" || fail "run --json-schema: the value did not end: $(cat "$work/run.json")"
  node -e 'const Ajv=require("ajv");const fs=require("fs");const v=new Ajv().compile(JSON.parse(fs.readFileSync(process.argv[1])));
    const o=JSON.parse(fs.readFileSync(process.argv[2],"utf8"));if(!v(o)){console.error(v.errors);process.exit(1)}' \
    "$work/schema.json" "$work/run.json" || fail "run --json-schema: invalid output: $(cat "$work/run.json")"
done
# dsv4 generate --json-schema: the ids, decoded with tokenizer.json's byte-level map, validate
ids=$("$bin" tokenize -m "$model" --text "In the beginning" | tr ' ' ',')
"$bin" generate -m "$model" --tokens "0,$ids" -n 80 --temperature 1 --seed 2 --json-schema "$work/schema.json" \
  >"$work/gen.ids" 2>"$work/gen.err" || fail "generate --json-schema: $(cat "$work/gen.err")"
python3 - "$model/tokenizer.json" "$work/gen.ids" >"$work/gen.json" <<'PY' || fail "generate --json-schema: decode"
import json, sys
tj = json.load(open(sys.argv[1]))
inv = {v: k for k, v in tj["model"]["vocab"].items()}
for a in tj.get("added_tokens", []): inv[a["id"]] = None
bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256)); cs = bs[:]; n = 0
for b in range(256):
    if b not in bs: bs.append(b); cs.append(256 + n); n += 1
dec = {chr(c): b for b, c in zip(bs, cs)}
ids = [int(x) for x in open(sys.argv[2]).read().split()]
sys.stdout.write(b"".join(bytes(dec[ch] for ch in inv[i]) for i in ids if inv.get(i) is not None).decode())
PY
node -e 'const Ajv=require("ajv");const fs=require("fs");const v=new Ajv().compile(JSON.parse(fs.readFileSync(process.argv[1])));
  const o=JSON.parse(fs.readFileSync(process.argv[2],"utf8"));if(!v(o)){console.error(v.errors);process.exit(1)}' \
  "$work/schema.json" "$work/gen.json" || fail "generate --json-schema: invalid output: $(cat "$work/gen.json")"
echo '{"type":"string","format":"date"}' >"$work/bad.json"
if "$bin" run -m "$model" -p x -n 4 --json-schema "$work/bad.json" 2>"$work/run.err"; then fail "run: an unsupported keyword accepted"; fi
grep -q "'format'" "$work/run.err" || fail "run: the error does not name the keyword: $(cat "$work/run.err")"

t0=$(date +%s)
# 200 schemas x 2 seeds, 12 seeds of tool calls (10 and 6 in a sanitized build, where the model runs
# ~50 times slower)
n_schemas=200 n_tools=12
if ldd "$bin" 2>/dev/null | grep -q libasan; then n_schemas=10 n_tools=6; fi
timeout 900 node "$nm/serve_structured.mjs" gen "$url" "$key" "${DSV4_STRUCTURED_SCHEMAS:-$n_schemas}" || fail "random schemas"
t1=$(date +%s)
timeout 600 node "$nm/serve_structured.mjs" clients "$url" "$key" || fail "clients"
timeout 600 node "$nm/serve_structured.mjs" tools "$url" "$key" "$n_tools" || fail "parallel tool calls, 40 tools"
t2=$(date +%s)
curl -s "$url/metrics" | grep -E '^dsv4_grammar' || fail "no grammar metrics"
echo "random schemas $((t1 - t0)) s, clients $((t2 - t1)) s"
stop_server "$pid"
echo "test_serve_structured: ok"
