#!/usr/bin/env bash
# test_serve_edges.sh — `dsv4 serve`'s rough edges on the bundled model: an empty --api-key
# refused, a public --host without a key warned about, 401 with WWW-Authenticate, the 400s of
# malformed requests (invalid UTF-8, a NUL byte, bytes after the JSON, max_tokens -1, tool
# messages without tool_call_id or first, response_format "json", two Content-Length headers,
# n over --max-queue, parallel_tool_calls not a boolean), HEAD, a non-streamed request cancelled
# when its client closes, the connections of one peer bounded (another peer's /health still
# answered), a request line of binary garbage answered 400 or closed at once, and bytes without
# a line end closed after --header-timeout (a slow request body and a slow reader of a stream
# are not cut; a kept-alive connection idle after a generation is closed then too); every
# connection slot taken by several peers' unfinished headers while the health listener
# (--health-port) still answers /health and /metrics. The server serves after each.
set -euo pipefail
bin="$1"
src="$2"
model="$src/models/kjv"
work="$PWD/serve_edges_test"
rm -rf "$work"
mkdir -p "$work"
key="test-key-$$"
# shellcheck source=tests/serve_lib.sh
. "$src/tests/serve_lib.sh"

# an empty key is refused; 0.0.0.0 without a key warns
if "$bin" serve -m "$model" --port 0 --api-key '' >"$work/o" 2>"$work/e"; then fail "--api-key '' accepted"; fi
grep -q -- "--api-key is empty" "$work/e" || fail "--api-key '': $(cat "$work/e")"
DSV4_API_KEY= "$bin" serve -m "$model" --port 0 --host 0.0.0.0 >"$work/o0" 2>"$work/e0" &
p0=$!
for _ in $(seq 1 100); do grep -q listening "$work/o0" && break; sleep 0.1; done
kill -TERM $p0
wait $p0 || true
grep -q "warning: listening on 0.0.0.0 without --api-key" "$work/e0" || fail "no warning for 0.0.0.0: $(cat "$work/e0")"

serve_args=(-m "$model" --api-key "$key")
start_server srv --max-queue 8 --max-conns-per-peer 6 --max-conns 16 --header-timeout 2 --health-port 0
port=${url##*:}
hurl=$(sed -n 's/^health on //p' "$work/srv.out")
[ -n "$hurl" ] || fail "no health listener: $(cat "$work/srv.out")"
hport=${hurl##*:}
auth=(-H "Authorization: Bearer $key")
post_file() { curl -s -o "$work/resp" -w '%{http_code}' "${auth[@]}" -H 'Content-Type: application/json' --data-binary "@$1" "$url/v1/chat/completions"; }
alive() {
  local st
  st=$(curl -s -o /dev/null -w '%{http_code}' "${auth[@]}" --data-binary '{"prompt":"And","max_tokens":2}' "$url/v1/completions")
  [ "$st" = 200 ] || fail "after $1 the server does not serve ($st)"
}
expect_400() { # WHAT FILE NEEDLE
  local st
  st=$(post_file "$2")
  [ "$st" = 400 ] || fail "$1: status $st: $(head -c 300 "$work/resp")"
  grep -q -- "$3" "$work/resp" || fail "$1: the error lacks '$3': $(head -c 300 "$work/resp")"
  alive "$1"
}
u='{"role":"user","content":"hi"}'
printf '{"messages":[{"role":"user","content":"h\xffi"}]}' >"$work/b"; expect_400 'invalid UTF-8' "$work/b" 'UTF-8'
printf '{"messages":[{"role":"user","content":"h\x00i"}]}' >"$work/b"; expect_400 'a NUL byte' "$work/b" 'NUL'
printf '{"messages":[%s]} {}' "$u" >"$work/b"; expect_400 'bytes after the JSON' "$work/b" 'after the JSON'
printf '{"messages":[%s],"max_tokens":-1}' "$u" >"$work/b"; expect_400 'max_tokens -1' "$work/b" max_tokens
printf '{"messages":[%s,{"role":"tool","content":"x"}]}' "$u" >"$work/b"; expect_400 'tool without an id' "$work/b" tool_call_id
printf '{"messages":[{"role":"tool","content":"x","tool_call_id":"a"}]}' >"$work/b"; expect_400 'tool first' "$work/b" 'cannot come first'
printf '{"messages":[%s],"response_format":"json"}' "$u" >"$work/b"; expect_400 'response_format json' "$work/b" response_format
printf '{"messages":[%s],"n":9}' "$u" >"$work/b"; expect_400 'n over --max-queue' "$work/b" 'max-queue'
printf '{"messages":[%s],"parallel_tool_calls":"no"}' "$u" >"$work/b"; expect_400 'parallel_tool_calls a string' "$work/b" parallel_tool_calls
printf '{"messages":[%s],"max_tokens":2}' "$u" >"$work/b"
st=$(curl -s -o "$work/resp" -w '%{http_code}' "${auth[@]}" -H 'Content-Length: 47' -H 'Content-Length: 48' --data-binary "@$work/b" "$url/v1/chat/completions")
[ "$st" = 400 ] && grep -q Content-Length "$work/resp" || fail "two Content-Length headers: $st $(cat "$work/resp")"
# 401 names the scheme; HEAD answers as GET
curl -s -D "$work/h" -o /dev/null "$url/v1/models"
grep -qi '^WWW-Authenticate: Bearer' "$work/h" && grep -q ' 401 ' "$work/h" || fail "401 without WWW-Authenticate: $(cat "$work/h")"
[ "$(curl -s -o /dev/null -w '%{http_code}' -I "$url/health")" = 200 ] || fail "HEAD /health"
[ "$(curl -s -o /dev/null -w '%{http_code}' -I "${auth[@]}" "$url/v1/models")" = 200 ] || fail "HEAD /v1/models"

# a client that closes a non-streamed request cancels it
metric() { curl -s "$url/metrics" | sed -n "s/^$1 //p"; }
c0=$(metric dsv4_requests_cancelled_total)
curl -s -m 1 -o /dev/null "${auth[@]}" --data-binary '{"prompt":"And","max_tokens":3000,"temperature":1}' "$url/v1/completions" || true
ok=0
for _ in $(seq 1 30); do
  [ "$(metric dsv4_requests_cancelled_total)" -gt "$c0" ] && [ "$(metric dsv4_running_requests)" = 0 ] && { ok=1; break; }
  sleep 0.1
done
[ $ok = 1 ] || fail "a closed non-streamed request was not cancelled ($(metric dsv4_requests_cancelled_total) cancelled, $(metric dsv4_running_requests) running)"
alive "the closed request"

# one peer holds at most --max-conns-per-peer connections; another address's /health still answers;
# a request line of binary garbage is answered (400) or closed at once
python3 - "$port" <<'PY' || fail "connection limits"
import socket, sys, time
port = int(sys.argv[1])
held = []
for _ in range(6):
    s = socket.create_connection(("127.0.0.1", port)); s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"); held.append(s)
time.sleep(0.3)
s = socket.create_connection(("127.0.0.1", port)); s.settimeout(5)
s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
try:
    d = s.recv(100)
except (ConnectionResetError, socket.timeout):
    d = b""
assert not d.startswith(b"HTTP/1.1 200"), "a 7th connection of the same peer was served: %r" % d
o = socket.socket(); o.bind(("127.0.0.2", 0)); o.settimeout(5); o.connect(("127.0.0.1", port))
o.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
d = o.recv(100)
assert d.startswith(b"HTTP/1.1 200"), "another peer's /health: %r" % d
for h in held: h.close()
time.sleep(0.3)
for junk in (b"\xde\xad\xbe\xef" * 16 + b"\r\n\r\n", bytes(range(1, 200)) + b"\r\n\r\n"):
    g = socket.create_connection(("127.0.0.1", port)); g.settimeout(5)
    t = time.time(); g.sendall(junk)
    try:
        d = g.recv(100)
    except ConnectionResetError:
        d = b""
    # libmicrohttpd answers 400 to a line it can split, and closes at once on control bytes
    assert (d.startswith(b"HTTP/1.1 400") or d == b"") and time.time() - t < 2, \
        "binary garbage: %r after %.1f s" % (d, time.time() - t)
    g.close()
PY
alive "the connection limits"

# bytes without a line end (libmicrohttpd waits for the request line) and a stalled header: closed
# after --header-timeout (2 s), not --timeout (60 s); a request body sent with pauses longer than
# that, a stream read slowly and a kept-alive connection's next request are not cut
python3 - "$port" "$key" <<'PY' || fail "header timeout"
import json, socket, sys, time
port, key = int(sys.argv[1]), sys.argv[2]
def closed_after(data):
    g = socket.create_connection(("127.0.0.1", port)); g.settimeout(10)
    t = time.time(); g.sendall(data)
    try:
        d = g.recv(100)
    except ConnectionResetError:
        d = b""
    except socket.timeout:
        d = None
    g.close()
    return d, time.time() - t
for junk in (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(range(128, 250)), b"GET /health HTT",
             b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le"):
    d, dt = closed_after(junk)
    assert d is not None and not d.startswith(b"HTTP/1.1 200") and dt < 5, "%r: %r after %.1f s" % (junk[:20], d, dt)
def request(s, body, pause=0.0, pieces=1):
    head = ("POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\n"
            "Content-Length: %d\r\n\r\n" % (key, len(body))).encode()
    s.sendall(head)
    k = (len(body) + pieces - 1) // pieces
    for i in range(0, len(body), k):
        if i: time.sleep(pause)
        s.sendall(body[i:i + k])
# a body in three pieces 2.6 s apart: answered
s = socket.create_connection(("127.0.0.1", port)); s.settimeout(30)
request(s, json.dumps({"prompt": "And", "max_tokens": 4, "padding": "x" * 3000}).encode(), 2.6, 3)
d = b""
while b"\r\n\r\n" not in d: d += s.recv(65536)
assert d.startswith(b"HTTP/1.1 200"), "a slow body: %r" % d[:200]
# the same kept-alive connection: idle after the generation, closed after the header timeout
s.settimeout(10)
t = time.time()
while True:
    x = s.recv(65536)
    if not x: break
dt = time.time() - t
assert 1 < dt < 5, "an idle kept-alive connection closed after %.1f s" % dt
s.close()
# a stream read slowly (a small receive buffer, 3 s without reading): complete
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096); s.settimeout(60)
s.connect(("127.0.0.1", port))
request(s, json.dumps({"prompt": "And", "max_tokens": 400, "stream": True, "logprobs": 5, "temperature": 1}).encode())
d = s.recv(2048)
time.sleep(3)
while not d.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n") and not d.endswith(b"0\r\n\r\n"):
    x = s.recv(65536)
    if not x: break
    d += x
assert b"data: [DONE]" in d, "a slow reader's stream: %d bytes, ends %r" % (len(d), d[-80:])
s.close()
PY
alive "the header timeout"

# every slot of the main listener taken by several peers' headers that never end, a byte every
# 0.5 s (under --header-timeout; 16 = --max-conns): a new client there gets nothing, the health
# listener answers /health and /metrics
python3 - "$port" "$hport" <<'PY' || fail "health listener"
import socket, sys, threading, time
port, hport = int(sys.argv[1]), int(sys.argv[2])
held = []
for peer in ("127.0.0.3", "127.0.0.4", "127.0.0.5"):
    for _ in range(6 if peer != "127.0.0.5" else 4):
        s = socket.socket(); s.bind((peer, 0)); s.connect(("127.0.0.1", port))
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"); held.append(s)
stop = threading.Event()
def trickle():
    while not stop.wait(0.5):
        for h in held: h.sendall(b"X")
threading.Thread(target=trickle, daemon=True).start()
time.sleep(0.3)
def get(p, path, src="127.0.0.6"):
    o = socket.socket(); o.bind((src, 0)); o.settimeout(3); o.connect(("127.0.0.1", p))
    o.sendall(b"GET " + path + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    d = b""
    try:
        while True:
            x = o.recv(65536)
            if not x: break
            d += x
    except (ConnectionResetError, socket.timeout):
        pass
    o.close()
    return d
d = get(port, b"/health")
assert not d.startswith(b"HTTP/1.1 200"), "the main listener had a free slot: %r" % d[:100]
d = get(hport, b"/health")
assert d.startswith(b"HTTP/1.1 200") and d.endswith(b'{"status":"ok"}'), "the health listener's /health: %r" % d[:200]
d = get(hport, b"/metrics")
assert d.startswith(b"HTTP/1.1 200") and b"dsv4_requests_total" in d, "the health listener's /metrics: %r" % d[:200]
d = get(hport, b"/v1/models")
assert d.startswith(b"HTTP/1.1 404"), "the health listener serves only /health and /metrics: %r" % d[:200]
stop.set()
time.sleep(0.1)
for h in held: h.close()
PY
sleep 0.3
alive "the full listener"

stop_server "$pid"
echo "test_serve_edges: ok"
