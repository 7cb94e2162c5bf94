#!/usr/bin/env bash
# fuzz.sh — builds the libFuzzer targets (fuzz/fuzz_*.c; clang, ASan+UBSan) in
# build-fuzz/ and runs each for SECONDS (default 20: the CI smoke run from
# scripts/test.sh), starting from the seeds in fuzz/corpus/<target>/ (read-only)
# plus a working corpus in build-fuzz/corpus/<target>/ that grows between runs.
# fuzz/<target>.dict, when present, is passed as the libFuzzer dictionary.
# A crash / leak / timeout / sanitizer report fails the run; its input is left in
# build-fuzz/crashes/<target>/ (turn it into a regression test under tests/).
#
#   bash scripts/fuzz.sh                 # smoke: 20 s per target
#   bash scripts/fuzz.sh 3600            # long run: an hour per target
#   bash scripts/fuzz.sh 600 fuzz_chat   # one target
#   FUZZ_JOBS=2 bash scripts/fuzz.sh 3600   # parallel workers per target
set -euo pipefail
cd "$(dirname "$0")/.."

secs="${1:-20}"
shift || true
jobs="${JOBS:-2}"
fjobs="${FUZZ_JOBS:-1}"
dir=build-fuzz

cmake -S . -B "$dir" -DCMAKE_C_COMPILER=clang -DDSV4_FUZZ=ON -DDSV4_WERROR=ON -DDSV4_CUDA=OFF -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$dir" -j"$jobs" --target fuzzers

if [ "$#" -gt 0 ]; then
  targets=("$@")
else
  targets=()
  for f in fuzz/fuzz_*.c; do targets+=("$(basename "$f" .c)"); done
fi

par=()
[ "$fjobs" -gt 1 ] && par=(-jobs="$fjobs" -workers="$fjobs")
failed=()
for t in "${targets[@]}"; do
  mkdir -p "$dir/corpus/$t" "$dir/crashes/$t"
  echo "== $t: ${secs} s"
  start=$(date +%s)
  dict=()
  [ -f "fuzz/$t.dict" ] && dict=(-dict="fuzz/$t.dict")
  if ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
     "$dir/$t" -max_total_time="$secs" -timeout=10 -rss_limit_mb=4096 -max_len=65536 \
       "${par[@]}" "${dict[@]}" -print_final_stats=1 \
       -artifact_prefix="$dir/crashes/$t/" "$dir/corpus/$t" "fuzz/corpus/$t" >"$dir/$t.log" 2>&1; then
    echo "   ok: $(grep -E 'stat::number_of_executed_units' "$dir/$t.log" | tail -1 | awk '{print $2}') runs in $(( $(date +%s) - start )) s"
  else
    echo "   FAILED: see $dir/$t.log and $dir/crashes/$t/"
    grep -E "ERROR|SUMMARY|runtime error|Test unit written" "$dir/$t.log" | head -5 || true
    failed+=("$t")
  fi
done
if [ "${#failed[@]}" -ne 0 ]; then
  echo "fuzz.sh: FAILED: ${failed[*]}"
  exit 1
fi
echo "fuzz.sh: every target ran ${secs} s without a finding"
