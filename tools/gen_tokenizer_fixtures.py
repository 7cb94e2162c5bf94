#!/usr/bin/env python3
"""Builds the tokenizer / chat-encoding oracle fixtures for tests/test_tokenizer.c
and tests/test_chat.c.

Runs where the Python `tokenizers` package is installed (the GPU lease machine):

    python3 tools/gen_tokenizer_fixtures.py --out DIR \
        [--encoder PATH/encoding_dsv4.py] [--ds3 PATH/tokenizer.json]

What it writes into DIR:
  tok_small.json        a tokenizer.json with DeepSeek-V3's exact pre_tokenizer
                        (Sequence of three Split/Isolated regexes + ByteLevel
                        without regex), empty normalizer Sequence, ByteLevel
                        decoder, a byte-level BPE vocabulary trained here with
                        `tokenizers` (BpeTrainer, ByteLevel alphabet) on a corpus
                        generated here, and DeepSeek's special tokens (special
                        and non-special added tokens, as in V3/V4).
  tok_flags.json        the same model with merges written as "a b" strings,
                        ignore_merges=true and added tokens using lstrip /
                        rstrip / single_word / normalized flags.
  cases_small.json      the test corpus (different text from the training
                        corpus) with the ids `tokenizers` gives in three modes:
                        "ids" (all added tokens recognized), "ids_nospecial"
                        (encode_special_tokens=True) and "ids_plain" (no added
                        tokens at all), the last two only where they differ from
                        "ids"; and decode cases (random id sequences, with and
                        without skip_special_tokens).
  cases_flags.json      the same for tok_flags.json.
  cases_ds3.json        (with --ds3) the test corpus encoded with the real
                        DeepSeek-V3 tokenizer.json, plus the ids' SHA-256 of a
                        ~10 MB benchmark text (see --bench-text).
  chat_cases.json       (with --encoder) prompts produced by the official
                        DeepSeek-V4 encoder (encoding_dsv4.py, passed by path:
                        third-party code is not part of this repository) from
                        the conversations below, and completion parses.

Without `tokenizers` installed, --bench-text PATH only writes the benchmark text
(the same bytes the oracle run hashes) so the C side can be timed and checked.
"""
import argparse
import base64
import copy
import hashlib
import importlib.util
import json
import os
import random
import sys
import time
import traceback

SPLIT_PATTERNS = [
    "\\p{N}{1,3}",
    "[一-龥぀-ゟ゠-ヿ]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
]

# Special tokens trained in (ids 0..): as DeepSeek's first ids.
TRAINER_SPECIALS = [
    "<｜begin▁of▁sentence｜>",
    "<｜end▁of▁sentence｜>",
    "<｜▁pad▁｜>",
]
# Added after training, with (special, normalized) as DeepSeek-V3/V4 ship them.
ADDED_AFTER = [
    ("<｜User｜>", False, True),
    ("<｜Assistant｜>", False, True),
    ("<think>", False, True),
    ("</think>", False, True),
    ("｜DSML｜", False, True),
    ("<｜latest_reminder｜>", False, True),
    ("<｜action｜>", False, True),
    ("<｜query｜>", False, True),
    ("<｜authority｜>", False, True),
    ("<｜domain｜>", False, True),
    ("<｜title｜>", False, True),
    ("<｜read_url｜>", False, True),
    ("<｜tool▁calls▁begin｜>", False, True),
    ("<｜tool▁calls▁end｜>", False, True),
    ("<｜tool▁call▁begin｜>", False, True),
    ("<｜tool▁call▁end｜>", False, True),
    ("<｜tool▁sep｜>", False, True),
    ("<｜fim▁hole｜>", True, False),
    ("<｜fim▁begin｜>", True, False),
    ("<｜fim▁end｜>", True, False),
    ("<｜place▁holder▁no▁0｜>", True, False),
    ("<｜place▁holder▁no▁1｜>", True, False),
    ("<｜▁pad▁｜>x", True, False),  # overlaps "<｜▁pad▁｜>": leftmost-longest
    ("<|im_start|>", True, False),
]

EN_WORDS = (
    "the of and to in is was for on that with as by at from his her it an were are which this be "
    "or has had not but first one their its new after who they have two been other also into all "
    "more time during years most only over city school many would where later some up may such between "
    "world state university about known national about people through three used however because "
    "well both then under since while being several number these part including water system "
    "language model token encoder decoder inference engine weights matrix vector tensor kernel "
    "Hello World The A An In On It This That We You They He She Paris London Tokyo Berlin "
    "don't can't won't it's I'm you're we've they'll o'clock rock'n'roll e-mail co-operate "
    "naïve café résumé coöperate façade jalapeño Ångström Øresund straße Zürich"
).split()
ZH_WORDS = ("我们 今天 天气 很好 学习 中文 分词 模型 数据 世界 你好 推理 答案 问题 北京 上海 "
            "人工智能 深度学习 自然语言 处理 计算机 科学 技术 发展 经济 社会 文化 历史 时间 "
            "朋友 老师 学生 工作 生活 喜欢 认为 可以 因为 所以 但是 如果 虽然 已经 还是").split()
JA_WORDS = ("こんにちは ありがとう カタカナ ひらがな 東京 日本語 です ます テスト "
            "コンピュータ プログラム 勉強 学校 先生 友達 食べる 飲む 行きます ゲーム ラーメン").split()
KO_WORDS = "안녕하세요 감사합니다 한국어 테스트 데이터 서울 학교 선생님 컴퓨터 프로그램 사랑 음식".split()
OTHER_WORDS = ("Привет мир Москва Καλημέρα κόσμε مرحبا بالعالم שָׁלוֹם עוֹלָם नमस्ते दुनिया "
               "สวัสดี ครับ Xin chào thế giới Γειά σου Ελλάδα Tiếng Việt").split()
CODE = [
    "def foo(x):\n    return x + 1\n",
    "for (int i = 0; i < n; i++) {\n\tsum += a[i];\n}\n",
    "#include <stdio.h>\n",
    "if (a == b) { c->d[i] = 0x1F; }",
    "std::vector<int> v{1, 2, 3};",
    "let mut s = String::new();",
    "// comment\n/* block */",
    "SELECT * FROM t WHERE id = 42;",
    "https://example.com/path?q=1&r=2#frag",
    "user@example.org",
    "x = [i**2 for i in range(10) if i % 3 == 0]",
    "    indented_line()\n        deeper()\n",
    "{\"key\": \"value\", \"n\": [1, 2.5, -3e10], \"ok\": true}",
    "$ ls -la /usr/bin | grep -E '^d' > out.txt 2>&1",
    "<div class=\"a\">&amp;&lt;</div>",
    "a_b_c __init__ CamelCaseName snake_case_name ALLCAPS",
]
NUMBERS_FIXED = ["3.14159", "1,234,567", "2024-01-15", "12:30:45", "+1 (555) 010-9999",
                 "１２３", "٠١٢٣٤", "²³", "ⅫⅣ", "½", "0x7FFF", "1e-9", "007", "10000000000000000000"]
EMOJI = ["😀", "👍🏽", "👨‍👩‍👧‍👦", "🇯🇵", "❤️", "🤖", "🎉🎉🎉", "☕", "✔", "⚠️"]
COMBINING = ["e\u0301", "a\u0308", "n\u0303", "Z\u0351\u0352a\u0353l\u0354g\u0355o", "\u1100\u1161\u11a8",
             "\u0301", "\u0300\u0301\u0302", "क्षि", "ﷺ"]
SPACES = [" ", "  ", "   ", "\t", "\n", "\r\n", "\n\n", " \n ", "\u3000", "\u00a0", "\u2028", "\u0085",
          "\x0b", "\x0c", "\u200b", "\u2009", "\u1680", "\x1c", "\r", " \t \n"]
PUNCT = ["...", "!!!", "?!", "---", "***", "«»", "“quotes”", "『』", "，。！？", "、", "—", "…", "(", ")", "[]",
         "{}", "''", "\"\"", "~", "@", "#hash", "$100", "%", "^", "&&", "||", "\\", "/", ":-)", ";)", "!a", ".b",
         "'s", "-x", ",y"]
WEIRD = ["\x00", "\x01", "\x7f", "\ufeff", "\ufffd", "\ue000", "\uffff", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "𠀀𠀁", "\U0010ffff",
         "\u0378", "\U000e0001", "\u00ad", "\u200d", "\u2060", "\ufe0f", "ǅ", "ᾯ", "ﬁ", "Ⅸ", "㊿", "⑩"]
SPECIAL_TEXT = ["<｜User｜>", "<｜Assistant｜>", "<think>", "</think>", "<｜begin▁of▁sentence｜>",
                "<｜end▁of▁sentence｜>", "｜DSML｜", "<｜▁pad▁｜>", "<｜▁pad▁｜>x", "<｜fim▁hole｜>",
                "<｜User", "<thin", "</think", "<<think>>", "<｜｜>", "｜", "<|im_start|>", "<|im_start|"]


def gen_items(rng, with_specials):
    """One random item of text."""
    r = rng.random()
    if r < 0.30:
        return rng.choice([" ", " ", "", "\n"]) + rng.choice(EN_WORDS)
    if r < 0.40:
        return "".join(rng.choice(ZH_WORDS) for _ in range(rng.randint(1, 4)))
    if r < 0.45:
        return rng.choice(JA_WORDS)
    if r < 0.50:
        return " " + rng.choice(KO_WORDS)
    if r < 0.55:
        return " " + rng.choice(OTHER_WORDS)
    if r < 0.62:
        return rng.choice(CODE)
    if r < 0.68:
        if rng.random() < 0.5:
            return " " + "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 12)))
        return " " + rng.choice(NUMBERS_FIXED)
    if r < 0.72:
        return rng.choice(EMOJI)
    if r < 0.75:
        return rng.choice(COMBINING)
    if r < 0.82:
        return rng.choice(SPACES) * rng.randint(1, 3)
    if r < 0.90:
        return rng.choice(PUNCT)
    if r < 0.94:
        return rng.choice(WEIRD)
    if with_specials:
        return rng.choice(SPECIAL_TEXT)
    return rng.choice(EN_WORDS).upper()


def gen_text(rng, n_items, with_specials):
    return "".join(gen_items(rng, with_specials) for _ in range(n_items))


def training_corpus():
    rng = random.Random(1234)
    lines = []
    for _ in range(12000):
        lines.append(gen_text(rng, rng.randint(5, 60), False))
    return lines


def bench_text(n_bytes=10 * 1000 * 1000):
    """~10 MB of mixed text; deterministic so the C side can regenerate it."""
    rng = random.Random(777)
    parts, size = [], 0
    while size < n_bytes:
        t = gen_text(rng, rng.randint(20, 200), True) + "\n"
        parts.append(t)
        size += len(t.encode("utf-8"))
    return "".join(parts)


def edge_cases():
    cases = ["", " ", "a", "\n", "Hello, world!", "Hello World", " Hello", "  Hello", "hello   world   ",
             "   leading", "trailing   ", "tab\tsep\tvalues", "line1\nline2\r\nline3\rline4",
             "\n\n\n", " \n", "\n ", "  \n  \n", "a\u3000b", "a\u00a0b", "a\u0085b", "a\u2028b", "a\x0bb",
             "a\x1cb", "x\u200by", "1", "12", "123", "1234", "12345", "1234567890123", "٣٤٥٦", "１２３４",
             "3.14", "v1.2.3", "a1b2c3", "²³⁴", "ⅫⅣ", "①②③④", "我们", "我们今天", "東京タワー", "ひらがなカタカナ",
             "漢字かな交じり文", "한국어 텍스트", "Ελληνικά", "Русский текст", "עברית", "العربية", "हिन्दी",
             "ไทย", "e\u0301te\u0301", "\u0301\u0301abc", "a\u0308\u0308", "😀😀", "👨‍👩‍👧‍👦 family",
             "🇯🇵🇺🇸", "!!!", "...", "?!?!", "'hello'", "\"quoted\"", "(parens)", "[brackets]",
             "{braces}", "a.b.c", "a-b-c", "a_b_c", "a/b\\c", "#!/bin/sh", "<html>", "</div>",
             "@user #tag $var %pct", "--flag=value", "--", "->", "=>", "::", "!=", "<=", ">=",
             "'s 're 've 'll 'd 't", "I'm", "DON'T", ".Hello", ",world", "!x", "?y", "%z",
             "\x00", "a\x00b", "\x01\x02\x03", "\x7f", "\ufeffBOM", "\ufffd", "\ue000\ue001",
             "\uffff", "\U0010ffff", "\u0378", "\U000e0001\U000e007f", "\u00ad", "ǅǈ", "ﬁﬂ",
             "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "𠀀𠀁𠀂", "\u2060\ufe0f", "<｜User｜>", "<｜User｜>hi", "hi<｜User｜>",
             " <｜User｜> ", "<｜User｜><｜Assistant｜>", "<think>\nreasoning\n</think>\n\nanswer",
             "<｜begin▁of▁sentence｜><｜begin▁of▁sentence｜>", "<｜▁pad▁｜>", "<｜▁pad▁｜>x", "<｜▁pad▁｜>xy",
             "<<think>>", "<｜User", "<thin", "</think", "｜DSML｜", "<｜DSML｜tool_calls>",
             "<|im_start|>user", "<|im_start|", "<｜｜>", "<｜fim▁hole｜>", " <think> ", "  <think>  x",
             "x<think>y", "the<think>end", "word <think> word", "<think><think></think></think>",
             "<｜place▁holder▁no▁0｜><｜place▁holder▁no▁1｜>", "\n<think>\n", "\t</think>\t"]
    # long runs
    cases += [" " * 1000, "\n" * 500, "\r\n" * 300, " \n" * 300, "\t" * 200, "\u3000" * 100,
              "1" * 2001, "9" * 7, "a" * 5000, "ab" * 2000, "的" * 3000, "あ" * 1000, "😀" * 500,
              "!" * 1000, "-" * 999, "=" * 64 + "\n", "e\u0301" * 300, "x " * 2000, " x" * 2000,
              ("Hello world. " * 200), ("<think>" * 100), ("<｜User｜>" * 50 + "x")]
    return cases


def test_corpus():
    rng = random.Random(4242)
    cases = edge_cases()
    for _ in range(400):
        cases.append(gen_text(rng, rng.randint(1, 40), True))
    for item_list in (EN_WORDS, ZH_WORDS, JA_WORDS, KO_WORDS, OTHER_WORDS, CODE, NUMBERS_FIXED, EMOJI,
                      COMBINING, SPACES, PUNCT, WEIRD, SPECIAL_TEXT):
        for it in item_list:
            cases.append(it)
            cases.append(" " + it + " ")
            cases.append("a" + it + "1")
    # one long mixed document (~300 KB)
    cases.append(gen_text(random.Random(99), 8000, True))
    return cases


def b64(s):
    return base64.b64encode(s.encode("utf-8")).decode("ascii")


def case_entry(text):
    e = {"b64": b64(text)}
    if "\x00" not in text and len(text) < 200:
        e["text"] = text
    return e


def build_variants(tokenizers, tok_json_str):
    """Tokenizer objects for the three modes from a tokenizer.json string."""
    from tokenizers import Tokenizer
    full = Tokenizer.from_str(tok_json_str)
    nospecial = Tokenizer.from_str(tok_json_str)
    has_nospecial = hasattr(nospecial, "encode_special_tokens")
    if has_nospecial:
        nospecial.encode_special_tokens = True
    j = json.loads(tok_json_str)
    j["added_tokens"] = []
    plain = Tokenizer.from_str(json.dumps(j, ensure_ascii=False))
    return full, (nospecial if has_nospecial else None), plain


def make_cases(tokenizers, tok_json_str, texts, rng_seed, name):
    full, nospecial, plain = build_variants(tokenizers, tok_json_str)
    cases = []
    t0 = time.time()
    n_tok = 0
    for t in texts:
        e = case_entry(t)
        ids = full.encode(t, add_special_tokens=False).ids
        n_tok += len(ids)
        e["ids"] = ids
        if len(t) <= 20000:  # the long document only in the default mode
            # the other modes are stored only where they differ from "ids"
            if nospecial is not None:
                other = nospecial.encode(t, add_special_tokens=False).ids
                if other != ids:
                    e["ids_nospecial"] = other
            other = plain.encode(t, add_special_tokens=False).ids
            if other != ids:
                e["ids_plain"] = other
        back = full.decode(ids, skip_special_tokens=False)
        if back != t:
            e["decode_differs"] = True  # lstrip / rstrip tokens swallow whitespace
        cases.append(e)
    print(f"{name}: {len(texts)} cases, {n_tok} tokens, {time.time() - t0:.2f}s", flush=True)
    # decode cases: random id sequences over the whole id range
    rng = random.Random(rng_seed)
    vocab = full.get_vocab(with_added_tokens=True)
    all_ids = sorted(vocab.values())
    added = sorted(int(k) for k in full.get_added_tokens_decoder().keys())
    dec = []
    for i in range(300):
        n = rng.randint(1, 24)
        ids = []
        for _ in range(n):
            r = rng.random()
            if r < 0.15 and added:
                ids.append(rng.choice(added))
            elif r < 0.45:
                ids.append(rng.choice(all_ids[:300]))  # bytes and short merges: broken UTF-8
            else:
                ids.append(rng.choice(all_ids))
        for skip in (False, True):
            s = full.decode(ids, skip_special_tokens=skip)
            dec.append({"ids": ids, "skip_special": skip, "b64": b64(s)})
    return {"tokenizer_vocab_size": full.get_vocab_size(with_added_tokens=True),
            "has_nospecial": nospecial is not None, "cases": cases, "decode": dec}


def train_small(tokenizers):
    from tokenizers import Tokenizer, Regex, models, pre_tokenizers, decoders, normalizers, trainers, AddedToken
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.Sequence([])
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(p), behavior="isolated", invert=False) for p in SPLIT_PATTERNS]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=3000, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=[AddedToken(s, special=True, normalized=False)
                                                  for s in TRAINER_SPECIALS])
    t0 = time.time()
    tok.train_from_iterator(training_corpus(), trainer=trainer)
    print(f"trained in {time.time() - t0:.1f}s, model vocab {tok.get_vocab_size(with_added_tokens=False)}",
          flush=True)
    for content, special, normalized in ADDED_AFTER:
        t = AddedToken(content, special=special, normalized=normalized)
        if special:
            tok.add_special_tokens([t])
        else:
            tok.add_tokens([t])
    return tok


def flags_variant(tok_json_str):
    """merges as "a b" strings, ignore_merges, and lstrip/rstrip/single_word tokens."""
    j = json.loads(tok_json_str)
    m = j["model"]
    m["merges"] = [" ".join(p) if isinstance(p, list) else p for p in m["merges"]]
    m["ignore_merges"] = True
    next_id = max(max(m["vocab"].values()), max(a["id"] for a in j["added_tokens"])) + 1
    extra = [
        ("<L>", dict(lstrip=True)),
        ("<R>", dict(rstrip=True)),
        ("<LR>", dict(lstrip=True, rstrip=True)),
        ("word", dict(single_word=True)),
        ("end", dict(single_word=True, special=True, normalized=False)),
        ("<S>", dict(special=True, normalized=False, lstrip=True)),
    ]
    for content, fl in extra:
        a = {"id": next_id, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": True, "special": False}
        a.update(fl)
        j["added_tokens"].append(a)
        next_id += 1
    return json.dumps(j, ensure_ascii=False, indent=1)


FLAGS_TEXTS = ["a <L> b", "a  <L>b", "<L>", " <L>", "a<R>  b", "a <R>\n\nb", "x <LR> y", "  <LR>  ",
               "word", "a word b", "aword", "words", "word_x", "(word)", "end", "the end", "ending",
               "end.", "x <S> y", "word<L>word", "<R><R>  <R>", "sword word swordfish word."]


def ds4like(ds3_json_str):
    """DeepSeek-V3's tokenizer.json plus the V4 added tokens at their V4 ids."""
    j = json.loads(ds3_json_str)
    v4 = {"<think>": 128821, "</think>": 128822, "｜DSML｜": 128825, "<｜latest_reminder｜>": 128828,
          "<｜action｜>": 128829, "<｜query｜>": 128830, "<｜authority｜>": 128831, "<｜domain｜>": 128832,
          "<｜title｜>": 128836, "<｜read_url｜>": 128845}
    have = {a["content"] for a in j["added_tokens"]}
    for content, i in v4.items():
        if content not in have:
            j["added_tokens"].append({"id": i, "content": content, "single_word": False, "lstrip": False,
                                      "rstrip": False, "normalized": True, "special": False})
    return json.dumps(j, ensure_ascii=False)


# ---------------------------------------------------------------- chat cases
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Get the weather for a city. Unicode: 天气 ☀",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "City name"},
            "days": {"type": "integer", "minimum": 1, "maximum": 7, "default": 1},
            "units": {"type": "string", "enum": ["c", "f"]},
            "ratio": {"type": "number", "default": 0.5, "examples": [1.0, 2.5e-7, 1e21, -0.0, 12345678.125]}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "search", "description": "Search the web.\nReturns \"results\" with\ttabs and \\ slashes.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"},
                                                        "filters": {"type": "object"},
                                                        "big": {"type": "integer",
                                                                "default": 123456789012345678901234567890}}}}},
]


def tc(i, name, args):
    return {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": args}}


def chat_conversations():
    conv = []
    u = lambda c, **k: dict(role="user", content=c, **k)
    a = lambda c, **k: dict(role="assistant", content=c, **k)
    s = lambda c, **k: dict(role="system", content=c, **k)
    conv.append(("single_user", [u("Hello!")]))
    conv.append(("system_user", [s("You are a helpful assistant."), u("What is 2+2?")]))
    conv.append(("multi_turn", [s("Be brief."), u("Hi"), a("Hello! How can I help?"), u("Tell me a joke.")]))
    conv.append(("multi_turn_reasoning", [u("Q1"), a("A1", reasoning_content="think 1"), u("Q2"),
                                          a("A2", reasoning_content="think 2"), u("Q3")]))
    conv.append(("assistant_last", [u("Q1"), a("A1", reasoning_content="r1")]))
    conv.append(("assistant_prefill_wo_eos", [u("Write a poem"), a("Roses are", wo_eos=True)]))
    conv.append(("unicode", [s("系统提示：请用中文回答。"), u("你好，世界！😀 e\u0301 <think>literal</think>")]))
    conv.append(("empty_and_none", [s(None), u(""), a(None), u("again")]))
    conv.append(("tools_system", [s("You can call tools.", tools=TOOLS), u("Weather in Paris?")]))
    conv.append(("tool_call_roundtrip", [
        s("sys", tools=TOOLS), u("Weather in Paris and Tokyo for 3 days?"),
        a("", reasoning_content="Need two calls.", tool_calls=[
            tc(1, "get_weather", json.dumps({"city": "Paris", "days": 3})),
            tc(2, "get_weather", json.dumps({"city": "Tokyo", "days": 3, "units": "c",
                                             "opts": {"a": [1, 2.0, None, True]}}, ensure_ascii=False))]),
        dict(role="tool", tool_call_id="call_2", content="Tokyo: 20C"),
        dict(role="tool", tool_call_id="call_1", content="Paris: 15C"),
        a("Paris 15C, Tokyo 20C.", reasoning_content="Summarize."), u("Thanks")]))
    conv.append(("tool_call_bad_json_args", [
        u("call it"), a(None, tool_calls=[tc(1, "search", "not json {")]),
        dict(role="tool", tool_call_id="call_1", content="ok"), u("next")]))
    conv.append(("tool_args_unicode", [
        u("q"), a("", tool_calls=[tc(1, "search", '{"query": "天气 \\"quoted\\"\\n\\u00e9", "n": 1e400, '
                                                    '"f": 1.10, "neg": -0, "big": 123456789012345678901234567890, '
                                                    '"arr": [], "obj": {}, "nested": {"k": [1, {"z": null}]}}')])]))
    conv.append(("tool_then_user_merge", [
        u("q"), a("", tool_calls=[tc(1, "search", '{"query": "x"}')]),
        dict(role="tool", tool_call_id="call_1", content="result text"), u("follow-up question")]))
    conv.append(("developer", [dict(role="developer", content="Dev instructions", tools=TOOLS[:1]), u("hi")]))
    conv.append(("developer_response_format", [
        dict(role="developer", content="Answer as JSON",
             response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}),
        u("hi")]))
    conv.append(("system_response_format", [s("sys", response_format={"type": "json_object"}), u("hi")]))
    conv.append(("latest_reminder", [s("sys"), u("hi"), dict(role="latest_reminder", content="Today is Monday."),
                                     a("ok")]))
    conv.append(("latest_reminder_last", [u("hi"), dict(role="latest_reminder", content="remember")]))
    conv.append(("task_query", [u("What is the capital of France?", task="query")]))
    conv.append(("task_action", [u("Book a flight", task="action")]))
    conv.append(("task_title_with_answer", [u("Summarize", task="title"), a("A title")]))
    conv.append(("consecutive_users", [u("first"), u("second"), a("reply")]))
    conv.append(("multiline_content", [u("line1\nline2\n\n  indented\ttab"), a("a\nb\n")]))
    # the official encoder refuses these
    conv.append(("error_developer_without_content", [dict(role="developer", content=""), u("hi")]))
    conv.append(("error_bad_task", [u("x", task="bogus")]))
    conv.append(("error_arguments_not_object", [u("q"), a("", tool_calls=[tc(1, "f", "[1, 2]")])]))
    return conv


CHAT_OPTION_SETS = [
    dict(thinking_mode="chat"),
    dict(thinking_mode="thinking"),
    dict(thinking_mode="thinking", drop_thinking=False),
    dict(thinking_mode="thinking", reasoning_effort="max"),
    dict(thinking_mode="thinking", reasoning_effort="high"),
    dict(thinking_mode="chat", add_default_bos_token=False),
]

PARSE_TEXTS = [
    ("chat", "Hello there.<｜end▁of▁sentence｜>"),
    ("chat", "<｜end▁of▁sentence｜>"),
    ("thinking", "Let me think.\nOK.</think>The answer is 4.<｜end▁of▁sentence｜>"),
    ("thinking", "</think>direct<｜end▁of▁sentence｜>"),
    ("thinking", "no end think<｜end▁of▁sentence｜>"),
    ("chat", "missing eos"),
    ("chat", "text<｜end▁of▁sentence｜>trailing"),
    ("thinking", "Need weather.</think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n"
                 "<｜DSML｜parameter name=\"city\" string=\"true\">Paris</｜DSML｜parameter>\n"
                 "<｜DSML｜parameter name=\"days\" string=\"false\">3</｜DSML｜parameter>\n"
                 "</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜>"),
    ("chat", "Calling.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"a\">\n"
             "<｜DSML｜parameter name=\"q\" string=\"true\">天气 \"x\"\nline2</｜DSML｜parameter>\n"
             "<｜DSML｜parameter name=\"o\" string=\"false\">{\"k\": [1, 2]}</｜DSML｜parameter>\n"
             "</｜DSML｜invoke>\n<｜DSML｜invoke name=\"b\">\n</｜DSML｜invoke>\n"
             "</｜DSML｜tool_calls><｜end▁of▁sentence｜>"),
    ("chat", "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"a\">\n"
             "<｜DSML｜parameter name=\"x\" string=\"maybe\">1</｜DSML｜parameter>\n"
             "</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜>"),
    ("chat", "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"a\">\n"
             "<｜DSML｜parameter name=\"x\" string=\"true\">1</｜DSML｜parameter>\n"
             "<｜DSML｜parameter name=\"x\" string=\"true\">2</｜DSML｜parameter>\n"
             "</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜>"),
    ("chat", "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"a\">\n</｜DSML｜invoke>\n"
             "</｜DSML｜tool_calls>junk<｜end▁of▁sentence｜>"),
    ("chat", "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"a\">\n</｜DSML｜invoke>\n"
             "</｜DSML｜tool_calls>"),
    ("chat", "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"a\">\n</｜DSML｜invoke>"),
    ("chat", "\n\n<｜DSML｜tool_calls>\nxx<｜DSML｜invoke name=\"a\">\n</｜DSML｜invoke>\n"
             "</｜DSML｜tool_calls><｜end▁of▁sentence｜>"),
    ("chat", "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke  name=\"a b\">\n</｜DSML｜invoke>\n"
             "</｜DSML｜tool_calls><｜end▁of▁sentence｜>"),
    ("chat", "content with <think> inside<｜end▁of▁sentence｜>"),
    ("thinking", "reason ｜DSML｜ x</think>y<｜end▁of▁sentence｜>"),
    ("chat", "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"a\">\n"
             "<｜DSML｜parameter name=\"p\" string=\"true\">v</｜DSML｜parameter>junk\n"
             "</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜>"),
]


def c_view(msgs):
    """The messages as the C side takes them: tools / response_format as JSON
    text (compact, so the C encoder's re-printing is exercised)."""
    out = []
    for m in msgs:
        m = dict(m)
        for k in ("tools", "response_format"):
            if k in m:
                m[k + "_json"] = json.dumps(m.pop(k), separators=(",", ":"), ensure_ascii=False)
        out.append(m)
    return out


JSON_TEXTS = [
    '{"a": 1, "b": [1.0, 2.50, -0.0, 1e5, 1E-7, 123456789012345678901234567890, -0], "c": null}',
    r'{"s": "tab\there \"q\" \\ \/ \u00e9\u4e2d\ud83d\ude00 \u0001\u001f\u007f x", "e": ""}',
    '[true, false, null, {}, [], [[]], {"x": {}}]',
    '{"dup": 1, "other": 2, "dup": 3}',
    '  {"k" :\n\t"v" }  ',
    '[NaN, Infinity, -Infinity, 1e400, -1e400, 5e-324, 1.7976931348623157e308]',
    '[0.1, 0.2, 0.30000000000000004, 1e16, 1e15, 123456789.123456789, 0.0001, 0.00001, 1e-4, 9.999e-5]',
    '"just a string"', '42', '-17', '3.0', '1e22', '[1e21, 1e20, 12345678901234567890.0]',
]


def json_cases():
    rng = random.Random(5)
    texts = list(JSON_TEXTS)
    for _ in range(300):
        r = rng.random()
        if r < 0.3:
            x = rng.uniform(-1e6, 1e6)
        elif r < 0.6:
            x = rng.random() * 10 ** rng.randint(-30, 30)
        elif r < 0.8:
            x = float(rng.randint(-10 ** 18, 10 ** 18))
        else:
            x = rng.randint(1, 9) * 10.0 ** rng.randint(-10, 25)
        texts.append(repr(x) if rng.random() < 0.5 else "%.*e" % (rng.randint(0, 20), x))
    out = []
    for t in texts:
        e = {"in": t}
        try:
            e["out"] = json.dumps(json.loads(t), ensure_ascii=False)
        except Exception as ex:
            e["error"] = str(ex)
        out.append(e)
    for t in ['{"a": 1,}', '[01]', '{"a" 1}', r'"\x"', '"unterminated', '1.', '.5', '{"a": 1} x', '\ufeff{}',
              '"ctl\u0000ok"', '"raw\ttab"', '[1, 2', 'nul', '-', 'True', "{'a': 1}"]:
        e = {"in": t}
        try:
            e["out"] = json.dumps(json.loads(t), ensure_ascii=False)
        except Exception as ex:
            e["error"] = str(ex)
        out.append(e)
    return out


def make_chat(enc):
    out = {"source": "official DeepSeek-V4 encoding_dsv4.py (encode_messages / "
                     "parse_message_from_completion_text)", "cases": [], "parse": [], "json": json_cases()}
    for name, msgs in chat_conversations():
        for opts in CHAT_OPTION_SETS:
            e = {"name": name, "messages": c_view(msgs), "opts": opts}
            try:
                e["expected"] = enc.encode_messages(copy.deepcopy(msgs), **opts)
            except Exception as ex:  # the official encoder refuses it
                e["error"] = f"{type(ex).__name__}: {ex}"
            out["cases"].append(e)
    # context (prefix already encoded)
    full = [dict(role="system", content="sys"), dict(role="user", content="Q1"),
            dict(role="assistant", content="A1", reasoning_content="R1"), dict(role="user", content="Q2")]
    for split in (1, 2, 3):
        for opts in CHAT_OPTION_SETS[:3]:
            e = {"name": f"context_{split}", "context": c_view(full[:split]), "messages": c_view(full[split:]),
                 "opts": opts}
            try:
                e["expected"] = enc.encode_messages(copy.deepcopy(full[split:]), context=copy.deepcopy(full[:split]),
                                                    **opts)
            except Exception as ex:
                e["error"] = f"{type(ex).__name__}: {ex}"
            out["cases"].append(e)
    for mode, text in PARSE_TEXTS:
        e = {"thinking_mode": mode, "text": text}
        try:
            r = enc.parse_message_from_completion_text(text, mode)
            e["content"] = r["content"]
            e["reasoning_content"] = r["reasoning_content"]
            e["tool_calls"] = [{"name": t["function"]["name"], "arguments": t["function"]["arguments"]}
                               for t in r["tool_calls"]]
        except Exception as ex:
            e["error"] = f"{type(ex).__name__}: {ex}"
        out["parse"].append(e)
    return out


def load_module(path):
    spec = importlib.util.spec_from_file_location("encoding_dsv4", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def write_json(path, obj, indent=None):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=True, indent=indent, separators=(",", ":") if indent is None else None)
        f.write("\n")
    print(f"wrote {path} ({os.path.getsize(path)} bytes)", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="tests/fixtures/tokenizer")
    ap.add_argument("--encoder", help="path of the official encoding_dsv4.py")
    ap.add_argument("--ds3", help="path of DeepSeek-V3's tokenizer.json")
    ap.add_argument("--ds4like-out", help="write DeepSeek-V3's tokenizer.json + V4 added tokens here")
    ap.add_argument("--bench-text", help="only write the ~10 MB benchmark text to this path")
    args = ap.parse_args()

    if args.bench_text:
        with open(args.bench_text, "w", encoding="utf-8", newline="") as f:
            f.write(bench_text())
        return 0
    if args.ds4like_out:
        with open(args.ds3, encoding="utf-8") as f:
            s = ds4like(f.read())
        with open(args.ds4like_out, "w", encoding="utf-8") as f:
            f.write(s)
        return 0

    os.makedirs(args.out, exist_ok=True)
    if args.encoder:
        enc = load_module(args.encoder)
        write_json(os.path.join(args.out, "chat_cases.json"), make_chat(enc), indent=1)
    try:
        import tokenizers
    except ImportError:
        print("no `tokenizers` here: only the chat cases were written", flush=True)
        return 0
    print("tokenizers", tokenizers.__version__, "python", sys.version.split()[0], flush=True)
    texts = test_corpus()

    failed = []
    small = None
    try:
        tok = train_small(tokenizers)
        small = tok.to_str(pretty=True)
        with open(os.path.join(args.out, "tok_small.json"), "w", encoding="utf-8") as f:
            f.write(small)
        res = make_cases(tokenizers, small, texts, 11, "small")
        res["tokenizers_version"] = tokenizers.__version__
        res["tokenizer"] = "tok_small.json"
        write_json(os.path.join(args.out, "cases_small.json"), res)
    except Exception:  # keep the other stages' output
        failed.append('small')
        traceback.print_exc()
    if small is not None:
        try:
            flags = flags_variant(small)
            with open(os.path.join(args.out, "tok_flags.json"), "w", encoding="utf-8") as f:
                f.write(flags)
            res = make_cases(tokenizers, flags, texts[:200] + FLAGS_TEXTS, 12, "flags")
            res["tokenizers_version"] = tokenizers.__version__
            res["tokenizer"] = "tok_flags.json"
            write_json(os.path.join(args.out, "cases_flags.json"), res)
        except Exception:  # keep the other stages' output
            failed.append('flags')
            traceback.print_exc()
    try:
        if args.ds3:
            from tokenizers import Tokenizer
            with open(args.ds3, encoding="utf-8") as f:
                ds3 = f.read()
            res = make_cases(tokenizers, ds3, texts, 13, "ds3")
            res["tokenizers_version"] = tokenizers.__version__
            res["tokenizer"] = "DeepSeek-V3 tokenizer.json (sha256 %s)" % hashlib.sha256(ds3.encode()).hexdigest()
            big = bench_text()
            full = Tokenizer.from_str(ds3)
            t0 = time.time()
            ids = full.encode(big, add_special_tokens=False).ids
            dt = time.time() - t0
            line = " ".join(map(str, ids)) + "\n"
            res["bench"] = {"bytes": len(big.encode("utf-8")),
                            "text_sha256": hashlib.sha256(big.encode("utf-8")).hexdigest(),
                            "n_ids": len(ids), "ids_line_sha256": hashlib.sha256(line.encode()).hexdigest(),
                            "hf_seconds": dt, "hf_tokens_per_s": len(ids) / dt}
            print("ds3 bench:", res["bench"], flush=True)
            t0 = time.time()
            ids2 = full.encode_batch([big[i:i + 100000] for i in range(0, len(big), 100000)],
                                     add_special_tokens=False)
            print(f"ds3 batch (parallel) 100 kB chunks: {sum(len(e.ids) for e in ids2) / (time.time() - t0):.0f} tok/s",
                  flush=True)
            v4 = Tokenizer.from_str(ds4like(ds3))
            p = "<｜User｜>你好<｜Assistant｜><think>推理</think>答案<｜end▁of▁sentence｜>"
            res["ds4like_prompt"] = {"b64": b64(p), "ids": v4.encode(p, add_special_tokens=False).ids}
            print("ds4like prompt ids:", res["ds4like_prompt"]["ids"], flush=True)
            write_json(os.path.join(args.out, "cases_ds3.json"), res)
    except Exception:  # keep the other stages' output
        failed.append('ds3')
        traceback.print_exc()
    if failed:
        print("FAILED stages:", failed, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
