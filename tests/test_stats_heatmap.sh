#!/usr/bin/env bash
# test_stats_heatmap.sh — `dsv4 stats --heatmap F.png` on the bundled model:
# the file is a PNG (decoded here with Python's zlib, not libpng) of a row of
# cells per layer and a column per expert, each cell one colour, and within a
# layer a busier expert (from --load-out's counts) is never drawn colder; a
# file that cannot be written is an error naming it.
set -uo pipefail
bin="$1"
src="$2"
T="$(mktemp -d)"
trap 'rm -rf "$T"' EXIT
. "$(dirname "$0")/check_lib.sh"

head -c 6000 "$src/models/kjv/heldout.txt" >"$T/text"
"$bin" stats -m "$src/models/kjv" --file "$T/text" --load-out "$T/load" --heatmap "$T/h.png" >"$T/log" 2>&1 &&
  ok || bad "stats --heatmap: $(tail -3 "$T/log")"
grep -q "^heatmap: $T/h.png" "$T/log" && ok || bad "no heatmap line in: $(tail -3 "$T/log")"
# layers and experts from config.json; cells of 16 x 16 pixels up to 64 experts
out="$(python3 - "$T/h.png" "$T/load" "$src/models/kjv/config.json" <<'PY'
import json, struct, sys, zlib
png, load, cfg = sys.argv[1:]
c = json.load(open(cfg))
L, E = c["num_hidden_layers"], c["n_routed_experts"]
d = open(png, "rb").read()
assert d[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG signature"
i, idat, ihdr = 8, b"", None
while i < len(d):
    n, = struct.unpack(">I", d[i:i + 4]); kind = d[i + 4:i + 8]; body = d[i + 8:i + 8 + n]
    crc, = struct.unpack(">I", d[i + 8 + n:i + 12 + n])
    assert zlib.crc32(kind + body) == crc, f"bad CRC in {kind}"
    if kind == b"IHDR": ihdr = struct.unpack(">IIBBBBB", body)
    if kind == b"IDAT": idat += body
    i += 12 + n
W, H, depth, ctype = ihdr[:4]
assert (depth, ctype) == (8, 2), f"not 8-bit RGB: {ihdr}"
cw, ch = W // E, H // L
assert W == E * 16 and H == L * 16, f"{W} x {H} pixels for {L} layers x {E} experts"
raw = zlib.decompress(idat); stride = 3 * W; rows = []; prev = bytearray(stride)
for y in range(H):  # undo the PNG filters
    f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
    for x in range(stride):
        a = line[x - 3] if x >= 3 else 0; b = prev[x]; cc = prev[x - 3] if x >= 3 else 0
        if f == 1: line[x] = (line[x] + a) & 255
        elif f == 2: line[x] = (line[x] + b) & 255
        elif f == 3: line[x] = (line[x] + (a + b) // 2) & 255
        elif f == 4:
            p = a + b - cc; pa, pb, pc = abs(p - a), abs(p - b), abs(p - cc)
            line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else cc)) & 255
        else: assert f == 0, f"filter {f}"
    rows.append(bytes(line)); prev = line
cnt = {}
for ln in open(load):
    if ln.startswith("#"): continue
    l, e, k = map(int, ln.split()); cnt[(l, e)] = k
for l in range(L):
    cells = []
    for e in range(E):
        px = {rows[l * ch + y][3 * (e * cw + x):3 * (e * cw + x) + 3] for y in range(ch) for x in range(cw)}
        assert len(px) == 1, f"layer {l} expert {e}: {len(px)} colours in one cell"
        r, g, b = next(iter(px))
        heat = -1000 if (r, g, b) == (0, 0, 0) else r - b  # black: no token
        cells.append((cnt[(l, e)], heat))
    for a in cells:
        for b in cells:
            assert not (a[0] > b[0] and a[1] < b[1]), f"layer {l}: load {a[0]} drawn colder than load {b[0]}"
    assert len({h for _, h in cells}) > 1, f"layer {l}: every expert the same colour"
print(f"ok {L} x {E}")
PY
)" && ok || bad "the picture: $out"
echo "$out"
# an unwritable file: an error naming it, no success
"$bin" stats -m "$src/models/kjv" --file "$T/text" --heatmap "$T/nodir/h.png" >"$T/log" 2>&1 &&
  bad "--heatmap into a missing directory succeeded" || ok
grep -q "nodir/h.png" "$T/log" && ok || bad "the error does not name the file: $(tail -2 "$T/log")"
finish
