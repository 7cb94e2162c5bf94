#!/usr/bin/env bash
# test_serve_page.sh — the chat page served by `dsv4 serve` at / in headless
# Chromium (Debian's `chromium`), driven by puppeteer-core (installed from the
# npm registry into the build tree): a message sent on the page streams back
# the same reply as the API gives. Chromium adds ~10 s; the test is skipped
# (ctest SKIP, exit 77) only when no chromium binary is installed.
set -euo pipefail
bin="$1"
src="$2"
work="$PWD/serve_page_test"
rm -rf "$work"
mkdir -p "$work"
chromium=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$chromium" ]; then
  echo "test_serve_page: SKIP: no chromium installed (scripts/install-deps.sh installs it)"
  exit 77
fi
if [ ! -d "$PWD/node/node_modules/puppeteer-core" ]; then
  PUPPETEER_SKIP_DOWNLOAD=1 npm install --silent --no-audit --no-fund --prefix "$PWD/node" puppeteer-core@24 >/dev/null ||
    { echo "FAIL: npm install puppeteer-core (needs the npm registry)" >&2; exit 1; }
fi
key="page-key-$$"
# shellcheck source=tests/serve_lib.sh
. "$src/tests/serve_lib.sh"
serve_args=(-m "$src/models/kjv" --api-key "$key")
start_server srv
cp "$src/tests/serve_page.mjs" "$PWD/node/serve_page.mjs"
timeout 120 node "$PWD/node/serve_page.mjs" "$url" "$key" "$chromium"
stop_server "$pid"
echo "test_serve_page: ok"
