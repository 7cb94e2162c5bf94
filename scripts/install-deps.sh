#!/usr/bin/env bash
# install-deps.sh — installs what building and testing dsv4 needs, on Debian 12
# (bookworm) as root. As a non-root user it only checks that the packages are there.
set -euo pipefail

packages=(
  build-essential  # gcc (with OpenMP / libgomp), make, libc headers
  cmake
  pkg-config
  libcjson-dev     # JSON: config.json, safetensors headers, tokenizer.json
  libpcre2-dev     # tokenizer pre-tokenization regexes
  python3          # tools/ and test helpers
  clang            # libFuzzer targets (fuzz/) and the clang build tree
  libomp-dev       # OpenMP for the clang builds
  clang-format     # scripts/format-check.sh
  libmicrohttpd-dev # HTTP server of dsv4 serve
  libpng-dev       # dsv4 stats --heatmap
  curl             # serve tests: raw SSE, bad input
  nodejs           # serve tests: the openai npm client (installed by the test from the npm registry)
  chromium         # serve tests: the chat page in a headless browser (driven by puppeteer-core from npm)
  openmpi-bin      # mpirun: expert parallelism over processes (docs/ep.md, tests/test_ep.sh)
  libopenmpi-dev   # MPI headers and library (DSV4_MPI=AUTO builds it when found)
)

if [ "$(id -u)" -ne 0 ]; then
  missing=()
  for p in "${packages[@]}"; do
    status="$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)"
    [ "$status" = "install ok installed" ] || missing+=("$p")
  done
  if [ "${#missing[@]}" -eq 0 ]; then
    echo "install-deps: all packages already installed (not root: nothing to do)"
    exit 0
  fi
  echo "install-deps: run as root to install: ${missing[*]}" >&2
  exit 1
fi

apt-get update
DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${packages[@]}"
# npm: Debian's package, unless the installed nodejs brings its own
command -v npm >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends npm
