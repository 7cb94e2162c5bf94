#!/usr/bin/env python3
"""Build the training / held-out text of the bundled model (models/kjv/) from the
King James Bible (public domain) as shipped by Debian's `bible-kjv` + `bible-kjv-text`.

    apt-get install -y bible-kjv bible-kjv-text
    python3 tools/corpus_kjv.py                      # runs `bible -f "Gen1:1-Rev22:21"`
    python3 tools/corpus_kjv.py --raw kjv_raw.txt    # or parse a saved copy of that output

`bible -f` (pretty-printing toggled OFF) prints one verse per line, each preceded by
its reference, e.g. `Ge1:1 In the beginning God created the heaven and the earth.`
(31,102 verses, 1,189 chapters).

Cleaning: the reference is stripped, runs of white space inside a verse become one
space. Layout of the cleaned text: one verse per line, a blank line between chapters
(no book or chapter titles), UTF-8 (the text is plain ASCII), ending in one newline.

Split (deterministic): chapters are numbered 0..1188 in canonical order; chapter c is
HELD OUT when c % 50 == 25 (24 chapters spread over the whole book: Gen 26, Exo 36,
... ; about 2% of the text); every other chapter is training text. Both files use the
same layout.

Outputs:
  models/kjv/heldout.txt   (committed; evaluation text of the C engine and transformers)
  build-kjv/train.txt      (not committed; git-ignored; carried to the device machine)
  build-kjv/corpus_stats.json
"""
import argparse
import hashlib
import json
import os
import re
import subprocess
import sys

REF = re.compile(r"^([1-3]?[A-Za-z]+)(\d+):(\d+) (.*)$")
HELDOUT_EVERY, HELDOUT_PHASE = 50, 25
RANGE = "Gen1:1-Rev22:21"


def read_raw(path):
    if path:
        with open(path, encoding="utf-8") as f:
            return f.read()
    r = subprocess.run(["bible", "-f", RANGE], check=True, capture_output=True)
    return r.stdout.decode("utf-8")


def parse(raw):
    """[(book, chapter, [verse texts])] in canonical order."""
    chapters, last_key, last_verse = [], None, 0
    for n, line in enumerate(raw.splitlines(), 1):
        if not line.strip():
            continue
        m = REF.match(line)
        if not m:
            raise SystemExit(f"line {n}: not a verse line: {line[:80]!r}")
        book, ch, vs, text = m.group(1), int(m.group(2)), int(m.group(3)), m.group(4)
        text = " ".join(text.split())
        if not text:
            raise SystemExit(f"line {n}: empty verse")
        key = (book, ch)
        if key != last_key:
            if vs != 1:
                raise SystemExit(f"line {n}: chapter {book}{ch} does not start at verse 1")
            chapters.append((book, ch, []))
            last_key, last_verse = key, 0
        if vs != last_verse + 1:
            raise SystemExit(f"line {n}: verse {book}{ch}:{vs} out of order")
        last_verse = vs
        chapters[-1][2].append(text)
    return chapters


def join(chs):
    return "\n\n".join("\n".join(v) for _, _, v in chs) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--raw", help="saved output of `bible -f %s` (default: run it)" % RANGE)
    ap.add_argument("--heldout", default="models/kjv/heldout.txt")
    ap.add_argument("--train", default="build-kjv/train.txt")
    ap.add_argument("--stats", default="build-kjv/corpus_stats.json")
    args = ap.parse_args()

    chapters = parse(read_raw(args.raw))
    nverses = sum(len(v) for _, _, v in chapters)
    if (len(chapters), nverses) != (1189, 31102):
        print(f"WARNING: expected 1189 chapters / 31102 verses, got {len(chapters)} / {nverses}", file=sys.stderr)
    held = [c for i, c in enumerate(chapters) if i % HELDOUT_EVERY == HELDOUT_PHASE]
    train = [c for i, c in enumerate(chapters) if i % HELDOUT_EVERY != HELDOUT_PHASE]
    ht, tt = join(held), join(train)
    for path, text in ((args.heldout, ht), (args.train, tt)):
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
    stats = {
        "source": "Debian bible-kjv-text (King James Version, public domain), `bible -f \"%s\"`" % RANGE,
        "split": "chapter c (0-based, canonical order) held out when c %% %d == %d" % (HELDOUT_EVERY, HELDOUT_PHASE),
        "chapters": len(chapters), "verses": nverses,
        "heldout_chapters": ["%s %d" % (b, c) for b, c, _ in held],
        "heldout_verses": sum(len(v) for _, _, v in held),
        "heldout_bytes": len(ht.encode()), "train_bytes": len(tt.encode()),
        "heldout_fraction_bytes": round(len(ht.encode()) / (len(ht.encode()) + len(tt.encode())), 5),
        "heldout_sha256": hashlib.sha256(ht.encode()).hexdigest(),
        "train_sha256": hashlib.sha256(tt.encode()).hexdigest(),
    }
    os.makedirs(os.path.dirname(args.stats) or ".", exist_ok=True)
    with open(args.stats, "w") as f:
        json.dump(stats, f, indent=1)
        f.write("\n")
    print(json.dumps(stats, indent=1))


if __name__ == "__main__":
    main()
