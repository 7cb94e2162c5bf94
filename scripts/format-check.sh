#!/usr/bin/env bash
# format-check.sh — the files below must be formatted as .clang-format says
# (clang-format --dry-run --Werror). The check is scoped: files are added here
# as they are (re)written, rather than reformatting the whole tree at once.
set -euo pipefail
cd "$(dirname "$0")/.."
files=(
  src/common/io.c src/common/io.h src/common/dsmath.h src/backend/cuda/fp4.cu
  src/cli/main.c
  src/ep/ep.c src/ep/ep.h src/ep/placement.c src/ep/follow.c src/ep/follow.h src/ep/launch.c src/ep/launch.h
  src/runtime/model_load.c src/runtime/model_load.h
  src/runtime/generate.c src/backend/cpu/bf16x.c
  src/runtime/sched_spec.c src/runtime/sched_impl.h
  src/runtime/context.c src/runtime/context.h src/backend/cpu/indexer.c tests/test_long.c
  src/cli/heatmap.c src/cli/heatmap.h src/cli/cmd_perplexity.c src/cli/cmd_bench_grammar.c tests/picks.c tests/picks.h
  src/text/pyjson.h src/text/grammar.c src/text/grammar.h src/text/json_schema.c src/text/json_schema.h tests/test_grammar.c
  src/cli/opts.c src/cli/opts.h tests/test_opts.c
  src/ep/tiers.c src/ep/tiers.h src/cli/cmd_tiers.c tests/test_tiers.c src/model/store.c src/model/store.h tests/test_store_pin.c
  fuzz/fuzz_chat.c fuzz/fuzz_config.c fuzz/fuzz_safetensors.c fuzz/fuzz_tokenize.c fuzz/fuzz_tokenizer_load.c fuzz/fuzz_oai.c
)
clang-format --dry-run --Werror "${files[@]}"
echo "format-check: ${#files[@]} files formatted as .clang-format says"
