# serve_lib.sh — sourced by the tests of `dsv4 serve`: fail, and servers
# started on a free port of 127.0.0.1 and stopped. The sourcing script sets
# bin (the dsv4 binary), work (its directory) and serve_args (the options
# every server of the script takes, such as -m and --api-key). Every server
# started is killed when the script exits; stop_server is the clean stop.

fail() { echo "FAIL: $*" >&2; exit 1; }

serve_pids=()
serve_cleanup() { for p in "${serve_pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap serve_cleanup EXIT

# NAME [ARGS...]: dsv4 serve --port 0 with serve_args and ARGS, its output in
# $work/NAME.out and .err; sets url (http://127.0.0.1:PORT) and pid once it
# listens, fails if it exits or has not listened after 30 s.
start_server() {
  local name="$1"
  shift
  "$bin" serve --port 0 "${serve_args[@]}" "$@" >"$work/$name.out" 2>"$work/$name.err" &
  pid=$!
  serve_pids+=("$pid")
  url=
  for _ in $(seq 1 300); do
    url=$(sed -n 's/^listening on //p' "$work/$name.out")
    [ -n "$url" ] && return 0
    kill -0 "$pid" 2>/dev/null || { cat "$work/$name.err" >&2; fail "server $name exited"; }
    sleep 0.1
  done
  fail "server $name did not start"
}

# PID: SIGTERM; the server must exit 0 (under ASan: with no leak).
stop_server() {
  kill -TERM "$1"
  local rc=0
  wait "$1" || rc=$?
  [ "$rc" -eq 0 ] || fail "server exited with $rc on SIGTERM"
}
