#!/usr/bin/env bash
# test_tokenize_cli.sh BIN SRC — `dsv4 tokenize` / `dsv4 detokenize` end to end
# on the fixture tokenizer (tests/fixtures/tokenizer/tok_small.json, whose ids
# come from the Python `tokenizers` library).
set -u
BIN=$1
SRC=$2
FX=$SRC/tests/fixtures/tokenizer
. "$(dirname "$0")/check_lib.sh"
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT

# expect_eq NAME GOT WANT
expect_eq() { if [ "$2" == "$3" ]; then ok; else bad "$1: got '$2', want '$3'"; fi; }
# expect_rc NAME WANT_RC CMD...: runs CMD, stdout/stderr in $T/out, $T/err
expect_rc() {
    local name=$1 want=$2
    shift 2
    "$@" >"$T/out" 2>"$T/err"
    local rc=$?
    if [ "$rc" -eq "$want" ]; then ok; else bad "$name: exit $rc, want $want ($(head -c 300 "$T/err"))"; fi
}
expect_err() { if grep -q -- "$2" "$T/err"; then ok; else bad "$1: stderr lacks '$2': $(head -c 300 "$T/err")"; fi; }

mkdir "$T/model"
cp "$FX/tok_small.json" "$T/model/tokenizer.json"
M=$T/model

# help
expect_rc "tokenize --help" 0 "$BIN" tokenize --help
grep -q "usage: dsv4 tokenize" "$T/out" && ok || bad "tokenize --help text"
grep -q "invalid UTF-8" "$T/out" && ok || bad "tokenize --help documents invalid UTF-8"
expect_rc "detokenize --help" 0 "$BIN" detokenize --help
grep -q "U+FFFD" "$T/out" && ok || bad "detokenize --help documents --lossy"

# ids as `tokenizers` gives them (cases_small.json)
expect_eq "Hello" "$("$BIN" tokenize -m "$M" --text 'Hello, world!')" "1759 14 1626 3"
expect_eq "file path form" "$("$BIN" tokenize -m "$M/tokenizer.json" --text 'Hello, world!')" "1759 14 1626 3"
expect_eq "special tokens" "$("$BIN" tokenize -m "$M" --text '<｜User｜>hi')" "3000 74 75"
expect_eq "--special none" "$("$BIN" tokenize -m "$M" --special none --text '<｜User｜>hi')" \
    "30 174 124 253 55 2164 174 124 253 32 74 75"
expect_eq "--special nonspecial" "$("$BIN" tokenize -m "$M" --special nonspecial --text '<｜User｜>hi')" "3000 74 75"
expect_eq "empty text" "$("$BIN" tokenize -m "$M" --text '')" ""
expect_rc "bad --special" 2 "$BIN" tokenize -m "$M" --special maybe --text x

# exact bytes: leading/trailing whitespace, newlines, invalid UTF-8, NUL
printf '  lead\ttab\r\n\n<think>x</think>\xe4\xb8\xad\xe6\x96\x87 \xff\xfe\xe4\xb8 \x00 end  \n\n' >"$T/in.bin"
expect_rc "tokenize --file" 0 "$BIN" tokenize -m "$M" --file "$T/in.bin"
ids=$(cat "$T/out")
[ "$(wc -l <"$T/out")" -eq 1 ] && ok || bad "ids on one line"
"$BIN" detokenize -m "$M" --ids "$ids" >"$T/back.bin" && ok || bad "detokenize"
cmp -s "$T/in.bin" "$T/back.bin" && ok || bad "bytes round trip (invalid UTF-8, NUL, whitespace)"
"$BIN" detokenize -m "$M" --ids "${ids// /,}" >"$T/back2.bin" && cmp -s "$T/in.bin" "$T/back2.bin" && ok ||
    bad "comma-separated ids"
"$BIN" detokenize -m "$M" --ids - <"$T/out" >"$T/back3.bin" && cmp -s "$T/in.bin" "$T/back3.bin" && ok ||
    bad "ids from standard input"
expect_eq "stdin text" "$("$BIN" tokenize -m "$M" --file - <"$T/in.bin")" "$ids"

# invalid UTF-8 output: raw by default, U+FFFD with --lossy
byte_id=$("$BIN" tokenize -m "$M" --special none --text "$(printf '\xe4')")
expect_eq "lone byte is one token" "$(echo "$byte_id" | wc -w)" "1"
expect_eq "raw byte out" "$("$BIN" detokenize -m "$M" --ids "$byte_id" | od -An -tx1 | tr -d ' \n')" "e4"
expect_eq "lossy out" "$("$BIN" detokenize -m "$M" --lossy --ids "$byte_id" | od -An -tx1 | tr -d ' \n')" "efbfbd"
expect_eq "skip special" "$("$BIN" detokenize -m "$M" --skip-special --ids "0 1759 1")" "Hello"
expect_eq "keep special" "$("$BIN" detokenize -m "$M" --ids "1759")" "Hello"

# errors
expect_rc "no args" 2 "$BIN" tokenize
expect_rc "text and file" 2 "$BIN" tokenize -m "$M" --text a --file "$T/in.bin"
expect_rc "unknown option" 2 "$BIN" tokenize -m "$M" --bogus
expect_rc "detokenize no ids" 2 "$BIN" detokenize -m "$M"
expect_rc "missing model dir" 1 "$BIN" tokenize -m "$T/nope" --text a
expect_err "missing model dir" "$T/nope"
mkdir "$T/empty"
expect_rc "dir without tokenizer.json" 1 "$BIN" tokenize -m "$T/empty" --text a
expect_err "dir without tokenizer.json" "no tokenizer.json"
mkdir "$T/broken"
printf '{"model": {"vocab": ' >"$T/broken/tokenizer.json"
expect_rc "malformed tokenizer.json" 1 "$BIN" tokenize -m "$T/broken" --text a
expect_err "malformed tokenizer.json" "not valid JSON"
printf '{"pre_tokenizer": {"type": "ByteLevel"}, "decoder": {"type": "ByteLevel"}, %s}' \
    '"model": {"type": "Unigram", "vocab": {}}' >"$T/broken/tokenizer.json"
expect_rc "unsupported model" 1 "$BIN" detokenize -m "$T/broken" --ids 1
expect_err "unsupported model" "Unigram"
expect_rc "missing file" 1 "$BIN" tokenize -m "$M" --file "$T/nope.txt"
expect_rc "id out of range" 1 "$BIN" detokenize -m "$M" --ids "5 999999"
expect_err "id out of range" "999999"
expect_rc "negative id" 1 "$BIN" detokenize -m "$M" --ids "-1"
expect_rc "bad id" 2 "$BIN" detokenize -m "$M" --ids "12x 3"
expect_err "bad id" "12x"

finish test_tokenize_cli
