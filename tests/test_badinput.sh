#!/usr/bin/env bash
# Bad checkpoints and bad arguments: each must fail with exit status 1 or 2
# and a one-line message naming the file / tensor / field at fault — never a
# crash (this script also runs against the ASan/UBSan build).
set -u
DSV4="$1"
SRC="$2"
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
. "$(dirname "$0")/check_lib.sh"

# expect_fail NAME EXPECTED_SUBSTRING... -- command...
expect_fail() {
    local name="$1"
    shift
    local pats=()
    while [ "$1" != "--" ]; do pats+=("$1"); shift; done
    shift
    "$@" >"$T/out" 2>"$T/err"
    local rc=$?
    local ok=1
    if [ $rc -ne 1 ] && [ $rc -ne 2 ]; then ok=0; echo "FAIL $name: exit status $rc (want 1 or 2)"; fi
    if grep -q "Sanitizer\|runtime error" "$T/err"; then ok=0; echo "FAIL $name: sanitizer report"; fi
    for p in "${pats[@]}"; do
        if ! grep -qF -- "$p" "$T/err"; then ok=0; echo "FAIL $name: message lacks '$p'"; fi
    done
    if [ $ok = 1 ]; then pass=$((pass + 1)); echo "ok   $name: $(head -c 300 "$T/err" | head -1)"; else fail=$((fail + 1)); sed 's/^/     /' "$T/err" | head -5; fi
}

# edit_header FILE PYTHON-EXPR: rewrites the JSON header of a safetensors file
# in place (same data area); the expression gets `h` (the header dict).
edit_header() {
    python3 - "$1" "$2" <<'PY'
import json, struct, sys
path, expr = sys.argv[1], sys.argv[2]
raw = open(path, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
h = json.loads(raw[8:8 + n])
exec(expr)
hdr = json.dumps(h).encode()
hdr += b" " * ((8 - len(hdr) % 8) % 8)
data = raw[8 + n:]
open(path, "wb").write(struct.pack("<Q", len(hdr)) + hdr + data)
PY
}

fresh() { rm -rf "$T/m"; cp -r "$SRC/tests/fixtures/q128" "$T/m"; }
S1="$T/m/model-00001-of-00003.safetensors"

fresh
"$DSV4" info -m "$T/m" >/dev/null 2>&1 || { echo "FAIL: the unmodified fixture does not load"; fail=$((fail + 1)); }

fresh; truncate -s -1000 "$T/m/model-00002-of-00003.safetensors"
expect_fail "truncated shard" "model-00002-of-00003.safetensors" -- "$DSV4" info -m "$T/m"

fresh; edit_header "$S1" 'k=[x for x in h if x!="__metadata__"][0]; h[k]["data_offsets"][1]+=10**9'
expect_fail "offsets past the end" "model-00001-of-00003.safetensors" "run past" -- "$DSV4" info -m "$T/m"

fresh; edit_header "$S1" 'k=[x for x in h if x!="__metadata__"][0]; h[k]["data_offsets"][1]+=1'
expect_fail "size != shape x dtype" "model-00001-of-00003.safetensors" -- "$DSV4" info -m "$T/m"

fresh; python3 - "$T/m/model.safetensors.index.json" <<'PY'
import json, sys
p = sys.argv[1]; j = json.load(open(p))
j["weight_map"]["layers.0.attn.wq_a.weight"] = "model-00009-of-00009.safetensors"
json.dump(j, open(p, "w"))
PY
expect_fail "index names a missing shard" "model-00009-of-00009.safetensors" -- "$DSV4" info -m "$T/m"

# a missing tensor: drop it from its shard's header and from the index
fresh; python3 - "$T/m" <<'PY'
import json, struct, sys, os
d = sys.argv[1]; ip = os.path.join(d, "model.safetensors.index.json"); j = json.load(open(ip))
name = "layers.1.attn.wkv.weight"; f = os.path.join(d, j["weight_map"].pop(name)); json.dump(j, open(ip, "w"))
raw = open(f, "rb").read(); n = struct.unpack("<Q", raw[:8])[0]; h = json.loads(raw[8:8 + n]); del h[name]
hdr = json.dumps(h).encode(); hdr += b" " * ((8 - len(hdr) % 8) % 8)
open(f, "wb").write(struct.pack("<Q", len(hdr)) + hdr + raw[8 + n:])
PY
expect_fail "missing tensor" "layers.1.attn.wkv.weight" "missing" -- "$DSV4" info -m "$T/m"

# wrong dtype (same byte size) and wrong shape (same element count)
F=$(python3 -c "import json;print(json.load(open('$T/m/model.safetensors.index.json'))['weight_map']['layers.0.attn_norm.weight'])" 2>/dev/null)
fresh; edit_header "$T/m/$F" 'h["layers.0.attn_norm.weight"]["dtype"]="I32"'
expect_fail "wrong dtype" "layers.0.attn_norm.weight" "I32" -- "$DSV4" info -m "$T/m"
F=$(python3 -c "import json;print(json.load(open('$T/m/model.safetensors.index.json'))['weight_map']['layers.0.attn.wq_a.weight'])")
fresh; edit_header "$T/m/$F" 's=h["layers.0.attn.wq_a.weight"]["shape"]; s.reverse()'
expect_fail "wrong shape" "layers.0.attn.wq_a.weight" "shape" -- "$DSV4" info -m "$T/m"
F=$(python3 -c "import json;print(json.load(open('$T/m/model.safetensors.index.json'))['weight_map']['layers.0.attn.wq_a.scale'])")
fresh; edit_header "$T/m/$F" 'h["layers.0.attn.wq_a.scale"]["shape"]=[2,1]'
expect_fail "scale grid mismatch" "layers.0.attn.wq_a.scale" -- "$DSV4" info -m "$T/m"

# invalid config values
fresh; python3 -c "import json;p='$T/m/config.json';j=json.load(open(p));j['hidden_size']=-5;json.dump(j,open(p,'w'))"
expect_fail "negative hidden_size" "config.json" "hidden_size" -- "$DSV4" info -m "$T/m"
fresh; python3 -c "import json;p='$T/m/config.json';j=json.load(open(p));j['compress_ratios']='4';json.dump(j,open(p,'w'))"
expect_fail "compress_ratios not a list" "compress_ratios" -- "$DSV4" info -m "$T/m"
fresh; python3 -c "import json;p='$T/m/config.json';j=json.load(open(p));del j['vocab_size'];json.dump(j,open(p,'w'))"
expect_fail "missing vocab_size" "vocab_size" -- "$DSV4" info -m "$T/m"
fresh; echo '{"hidden_size": 256,' > "$T/m/config.json"
expect_fail "config not JSON" "config.json" -- "$DSV4" info -m "$T/m"
fresh; rm "$T/m/config.json"
expect_fail "no config.json" "config.json" -- "$DSV4" info -m "$T/m"

# config <-> checkpoint: a config with fewer layers (or experts) than the checkpoint
# must not run a truncated model: the unused tensors are named
fresh; python3 -c "import json;p='$T/m/config.json';j=json.load(open(p));n=j['num_hidden_layers']-1;j['num_hidden_layers']=n;j['compress_ratios']=j['compress_ratios'][:n]+[0]*j.get('num_nextn_predict_layers',0);j['num_hash_layers']=min(j.get('num_hash_layers',0),n);json.dump(j,open(p,'w'))"
expect_fail "config with fewer layers" "81 tensors are not used" "'layers.4.attn.attn_sink'" -- "$DSV4" info -m "$T/m"
# an extra tensor the model does not read (the MTP ones, mtp.*, are allowed)
fresh; python3 - "$S1" <<'PY'
import json, struct, sys
path = sys.argv[1]
raw = open(path, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
h = json.loads(raw[8:8 + n])
data = raw[8 + n:]
for name in ("layers.0.attn.extra", "mtp.0.extra"):
    h[name] = {"dtype": "F32", "shape": [2], "data_offsets": [len(data), len(data) + 8]}
    data += bytes(8)
hdr = json.dumps(h).encode()
hdr += b" " * ((8 - len(hdr) % 8) % 8)
open(path, "wb").write(struct.pack("<Q", len(hdr)) + hdr + data)
PY
python3 -c "import json;p='$T/m/model.safetensors.index.json';j=json.load(open(p));j['weight_map']['layers.0.attn.extra']=j['weight_map']['mtp.0.extra']='model-00001-of-00003.safetensors';json.dump(j,open(p,'w'))"
expect_fail "unused tensor" "1 tensor is not used" "'layers.0.attn.extra'" -- "$DSV4" info -m "$T/m"

# non-regular files where a checkpoint file should be: a FIFO must not hang the
# open (timeout turns a hang into exit status 124, a failure here)
fresh; rm "$T/m/config.json"; mkfifo "$T/m/config.json"
expect_fail "config.json is a FIFO" "config.json" "not a regular file" -- timeout 20 "$DSV4" info -m "$T/m"
fresh; rm "$S1"; mkfifo "$S1"
expect_fail "shard is a FIFO" "model-00001-of-00003.safetensors" "not a regular file" -- timeout 20 "$DSV4" info -m "$T/m"
fresh; rm "$T/m/model.safetensors.index.json"; mkfifo "$T/m/model.safetensors.index.json"
expect_fail "index is a FIFO" "model.safetensors.index.json" "not a regular file" -- timeout 20 "$DSV4" info -m "$T/m"
fresh; mkfifo "$T/m/tokenizer.json"
expect_fail "tokenizer.json is a FIFO" "tokenizer.json" "not a regular file" -- timeout 20 "$DSV4" tokenize -m "$T/m" --text hi
mkdir -p "$T/d/config.json"
expect_fail "config.json is a directory" "config.json" "not a regular file" -- timeout 20 "$DSV4" info -m "$T/d"

# output write errors: every command exits non-zero with a message when its
# standard output cannot be written (here /dev/full)
full() { bash -c '"$0" "$@" >/dev/full' "$@"; }
fresh
printf 'In the beginning God created the heaven and the earth.\n' > "$T/text.txt"
expect_fail "info >/dev/full" "standard output" -- full "$DSV4" info -m "$T/m"
expect_fail "generate >/dev/full" "standard output" -- full "$DSV4" generate -m "$T/m" --tokens 5,6 -n 2
expect_fail "perplexity >/dev/full" "standard output" -- full "$DSV4" perplexity -m "$SRC/models/kjv" --file "$T/text.txt"
expect_fail "stats >/dev/full" "standard output" -- full "$DSV4" stats -m "$SRC/models/kjv" --file "$T/text.txt"
expect_fail "bench >/dev/full" "standard output" -- full "$DSV4" bench -m "$T/m" --prompt 4 --gen 2 --batch 2
expect_fail "check >/dev/full" "standard output" -- full "$DSV4" check -m "$SRC/tests/fixtures/tiny" --trials 1
expect_fail "tokenize >/dev/full" "standard output" -- full "$DSV4" tokenize -m "$SRC/models/kjv" --text hello
expect_fail "detokenize >/dev/full" "standard output" -- full "$DSV4" detokenize -m "$SRC/models/kjv" --ids "5 6"
expect_fail "run >/dev/full" "standard output" -- full "$DSV4" run -m "$SRC/models/kjv" -p "And God" -n 3

# bad arguments
fresh
expect_fail "token id out of range" "token 512" "position 1" -- "$DSV4" logits -m "$T/m" --tokens 5,512,7 -o "$T/x"
expect_fail "malformed token list" "--tokens" -- "$DSV4" logits -m "$T/m" --tokens 5,x,7 -o "$T/x"
expect_fail "negative chunk" "--prefill-chunk" -- "$DSV4" logits -m "$T/m" --tokens 5 --prefill-chunk -3 -o "$T/x"
expect_fail "missing model dir" "/nonexistent/dir" -- "$DSV4" logits -m /nonexistent/dir --tokens 5 -o "$T/x"
expect_fail "unwritable output" "$T/no/such/dir/out.0.f32" -- "$DSV4" logits -m "$T/m" --tokens 5 -o "$T/no/such/dir/out"
expect_fail "unknown command" "frobnicate" -- "$DSV4" frobnicate

finish
