#!/usr/bin/env python3
"""make_seeds.py — writes the seed corpora fuzz/corpus/<target>/ from the test
fixtures (run from the repository root; the seeds are checked in, so this is
only needed to regenerate them)."""
import base64, hashlib, json, os, struct

R = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
C = os.path.join(R, "fuzz", "corpus")


def put(target, data):
    d = os.path.join(C, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, hashlib.sha1(data).hexdigest()[:16]), "wb") as f:
        f.write(data)


def fx(*p):
    return os.path.join(R, "tests", "fixtures", *p)


# config.json: both forms, and a few edge values
for p in ("tiny/config.json", "tiny/config.hf.json", "q128/config.json", "q128/config.hf.json"):
    put("fuzz_config", open(fx(p), "rb").read())
j = json.load(open(fx("q128/config.json")))
j["hc_sinkhorn_iters"] = 2147483647
put("fuzz_config", json.dumps(j))
put("fuzz_config", "{}")


# safetensors: small files in the official layout
def st(tensors, meta=True):
    h, data = {}, b""
    if meta:
        h["__metadata__"] = {"format": "pt"}
    for name, dt, shape, size in tensors:
        h[name] = {"dtype": dt, "shape": shape, "data_offsets": [len(data), len(data) + size]}
        data += bytes((i * 37) & 255 for i in range(size))
    hdr = json.dumps(h).encode()
    hdr += b" " * ((8 - len(hdr) % 8) % 8)
    return struct.pack("<Q", len(hdr)) + hdr + data


put("fuzz_safetensors", st([("embed.weight", "BF16", [4, 8], 64), ("norm.weight", "F32", [8], 32)]))
put("fuzz_safetensors", st([("w.weight", "F8_E4M3", [128, 128], 16384), ("w.scale", "F8_E8M0", [1, 1], 1),
                            ("e.weight", "I8", [2, 16], 32), ("e.scale", "F8_E8M0", [2, 1], 2),
                            ("t", "I64", [3, 2], 48), ("empty", "F16", [0, 5], 0)], meta=False))
put("fuzz_safetensors", open(fx("tiny/greedy.safetensors"), "rb").read())

# tokenizer.json: small ones (all 256 byte symbols, a few merges, the added-token flags)
tok = json.load(open(fx("tokenizer/tok_flags.json"), encoding="utf-8"))
vocab = tok["model"]["vocab"]
keep = {t: i for t, i in vocab.items() if i < 400}
merges = [m for m in tok["model"]["merges"]
          if all((x in keep) for x in (m if isinstance(m, list) else m.split(" ")))
          and ("".join(m) if isinstance(m, list) else m.replace(" ", "")) in keep][:100]
small = dict(tok)
small["model"] = dict(tok["model"], vocab=keep, merges=merges)
small["added_tokens"] = [dict(a, id=400 + k) for k, a in enumerate(tok["added_tokens"][:12])]
put("fuzz_tokenizer_load", json.dumps(small, ensure_ascii=False))
small["model"] = dict(small["model"], ignore_merges=True)
put("fuzz_tokenizer_load", json.dumps(small, ensure_ascii=False))

# texts for the fixture tokenizer
cases = json.load(open(fx("tokenizer/cases_small.json")))["cases"]
for c in cases[::60][:25]:
    put("fuzz_tokenize", base64.b64decode(c["b64"]))
put("fuzz_tokenize", "<\uff5cUser\uff5c>hi<\uff5cAssistant\uff5c></think>ok<\uff5cend\u2581of\u2581sentence\uff5c>")
put("fuzz_tokenize", b"\xff\xfe\xc3 \xe4\xb8 abc  \n\n\t 12345 ")

# chat: "0" + a JSON request (even first byte), "1" + a completion (odd)
chat = json.load(open(fx("tokenizer/chat_cases.json"), encoding="utf-8"))
for c in chat["cases"][::6]:
    msgs = []
    for m in c.get("context", []) + c["messages"]:
        m = dict(m)
        for tc in m.get("tool_calls", []) or []:
            if "function" in tc:
                tc.update(tc.pop("function"))
        msgs.append(m)
    o = c.get("opts", {})
    req = {"messages": msgs, "thinking": o.get("thinking_mode") == "thinking",
           "keep_reasoning": o.get("drop_thinking") is False, "no_bos": o.get("add_default_bos_token") is False,
           "effort": o.get("reasoning_effort"), "n_context": len(c.get("context", []))}
    put("fuzz_chat", "0" + json.dumps(req, ensure_ascii=False))
for p in chat["parse"]:
    put("fuzz_chat", "1" + p["text"])
for p in chat["json"][:5]:
    put("fuzz_chat", "1" + p["in"])

# server requests (fuzz_oai): first byte = endpoint (bit 0: chat) and context (64 << bits 1..3)
def oai(chat, ctxbits, body):
    put("fuzz_oai", bytes([(ctxbits << 1) | chat]) + (body if isinstance(body, bytes) else
                                                      json.dumps(body, ensure_ascii=False).encode()))

tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
oai(1, 3, {"messages": [{"role": "user", "content": "Hi"}]})
oai(1, 3, {"model": "kjv", "messages": [{"role": "system", "content": "Be brief."},
                                       {"role": "user", "content": "And God said"}],
           "stream": True, "stream_options": {"include_usage": True}, "max_tokens": 8})
oai(1, 4, {"messages": [{"role": "developer", "content": "Use tools."}, {"role": "user", "content": "Weather in Paris?"}],
           "tools": tools, "tool_choice": "auto", "temperature": 0.7, "top_p": 0.9, "seed": 42})
oai(1, 5, {"messages": [{"role": "user", "content": "Weather in Paris?"},
                        {"role": "assistant", "content": None, "tool_calls": [
                            {"id": "call_1", "type": "function",
                             "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
                        {"role": "tool", "tool_call_id": "call_1", "content": "18C, sunny"},
                        {"role": "user", "content": "Thanks"}], "tools": tools, "tool_choice": "none"})
oai(1, 5, {"messages": [{"role": "user", "content": [{"type": "text", "text": "Part one. "},
                                                     {"type": "text", "text": "<\uff5cUser\uff5c>part two"}]}],
           "reasoning_effort": "high", "logprobs": True, "top_logprobs": 3})
oai(1, 4, {"messages": [{"role": "user", "content": "Think"},
                        {"role": "assistant", "content": "ok", "reasoning_content": "first I think"},
                        {"role": "user", "content": "again"}], "thinking": {"type": "enabled"},
           "chat_template_kwargs": {"thinking": True}, "stop": ["\n\n", "Amen"], "max_completion_tokens": 20})
oai(1, 3, {"messages": [{"role": "user", "content": "x"}], "reasoning_effort": "none", "top_k": 40, "min_p": 0.05,
           "presence_penalty": 0.5, "frequency_penalty": 0.2, "repetition_penalty": 1.1, "stop": "END"})
oai(1, 3, {"messages": [{"role": "user", "content": 5}], "temperature": "hot"})
oai(1, 3, {"messages": [{"role": "wizard", "content": "x"}], "max_tokens": -3})
oai(1, 3, {"messages": [], "model": "gpt-4"})
oai(1, 3, {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
           "top_logprobs": 50, "logprobs": False, "stop": ["a", "b", "c", "d", "e"]})
oai(1, 0, {"messages": [{"role": "user", "content": "a very long prompt " * 20}]})
oai(1, 3, b'{"messages": [{"role": "user", "content": "unterminated')
oai(1, 3, b'[1, 2, 3]')
oai(0, 3, {"prompt": "In the beginning God created", "max_tokens": 16, "temperature": 0, "logprobs": 2})
oai(0, 3, {"model": "kjv", "prompt": "And the earth", "stream": True, "stop": ["\n"], "seed": 7, "n": 1})
oai(0, 2, {"prompt": ["a", "b"], "echo": True, "suffix": "z"})
oai(0, 3, {"prompt": "<\uff5cbegin\u2581of\u2581sentence\uff5c>x</think>y\n\n<\uff5cDSML\uff5ctool_calls>",
           "stop": ["</think>"], "max_tokens": 1})
