#!/usr/bin/env bash
# test_serve.sh — `dsv4 serve` on the bundled model, on 127.0.0.1 only:
#   the `openai` npm client (chat / completions, streaming and not, tools,
#   thinking, logprobs, stop, typed errors), raw SSE with curl -N, bad input
#   (malformed JSON, wrong types, unknown model, prompt over --ctx, absurd
#   max_tokens, a 100 MB body, a slow client, a disconnect mid-stream, a wrong
#   API key) with the server still serving after each, reproducibility under
#   load and across two server processes, 64 concurrent streams equal to their
#   solo runs with memory back to its level after, prefix reuse equal to a
#   fresh prefill, the chat page.
# The openai package is installed from the npm registry into the build tree.
set -euo pipefail
bin="$1"
src="$2"
model="$src/models/kjv"
work="$PWD/serve_test"
rm -rf "$work"
mkdir -p "$work"
key="test-key-$$"

# shellcheck source=tests/serve_lib.sh
. "$src/tests/serve_lib.sh"
# under AddressSanitizer freed memory waits in a quarantine (256 MB by default)
# before it is reused: the resident memory then grows round after round with
# no leak. A small quarantine keeps the memory check below about leaks.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}quarantine_size_mb=8"

# the openai client, once per build tree
if [ ! -d "$PWD/node/node_modules/openai" ]; then
  npm install --silent --no-audit --no-fund --prefix "$PWD/node" openai@4 >/dev/null ||
    fail "npm install openai (needs the npm registry)"
fi
export NODE_PATH="$PWD/node/node_modules"
client() { # MODE BASE [BASE2]
  cp "$src/tests/serve_client.mjs" "$PWD/node/serve_client.mjs"
  timeout 900 node "$PWD/node/serve_client.mjs" "$1" "$2" "$key" "${3:-}"
}

serve_args=(-m "$model" --api-key "$key")
auth=(-H "Authorization: Bearer $key")
post() { # PATH BODY -> "STATUS BODY"
  curl -s -o "$work/resp" -w '%{http_code}' "${auth[@]}" -H 'Content-Type: application/json' --data-binary "$2" "$url$1"
}
expect_error() { # WHAT STATUS PATH BODY
  local st
  st=$(post "$3" "$4")
  [ "$st" = "$2" ] || fail "$1: status $st, expected $2: $(head -c 300 "$work/resp")"
  python3 -c 'import json,sys; e=json.load(open(sys.argv[1]))["error"]; assert e["message"] and e["type"], e' \
    "$work/resp" || fail "$1: not an OpenAI error object: $(head -c 300 "$work/resp")"
  alive "$1"
}
alive() { # the server still answers a generation
  local st
  st=$(post /v1/completions '{"prompt":"And","max_tokens":2}')
  [ "$st" = 200 ] || fail "after $1 the server does not serve ($st)"
}

start_server a --ctx 1024 --max-seqs 16
A_url="$url"
A_pid="$pid"

# ---- basic endpoints
[ "$(curl -s "$url/health")" = '{"status":"ok"}' ] || fail "/health"
curl -s "${auth[@]}" "$url/v1/models" | grep -q '"id":"kjv"' || fail "/v1/models"
curl -s "$url/" | grep -q '<title>dsv4 chat</title>' || fail "GET / chat page"

# ---- raw SSE with curl -N: data lines, then [DONE]
curl -sN "${auth[@]}" "$url/v1/chat/completions" \
  -d '{"messages":[{"role":"user","content":"Hello"}],"max_tokens":6,"stream":true,"seed":1}' >"$work/sse"
grep -q '^data: {"id":"chatcmpl-' "$work/sse" || fail "SSE chunks: $(head -c 300 "$work/sse")"
[ "$(grep -v '^$' "$work/sse" | tail -1)" = "data: [DONE]" ] || fail "SSE does not end with data: [DONE]"
grep -q '"finish_reason":"length"' "$work/sse" || fail "SSE finish_reason"

# ---- the openai client
client api "$url"

# ---- bad input: an OpenAI error each time, and the server keeps serving
expect_error "malformed JSON" 400 /v1/chat/completions '{"messages": [}'
expect_error "wrong type" 400 /v1/chat/completions '{"messages":"hi"}'
expect_error "wrong type (max_tokens)" 400 /v1/completions '{"prompt":"a","max_tokens":"ten"}'
expect_error "unknown model" 404 /v1/chat/completions '{"model":"gpt-4","messages":[{"role":"user","content":"hi"}]}'
long=$(python3 -c 'print("and " * 1500)')
expect_error "prompt over --ctx" 400 /v1/completions "{\"prompt\":\"$long\"}"
expect_error "absurd max_tokens" 400 /v1/completions '{"prompt":"a","max_tokens":1000000000000}'
expect_error "negative max_tokens" 400 /v1/completions '{"prompt":"a","max_tokens":-5}'
expect_error "not an object" 400 /v1/completions '[1,2]'
st=$(curl -s -o "$work/resp" -w '%{http_code}' -H 'Authorization: Bearer nope' "$url/v1/models")
[ "$st" = 401 ] && grep -q invalid_api_key "$work/resp" || fail "wrong API key: $st"
alive "wrong key"
# a 100 MB body: refused (413) without being kept
python3 -c 'import sys; sys.stdout.write("{\"prompt\":\"" + "a" * (100 << 20) + "\"}")' >"$work/big.json"
st=$(curl -s -o "$work/resp" -w '%{http_code}' "${auth[@]}" --data-binary "@$work/big.json" "$url/v1/completions" || true)
rm -f "$work/big.json"
[ "$st" = 413 ] || fail "100 MB body: status $st"
alive "a 100 MB body"
# a slow client: headers trickle in over 3 s while other requests are served
python3 - "$url" <<'EOF' &
import socket, sys, time
host, port = sys.argv[1].split("//")[1].split(":")
s = socket.create_connection((host, int(port)))
for ch in b"GET /health HTTP/1.1\r\nHost: x\r\n":
    s.send(bytes([ch])); time.sleep(0.1)
s.send(b"\r\n"); print(s.recv(4096).split(b"\r\n")[0].decode()); s.close()
EOF
slow=$!
for i in 1 2 3; do alive "a slow client ($i)"; done
wait "$slow" || fail "slow client"
# an abrupt disconnect mid-stream: the request is cancelled
before=$(curl -s "$url/metrics" | sed -n 's/^dsv4_requests_cancelled_total //p')
# (1000 tokens take over a second on any machine this runs on; curl leaves after 0.3 s)
curl -sN --max-time 0.3 "${auth[@]}" "$url/v1/completions" \
  -d '{"prompt":"And","max_tokens":1000,"stream":true,"temperature":1}' >/dev/null || true
for _ in $(seq 1 50); do
  after=$(curl -s "$url/metrics" | sed -n 's/^dsv4_requests_cancelled_total //p')
  [ "$after" -gt "$before" ] && break
  sleep 0.1
done
[ "$after" -gt "$before" ] || fail "a disconnected stream was not cancelled"
alive "a disconnect mid-stream"

# ---- metrics: Prometheus text with the engine's numbers
curl -s "$url/metrics" >"$work/metrics"
for k in dsv4_requests_total dsv4_queue_depth dsv4_generation_tokens_per_second dsv4_prefill_seconds_total \
  dsv4_decode_seconds_total dsv4_batch_size_bucket 'dsv4_expert_tokens_total{layer="2",expert="0"}'; do
  grep -q "^$k" "$work/metrics" || fail "metric $k missing"
done
for ph in admit forward sample publish retire; do
  grep -q "^dsv4_step_phase_seconds_total{phase=\"$ph\"} " "$work/metrics" || fail "metric step phase $ph missing"
done
awk '/^dsv4_step_phase_seconds_total\{phase="forward"\}/ { ok = $2 > 0 } END { exit !ok }' "$work/metrics" ||
  fail "no forward time in the step phases after requests ran"
# the exponentially weighted expert load: per layer, the experts' values add up to at most the
# tokens they took (dsv4_expert_tokens_total, k per routed token) and to more than none; the balance
# gauges are the spread of those values (cv >= 0, max / mean >= 1)
awk '/^dsv4_expert_tokens_total\{/ { split($1, a, "\""); t[a[2]] += $2 }
     /^dsv4_expert_load\{/ { split($1, a, "\""); w[a[2]] += $2 }
     /^dsv4_expert_load_cv\{/ { n++; if ($2 < 0) bad = 1 }
     /^dsv4_expert_load_max_over_mean\{/ { if ($2 < 1) bad = 1 }
     END { for (l in t) { m++; if (!(w[l] > 0 && w[l] <= t[l] + 1e-6)) bad = 1 } exit bad || !m || n != m }' \
  "$work/metrics" || fail "dsv4_expert_load / _cv / _max_over_mean missing or out of range"

# ---- reproducible under load, and across two server processes
client repro "$url" >"$work/repro_a"
start_server b --ctx 1024 --cache-seqs 0
B_url="$url"
B_pid="$pid"
client repro "$B_url" >"$work/repro_b"
cmp -s "$work/repro_a" "$work/repro_b" || fail "the seeded reply differs between two server processes"

# ---- prefix reuse = fresh prefill (server b keeps no sequences)
client prefix "$A_url" "$B_url"
stop_server "$B_pid"

# ---- load: 64 concurrent streams equal to their solo runs; memory back after
url="$A_url"
client load "$A_url" "$A_pid"
curl -s "$url/metrics" >"$work/metrics"
grep -q '^dsv4_running_requests 0$' "$work/metrics" && grep -q '^dsv4_queue_depth 0$' "$work/metrics" ||
  fail "requests left running after the load"
live=$(sed -n 's/^dsv4_live_sequences //p' "$work/metrics")
[ "$live" -le 4 ] || fail "$live sequences left in memory (cache holds 4)"

# ---- a full queue answers 429 (the first stream, 3000 tokens, keeps the one slot busy
# for seconds even on a quiet machine); a queued stream waits longer than the idle
# timeout (--timeout 1) and still completes
stop_server "$A_pid"
start_server c --max-seqs 1 --max-queue 2 --timeout 1
sse() { curl -sN "${auth[@]}" "$url/v1/completions" -d "{\"prompt\":\"And\",\"max_tokens\":$1,\"stream\":true}"; }
sse 3000 >"$work/c1" &
c1=$!
sleep 0.3
sse 10 >"$work/c2" &
c2=$!
sse 10 >"$work/c3" &
c3=$!
sleep 0.3
st=$(post /v1/completions '{"prompt":"And","max_tokens":2}')
[ "$st" = 429 ] && grep -q rate_limit_error "$work/resp" || fail "full queue: status $st"
wait "$c1" "$c2" "$c3"
for f in c1 c2 c3; do
  [ "$(grep -v '^$' "$work/$f" | tail -1)" = "data: [DONE]" ] || fail "queued stream $f did not complete"
done
stop_server "$pid"
echo "test_serve: ok"
