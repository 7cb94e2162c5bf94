#!/usr/bin/env bash
# test_cli_help.sh BIN SRC — every command's --help (exit 0, on stdout,
# naming every option the command accepts: the lists below are the options
# each command took before the table-driven parser), an unknown option and a
# bad value per command (exit 2, "dsv4 <cmd>: <option>: <why>" on stderr),
# and `dsv4 --help` / `dsv4 help [command]`.
set -u
BIN=$1
. "$(dirname "$0")/check_lib.sh"
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT

SAMPLING="--temperature --top-k --top-p --min-p --repeat-penalty --presence-penalty --frequency-penalty --seed"
declare -A OPTS=(
    [run]="-m -p --prompt -f --file -n --raw --chat --think --special --parse-special --threads --prefill-chunk $SAMPLING"
    [chat]="-m --system --ctx -n --think --verbose --no-cache --parse-special --threads --prefill-chunk --mtp $SAMPLING"
    [perplexity]="-m --file -f --window --batch --threads"
    [stats]="-m --file -f --window --batch --threads --fractions"
    [tiers]="-m --gpu-mem --expert-load --batch --pcie --cpu-read --cpu-gflops --trials --seed"
    [check]="-m --trials --mode --requests --gen --max-prompt --seed --mtp --self-test --backend --gpu"
    [info]="-m"
    [logits]="-m --tokens -o --prefill-chunk --threads --dump --backend --gpu"
    [generate]="-m --tokens -n --stop --threads --temperature --top-k --top-p --min-p --seed --backend --gpu"
    [bench]="-m --prompt --gen --threads --batch --backend --gpu --kernels"
    [synth]="--like -o --layers --experts --active --vocab --bf16 --seed --shard-gb"
    [tokenize]="-m --model --text --file --special --stats"
    [detokenize]="-m --model --ids --skip-special --lossy"
    [serve]="-m --host --port --api-key --max-seqs --ctx --threads --backend --gpu --max-queue --step-tokens
             --prefill-chunk --cache-seqs --max-body --timeout --model-name --mtp --mtp-max-batch --load-out"
)
# a bad value per command: option, value, what the message says
declare -A BADVAL=(
    [run]="-n|-1|out of range" [chat]="--ctx|1|out of range" [perplexity]="--window|x|not an integer"
    [stats]="--batch|0|out of range" [check]="--mode|fast|not one of single, mixed, prefix"
    [info]="-m||missing value" [logits]="--tokens|5,x|not a list" [generate]="--top-p|abc|not a number"
    [bench]="--batch|1,5000|out of range" [synth]="--layers|0|out of range"
    [tokenize]="--special|some|not one of all, nonspecial, none" [detokenize]="--ids||missing value"
    [serve]="--port|70000|out of range [0, 65535]" [tiers]="--batch|0|out of range"
)

has_opt() { grep -qE -- "(^|[ ,])$1([ ,=]|\$)" "$2"; }

for cmd in "${!OPTS[@]}"; do
    "$BIN" "$cmd" --help >"$T/out" 2>"$T/err"
    rc=$?
    [ "$rc" -eq 0 ] && ok || bad "$cmd --help: exit $rc"
    [ -s "$T/err" ] && bad "$cmd --help wrote to stderr: $(head -c 200 "$T/err")" || ok
    grep -q "^usage: dsv4 $cmd" "$T/out" && ok || bad "$cmd --help: no usage line"
    grep -qE -- "^  -h, --help" "$T/out" && ok || bad "$cmd --help lacks -h, --help"
    for o in ${OPTS[$cmd]}; do
        has_opt "$o" "$T/out" && ok || bad "$cmd --help does not mention $o"
    done
    "$BIN" "$cmd" -h >"$T/out2" 2>/dev/null && cmp -s "$T/out" "$T/out2" && ok || bad "$cmd -h differs from --help"
    "$BIN" help "$cmd" >"$T/out3" 2>/dev/null && cmp -s "$T/out" "$T/out3" && ok || bad "dsv4 help $cmd differs"

    "$BIN" "$cmd" --no-such-option >"$T/out" 2>"$T/err"
    rc=$?
    [ "$rc" -eq 2 ] && ok || bad "$cmd --no-such-option: exit $rc, want 2"
    grep -qF -- "dsv4 $cmd: --no-such-option: unknown option" "$T/err" && ok ||
        bad "$cmd --no-such-option: stderr '$(head -c 200 "$T/err")'"

    IFS='|' read -r opt val why <<<"${BADVAL[$cmd]}"
    if [ -n "$val" ]; then "$BIN" "$cmd" "$opt" "$val" >"$T/out" 2>"$T/err"; else "$BIN" "$cmd" "$opt" >"$T/out" 2>"$T/err"; fi
    rc=$?
    [ "$rc" -eq 2 ] && ok || bad "$cmd $opt '$val': exit $rc, want 2"
    grep -qF -- "dsv4 $cmd: $opt: " "$T/err" && grep -qF -- "$why" "$T/err" && ok ||
        bad "$cmd $opt '$val': stderr '$(head -c 200 "$T/err")' lacks '$why'"
    "$BIN" "$cmd" "$opt" "${val:-x}" "$opt" "${val:-x}" >/dev/null 2>"$T/err"
    [ $? -eq 2 ] && ok || bad "$cmd $opt twice: not a usage error"
done

# bench --kernels has its own table
"$BIN" bench --kernels --help >"$T/out" 2>&1 && ok || bad "bench --kernels --help: exit $?"
for o in --kernels --threads --reps --mib --tokens; do has_opt "$o" "$T/out" && ok || bad "bench --kernels --help lacks $o"; done
"$BIN" bench --kernels --reps 0 >/dev/null 2>"$T/err"
[ $? -eq 2 ] && grep -qF "dsv4 bench --kernels: --reps: '0' is out of range [1, 1000]" "$T/err" && ok ||
    bad "bench --kernels --reps 0: $(head -c 200 "$T/err")"
# an option given twice
"$BIN" run -p a -p b >/dev/null 2>"$T/err"
[ $? -eq 2 ] && grep -qF "dsv4 run: -p: given twice" "$T/err" && ok || bad "run -p twice: $(head -c 200 "$T/err")"
"$BIN" run --prompt a -p b >/dev/null 2>"$T/err"
[ $? -eq 2 ] && grep -qF "given twice" "$T/err" && ok || bad "run --prompt then -p: $(head -c 200 "$T/err")"
# a flag given a value
"$BIN" run --raw=1 -p a >/dev/null 2>"$T/err"
[ $? -eq 2 ] && grep -qF "dsv4 run: --raw: takes no value" "$T/err" && ok || bad "run --raw=1: $(head -c 200 "$T/err")"

# the command list
for form in --help -h help; do
    "$BIN" $form >"$T/out" 2>&1 && ok || bad "dsv4 $form: exit $?"
    for cmd in "${!OPTS[@]}"; do grep -qE "^  $cmd " "$T/out" && ok || bad "dsv4 $form does not list $cmd"; done
done
"$BIN" >/dev/null 2>&1
[ $? -eq 2 ] && ok || bad "dsv4 without a command: not exit 2"
"$BIN" help frobnicate >/dev/null 2>"$T/err"
[ $? -eq 2 ] && grep -q frobnicate "$T/err" && ok || bad "dsv4 help frobnicate"

finish
