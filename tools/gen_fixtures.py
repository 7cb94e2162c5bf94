#!/usr/bin/env python3
"""Oracle fixtures for dsv4: small random-weight DeepSeek-V4 models in the OFFICIAL
checkpoint layout, plus reference logits from Hugging Face transformers'
DeepseekV4ForCausalLM (the behavioural reference).

Usage (needs torch + transformers>=5.17 with models/deepseek_v4):
    PYTHONUNBUFFERED=1 python3 tools/gen_fixtures.py --out /tmp/fx [--models tiny,q128]
then copy /tmp/fx/<name>/ to tests/fixtures/<name>/.

What it does, per model (see tools/README-fixtures.md for the file formats):
  1. draws every parameter from a seeded torch.Generator (official names);
  2. stores each tensor the way the official checkpoint does (FP8 e4m3 + E8M0 block
     scales, MXFP4 experts + E8M0 group scales, BF16, F32, I64) with a tiny
     self-written safetensors writer, and dequantizes it back: the EFFECTIVE fp32
     weights are exactly what the files decode to;
  3. loads the effective weights into DeepseekV4ForCausalLM (float32, CPU, eager);
  4. for each token sequence, checks the routing / indexer decision margins (and
     re-draws the tokens when a top-k near-tie is found), records the full-prefill
     logits, and compares with HF chunked prefill (7, 128) and token-by-token decode;
  5. writes a greedy-decoding reference (prompt + generated tokens + step logits).
"""

import argparse
import json
import math
import os
import struct
import sys
import time
import traceback

import torch

MARGIN_REL = 1e-4          # minimum relative top-k gap accepted (routing and indexer)
MAX_TOKEN_ATTEMPTS = 80    # token re-draws per sequence before giving up
DEBUG_POSITIONS = [0, 1, 17, 127, 128, 255, 256, 332]

COMMON = dict(
    scoring_func="sqrtsoftplus", norm_topk_prob=True, routed_scaling_factor=1.5,
    hc_sinkhorn_iters=20, hc_eps=1e-6, rms_norm_eps=1e-6, rope_theta=10000.0,
    compress_rope_theta=160000.0, n_shared_experts=1, num_key_value_heads=1,
    max_position_embeddings=1048576,
)
YARN = dict(factor=16.0, original_max_position_embeddings=65536, beta_fast=32.0, beta_slow=1.0)

MODELS = {
    "tiny": dict(
        vocab_size=331, hidden_size=100, num_hidden_layers=5, compress_ratios=[0, 4, 128, 4, 128],
        num_hash_layers=2, num_attention_heads=3, head_dim=40, qk_rope_head_dim=8, q_lora_rank=52,
        o_groups=3, o_lora_rank=24, n_routed_experts=7, num_experts_per_tok=3,
        moe_intermediate_size=36, sliding_window=16, index_n_heads=16, index_head_dim=24,
        index_topk=5, hc_mult=4, swiglu_limit=2.0,
        quantized=False, shards=1, mtp=False, seq_lens=[333, 300], greedy=(120, 24),
        weight_seed=11, token_seed=1100,
    ),
    "q128": dict(
        vocab_size=512, hidden_size=256, num_hidden_layers=5, compress_ratios=[0, 4, 128, 4, 128],
        num_hash_layers=2, num_attention_heads=4, head_dim=128, qk_rope_head_dim=32, q_lora_rank=128,
        o_groups=2, o_lora_rank=128, n_routed_experts=8, num_experts_per_tok=2,
        moe_intermediate_size=128, sliding_window=32, index_n_heads=16, index_head_dim=128,
        index_topk=8, hc_mult=4, swiglu_limit=10.0,
        quantized=True, shards=3, mtp=True, seq_lens=[333, 300], greedy=(120, 24),
        weight_seed=22, token_seed=2200,
    ),
    # the expert numerics at scale: 16 experts top-4 and 32 experts top-6 in MXFP4,
    # prompts of 300+ tokens that cross HCA blocks (ratio 128) and the indexer's top-k
    "q16e": dict(
        vocab_size=512, hidden_size=256, num_hidden_layers=6, compress_ratios=[0, 4, 128, 4, 128, 0],
        num_hash_layers=1, num_attention_heads=4, head_dim=128, qk_rope_head_dim=32, q_lora_rank=128,
        o_groups=2, o_lora_rank=128, n_routed_experts=16, num_experts_per_tok=4,
        moe_intermediate_size=128, sliding_window=16, index_n_heads=16, index_head_dim=128,
        index_topk=5, hc_mult=4, swiglu_limit=10.0,
        quantized=True, shards=2, mtp=False, seq_lens=[333, 300, 310], greedy=(120, 24),
        weight_seed=33, token_seed=3300,
    ),
    "q32e": dict(
        vocab_size=384, hidden_size=128, num_hidden_layers=5, compress_ratios=[0, 4, 128, 4, 128],
        num_hash_layers=2, num_attention_heads=2, head_dim=64, qk_rope_head_dim=16, q_lora_rank=64,
        o_groups=2, o_lora_rank=64, n_routed_experts=32, num_experts_per_tok=6,
        moe_intermediate_size=64, sliding_window=32, index_n_heads=8, index_head_dim=64,
        index_topk=8, hc_mult=4, swiglu_limit=10.0,
        quantized=True, shards=2, mtp=False, seq_lens=[333, 320], greedy=(120, 24),
        weight_seed=44, token_seed=4400,
    ),
    # long context: one prompt of 16,640 tokens (130 HCA blocks, 4,160 CSA entries,
    # the indexer keeping 32 of them); one token draw (margins recorded per token,
    # not re-drawn), HF's own check against chunks of 4,096 instead of 7 / 128 / 1.
    # 16 indexer heads: with 4, an entry scores exactly 0 whenever every head's
    # ReLU is 0 (1 in 16), and exact ties at the top-k boundary are undecidable
    "long": dict(
        vocab_size=64, hidden_size=64, num_hidden_layers=4, compress_ratios=[0, 4, 128, 4],
        num_hash_layers=1, num_attention_heads=2, head_dim=64, qk_rope_head_dim=16, q_lora_rank=64,
        o_groups=2, o_lora_rank=32, n_routed_experts=8, num_experts_per_tok=2,
        moe_intermediate_size=64, sliding_window=64, index_n_heads=16, index_head_dim=64,
        index_topk=32, hc_mult=4, swiglu_limit=10.0,
        quantized=True, shards=1, mtp=False, seq_lens=[16640], greedy=(64, 8), long=True,
        weight_seed=55, token_seed=5500,
    ),
}

E2M1_GRID = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def log(*a):
    print(f"[{time.strftime('%H:%M:%S')}]", *a, flush=True)


# ----------------------------------------------------------------------------- weights

def gen_master(sp, seed):
    """All parameters, official names, fp32 master values (tid2eid int64)."""
    g = torch.Generator().manual_seed(seed)
    randn = lambda *s: torch.randn(*s, generator=g, dtype=torch.float32)
    lin = lambda o, i: randn(o, i) / math.sqrt(i)
    norm = lambda n: 1.0 + 0.1 * randn(n)
    unif = lambda n, lo, hi: lo + (hi - lo) * torch.rand(n, generator=g, dtype=torch.float32)

    V, D, n = sp["vocab_size"], sp["hidden_size"], sp["hc_mult"]
    H, d, ql = sp["num_attention_heads"], sp["head_dim"], sp["q_lora_rank"]
    og, ol = sp["o_groups"], sp["o_lora_rank"]
    E, k, I = sp["n_routed_experts"], sp["num_experts_per_tok"], sp["moe_intermediate_size"]
    ih, idim = sp["index_n_heads"], sp["index_head_dim"]
    mix = (2 + n) * n
    W = {}
    W["embed.weight"] = randn(V, D)
    for L in range(sp["num_hidden_layers"]):
        p = f"layers.{L}."
        ratio = sp["compress_ratios"][L]
        W[p + "attn_norm.weight"] = norm(D)
        W[p + "ffn_norm.weight"] = norm(D)
        for site in ("attn", "ffn"):
            W[p + f"hc_{site}_fn"] = randn(mix, n * D) / math.sqrt(n * D)
            W[p + f"hc_{site}_base"] = 0.5 * randn(mix)
            W[p + f"hc_{site}_scale"] = unif(3, 0.5, 1.5)
        W[p + "attn.wq_a.weight"] = lin(ql, D)
        W[p + "attn.q_norm.weight"] = norm(ql)
        W[p + "attn.wq_b.weight"] = lin(H * d, ql)
        W[p + "attn.wkv.weight"] = lin(d, D)
        W[p + "attn.kv_norm.weight"] = norm(d)
        W[p + "attn.wo_a.weight"] = lin(og * ol, H * d // og)
        W[p + "attn.wo_b.weight"] = lin(D, og * ol)
        W[p + "attn.attn_sink"] = randn(H)
        if ratio:
            c = 2 if ratio == 4 else 1
            W[p + "attn.compressor.wkv.weight"] = lin(c * d, D)
            W[p + "attn.compressor.wgate.weight"] = lin(c * d, D)
            W[p + "attn.compressor.ape"] = 0.5 * randn(ratio, c * d)
            W[p + "attn.compressor.norm.weight"] = norm(d)
        if ratio == 4:
            W[p + "attn.indexer.wq_b.weight"] = lin(ih * idim, ql)
            W[p + "attn.indexer.weights_proj.weight"] = lin(ih, D)
            W[p + "attn.indexer.compressor.wkv.weight"] = lin(2 * idim, D)
            W[p + "attn.indexer.compressor.wgate.weight"] = lin(2 * idim, D)
            W[p + "attn.indexer.compressor.ape"] = 0.5 * randn(4, 2 * idim)
            W[p + "attn.indexer.compressor.norm.weight"] = norm(idim)
        W[p + "ffn.gate.weight"] = lin(E, D)
        if L < sp["num_hash_layers"]:
            W[p + "ffn.gate.tid2eid"] = torch.stack(
                [torch.randperm(E, generator=g)[:k] for _ in range(V)]).to(torch.int64)
        else:
            W[p + "ffn.gate.bias"] = 0.1 * randn(E)
        for j in range(E):
            W[p + f"ffn.experts.{j}.w1.weight"] = lin(I, D)
            W[p + f"ffn.experts.{j}.w2.weight"] = lin(D, I)
            W[p + f"ffn.experts.{j}.w3.weight"] = lin(I, D)
        Is = I * COMMON["n_shared_experts"]
        W[p + "ffn.shared_experts.w1.weight"] = lin(Is, D)
        W[p + "ffn.shared_experts.w2.weight"] = lin(D, Is)
        W[p + "ffn.shared_experts.w3.weight"] = lin(Is, D)
    W["norm.weight"] = norm(D)
    W["head.weight"] = lin(V, D)
    W["hc_head_fn"] = randn(n, n * D) / math.sqrt(n * D)
    W["hc_head_base"] = 0.5 * randn(n)
    W["hc_head_scale"] = unif(1, 0.5, 1.5)
    if sp["mtp"]:  # dummies: the engine must tolerate and ignore mtp.*
        W["mtp.0.enorm.weight"] = norm(D)
        W["mtp.0.hnorm.weight"] = norm(D)
        W["mtp.0.e_proj.weight"] = lin(D, D)
    return W


FP8_SUFFIXES = (
    "attn.wq_a.weight", "attn.wq_b.weight", "attn.wkv.weight", "attn.wo_a.weight",
    "attn.wo_b.weight", "attn.indexer.wq_b.weight", "ffn.shared_experts.w1.weight",
    "ffn.shared_experts.w2.weight", "ffn.shared_experts.w3.weight", "mtp.0.e_proj.weight",
    "mtp.0.h_proj.weight",
)


def storage_kind(name, t, quantized):
    if t.dtype == torch.int64:
        return "I64"
    is_linear = name.endswith(".weight") and t.dim() == 2
    if quantized:
        if ".ffn.experts." in name:
            return "FP4"
        if name.endswith(FP8_SUFFIXES):
            return "FP8"
        return "BF16" if is_linear else "F32"     # embed/head/gate/compressors/weights_proj: BF16
    if name in ("embed.weight", "head.weight"):
        return "F32"
    return "BF16" if is_linear else "F32"


def pow2_exponent(amax, maxv):
    """Smallest integer e with amax / 2^e <= maxv (amax >= 0)."""
    a = amax.double()
    e = torch.ceil(torch.log2(a / maxv))
    e = torch.where(a / torch.exp2(e) > maxv, e + 1, e)
    e = torch.where(a / torch.exp2(e - 1) <= maxv, e - 1, e)
    e = torch.where(a == 0, torch.full_like(e, -127.0), e)
    assert bool((e >= -127).all()) and bool((e <= 127).all()), "scale exponent out of E8M0 range"
    return e.to(torch.int64)


def quant_fp8(w):
    out, inp = w.shape
    bo, bi = -(-out // 128), -(-inp // 128)
    wp = torch.zeros(bo * 128, bi * 128)
    wp[:out, :inp] = w
    amax = wp.view(bo, 128, bi, 128).abs().amax(dim=(1, 3))
    e = pow2_exponent(amax, 448.0)
    s = torch.exp2(e.double()).float()
    sf = s.repeat_interleave(128, 0).repeat_interleave(128, 1)[:out, :inp]
    y = w / sf
    assert float(y.abs().max()) <= 448.0
    q = y.to(torch.float8_e4m3fn)          # round-to-nearest-even
    deq = q.float() * sf
    return q, (e + 127).to(torch.uint8), deq


def quant_fp4(w):
    out, inp = w.shape
    assert inp % 32 == 0, "MXFP4 needs in % 32 == 0"
    g = w.reshape(out, inp // 32, 32)
    e = pow2_exponent(g.abs().amax(-1), 6.0)
    s = torch.exp2(e.double()).float()
    y = g / s[..., None]
    assert float(y.abs().max()) <= 6.0
    grid = torch.tensor(E2M1_GRID)
    dist = (y.abs()[..., None] - grid).abs()
    cand = dist == dist.min(-1, keepdim=True).values
    # nearest grid value; an exact tie goes to the EVEN code (round-half-to-even)
    pref = cand.to(torch.int64) * (2 - (torch.arange(8) % 2))
    idx = pref.argmax(-1)
    neg = (y < 0) & (idx > 0)            # a value that rounds to zero is stored as +0 (code 0)
    code = (idx + 8 * neg.to(torch.int64)).reshape(out, inp).to(torch.uint8)
    packed = code[:, 0::2] | (code[:, 1::2] << 4)   # element 2j low nibble, 2j+1 high nibble
    deq = (grid[idx] * torch.where(neg, -1.0, 1.0) * s[..., None]).reshape(out, inp)
    return packed.contiguous(), (e + 127).to(torch.uint8), deq


# independent decoders (what the C engine does), used to self-check the stored bytes
def decode_e8m0(b):
    return torch.exp2(b.to(torch.float64) - 127.0).float()


def decode_fp8_bits(b):
    b = b.to(torch.int64)
    sign = torch.where((b >> 7) & 1 == 1, -1.0, 1.0).double()
    ex = (b >> 3) & 15
    man = (b & 7).double()
    normal = (1.0 + man / 8.0) * torch.exp2(ex.double() - 7.0)
    sub = (man / 8.0) * 2.0 ** -6
    v = torch.where(ex == 0, sub, normal)
    v = torch.where((ex == 15) & ((b & 7) == 7), torch.full_like(v, float("nan")), v)
    return (sign * v).float()


def decode_fp4(packed, scale_b):
    lo = packed & 15
    hi = packed >> 4
    codes = torch.stack([lo, hi], -1).reshape(packed.shape[0], -1).to(torch.int64)
    grid = torch.tensor(E2M1_GRID)
    v = grid[codes & 7] * torch.where(codes >= 8, -1.0, 1.0)
    return v * decode_e8m0(scale_b).repeat_interleave(32, 1)


def tbytes(t):
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def store_weights(W, quantized):
    """Returns (entries, eff): entries = [(name, dtype, shape, bytes)], eff = fp32 effective."""
    entries, eff = [], {}
    for name, t in W.items():
        kind = storage_kind(name, t, quantized)
        if kind == "I64":
            entries.append((name, "I64", list(t.shape), tbytes(t)))
            eff[name] = t
        elif kind == "F32":
            entries.append((name, "F32", list(t.shape), tbytes(t.float())))
            eff[name] = t.float()
        elif kind == "BF16":
            b = t.to(torch.bfloat16)
            entries.append((name, "BF16", list(t.shape), tbytes(b)))
            eff[name] = b.float()
        elif kind == "FP8":
            q, sb, deq = quant_fp8(t)
            chk = decode_fp8_bits(q.view(torch.uint8)) * decode_e8m0(sb).repeat_interleave(
                128, 0).repeat_interleave(128, 1)[: t.shape[0], : t.shape[1]]
            assert torch.equal(chk, deq), name
            prefix = name[: -len(".weight")]
            entries.append((name, "F8_E4M3", list(t.shape), tbytes(q)))
            entries.append((prefix + ".scale", "F8_E8M0", list(sb.shape), tbytes(sb)))
            eff[name] = deq
        elif kind == "FP4":
            packed, sb, deq = quant_fp4(t)
            assert torch.equal(decode_fp4(packed, sb), deq), name
            prefix = name[: -len(".weight")]
            entries.append((name, "I8", list(packed.shape), tbytes(packed)))
            entries.append((prefix + ".scale", "F8_E8M0", list(sb.shape), tbytes(sb)))
            eff[name] = deq
        else:
            raise AssertionError(kind)
    return entries, eff


# ----------------------------------------------------------------------------- safetensors

ITEMSIZE = {"F32": 4, "BF16": 2, "F8_E4M3": 1, "F8_E8M0": 1, "I8": 1, "I64": 8, "I32": 4}


def write_safetensors(path, entries, metadata=None):
    header = {}
    if metadata:
        header["__metadata__"] = metadata
    off = 0
    for name, dt, shape, data in entries:
        assert len(data) == math.prod(shape) * ITEMSIZE[dt], (name, dt, shape, len(data))
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(data)]}
        off += len(data)
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * ((8 - len(hb) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for _, _, _, data in entries:
            f.write(data)
    return off


def group_entries(entries):
    """Keep a weight and its .scale together (a shard boundary never splits them)."""
    groups = []
    for e in entries:
        if e[0].endswith(".scale") and groups and groups[-1][0][0] == e[0][: -len(".scale")] + ".weight":
            groups[-1].append(e)
        else:
            groups.append([e])
    return groups


def write_model(outdir, entries, shards):
    os.makedirs(outdir, exist_ok=True)
    if shards == 1:
        write_safetensors(os.path.join(outdir, "model.safetensors"), entries, {"format": "pt"})
        return ["model.safetensors"]
    groups = group_entries(entries)
    total = sum(len(e[3]) for e in entries)
    files, cur, acc, weight_map = [], [], 0, {}
    for grp in groups:
        cur.extend(grp)
        acc += sum(len(e[3]) for e in grp)
        if len(files) < shards - 1 and acc >= total * (len(files) + 1) / shards:
            files.append(cur)
            cur = []
    files.append(cur)
    assert len(files) == shards and all(files)
    names = []
    for i, ents in enumerate(files):
        fn = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        write_safetensors(os.path.join(outdir, fn), ents, {"format": "pt"})
        names.append(fn)
        for e in ents:
            weight_map[e[0]] = fn
    with open(os.path.join(outdir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
        f.write("\n")
    return names + ["model.safetensors.index.json"]


# ----------------------------------------------------------------------------- configs

def official_config(sp):
    nl = sp["num_hidden_layers"]
    c = {
        "architectures": ["DeepseekV4ForCausalLM"],
        "model_type": "deepseek_v4",
        "vocab_size": sp["vocab_size"],
        "hidden_size": sp["hidden_size"],
        "num_hidden_layers": nl,
        "num_attention_heads": sp["num_attention_heads"],
        "head_dim": sp["head_dim"],
        "num_key_value_heads": COMMON["num_key_value_heads"],
        "qk_rope_head_dim": sp["qk_rope_head_dim"],
        "q_lora_rank": sp["q_lora_rank"],
        "o_groups": sp["o_groups"],
        "o_lora_rank": sp["o_lora_rank"],
        "n_routed_experts": sp["n_routed_experts"],
        "num_experts_per_tok": sp["num_experts_per_tok"],
        "n_shared_experts": COMMON["n_shared_experts"],
        "moe_intermediate_size": sp["moe_intermediate_size"],
        "num_hash_layers": sp["num_hash_layers"],
        "scoring_func": COMMON["scoring_func"],
        "norm_topk_prob": COMMON["norm_topk_prob"],
        "routed_scaling_factor": COMMON["routed_scaling_factor"],
        "swiglu_limit": sp["swiglu_limit"],
        "sliding_window": sp["sliding_window"],
        "compress_ratios": list(sp["compress_ratios"]) + [0],
        "index_n_heads": sp["index_n_heads"],
        "index_head_dim": sp["index_head_dim"],
        "index_topk": sp["index_topk"],
        "hc_mult": sp["hc_mult"],
        "hc_sinkhorn_iters": COMMON["hc_sinkhorn_iters"],
        "hc_eps": COMMON["hc_eps"],
        "rope_theta": COMMON["rope_theta"],
        "compress_rope_theta": COMMON["compress_rope_theta"],
        "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
                         "beta_fast": 32, "beta_slow": 1},
        "rms_norm_eps": COMMON["rms_norm_eps"],
        "max_position_embeddings": COMMON["max_position_embeddings"],
        "bos_token_id": 0,
        "eos_token_id": 1,
        "num_nextn_predict_layers": 1,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "torch_dtype": "bfloat16",
    }
    if sp["quantized"]:
        c["expert_dtype"] = "fp4"
        c["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0",
                                    "weight_block_size": [128, 128]}
    return c


def hf_config(sp):
    from transformers import DeepseekV4Config
    prf = sp["qk_rope_head_dim"] / sp["head_dim"]
    rope_parameters = {
        "main": {"rope_type": "default", "rope_theta": COMMON["rope_theta"], "partial_rotary_factor": prf},
        "compress": {"rope_type": "yarn", "rope_theta": COMMON["compress_rope_theta"], "factor": YARN["factor"],
                     "original_max_position_embeddings": YARN["original_max_position_embeddings"],
                     "beta_fast": YARN["beta_fast"], "beta_slow": YARN["beta_slow"],
                     "attention_factor": 1.0, "partial_rotary_factor": prf},
    }
    kw = dict(
        vocab_size=sp["vocab_size"], hidden_size=sp["hidden_size"],
        moe_intermediate_size=sp["moe_intermediate_size"], num_hidden_layers=sp["num_hidden_layers"],
        num_attention_heads=sp["num_attention_heads"], num_key_value_heads=COMMON["num_key_value_heads"],
        head_dim=sp["head_dim"], q_lora_rank=sp["q_lora_rank"],
        num_experts_per_tok=sp["num_experts_per_tok"], n_routed_experts=sp["n_routed_experts"],
        n_shared_experts=COMMON["n_shared_experts"], scoring_func=COMMON["scoring_func"],
        norm_topk_prob=COMMON["norm_topk_prob"], routed_scaling_factor=COMMON["routed_scaling_factor"],
        max_position_embeddings=COMMON["max_position_embeddings"], rope_theta=COMMON["rope_theta"],
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 128},
        compress_rope_theta=COMMON["compress_rope_theta"], hc_mult=sp["hc_mult"],
        hc_sinkhorn_iters=COMMON["hc_sinkhorn_iters"], hc_eps=COMMON["hc_eps"],
        swiglu_limit=sp["swiglu_limit"], sliding_window=sp["sliding_window"], o_groups=sp["o_groups"],
        o_lora_rank=sp["o_lora_rank"], index_n_heads=sp["index_n_heads"],
        index_head_dim=sp["index_head_dim"], index_topk=sp["index_topk"], num_nextn_predict_layers=1,
        rms_norm_eps=COMMON["rms_norm_eps"], bos_token_id=0, eos_token_id=1, tie_word_embeddings=False,
        rope_parameters=rope_parameters,
        # legacy / official keys, folded in by DeepseekV4Config.__post_init__
        compress_ratios=list(sp["compress_ratios"]), num_hash_layers=sp["num_hash_layers"],
        qk_rope_head_dim=sp["qk_rope_head_dim"],
    )
    cfg = DeepseekV4Config(**kw)
    cfg.architectures = ["DeepseekV4ForCausalLM"]
    try:
        cfg._attn_implementation = "eager"
    except Exception as e:  # noqa
        log("could not set _attn_implementation on config:", repr(e))
    exp_types = ["sliding_attention" if r == 0 else "compressed_sparse_attention" if r == 4
                 else "heavily_compressed_attention" for r in sp["compress_ratios"]]
    assert list(cfg.layer_types) == exp_types, cfg.layer_types
    nh = sp["num_hash_layers"]
    assert list(cfg.mlp_layer_types) == ["hash_moe"] * nh + ["moe"] * (sp["num_hidden_layers"] - nh)
    assert cfg.qk_rope_head_dim == sp["qk_rope_head_dim"], cfg.qk_rope_head_dim
    return cfg


# ----------------------------------------------------------------------------- HF model

SIMPLE_MAP = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "hc_attn_fn": "attn_hc.fn", "hc_attn_base": "attn_hc.base", "hc_attn_scale": "attn_hc.scale",
    "hc_ffn_fn": "ffn_hc.fn", "hc_ffn_base": "ffn_hc.base", "hc_ffn_scale": "ffn_hc.scale",
    "attn.wq_a.weight": "self_attn.q_a_proj.weight",
    "attn.q_norm.weight": "self_attn.q_a_norm.weight",
    "attn.wq_b.weight": "self_attn.q_b_proj.weight",
    "attn.wkv.weight": "self_attn.kv_proj.weight",
    "attn.kv_norm.weight": "self_attn.kv_norm.weight",
    "attn.wo_a.weight": "self_attn.o_a_proj.weight",
    "attn.wo_b.weight": "self_attn.o_b_proj.weight",
    "attn.attn_sink": "self_attn.sinks",
    "attn.compressor.wkv.weight": "self_attn.compressor.kv_proj.weight",
    "attn.compressor.wgate.weight": "self_attn.compressor.gate_proj.weight",
    "attn.compressor.ape": "self_attn.compressor.position_bias",
    "attn.compressor.norm.weight": "self_attn.compressor.kv_norm.weight",
    "attn.indexer.wq_b.weight": "self_attn.compressor.indexer.q_b_proj.weight",
    "attn.indexer.weights_proj.weight": "self_attn.compressor.indexer.scorer.weights_proj.weight",
    "attn.indexer.compressor.wkv.weight": "self_attn.compressor.indexer.kv_proj.weight",
    "attn.indexer.compressor.wgate.weight": "self_attn.compressor.indexer.gate_proj.weight",
    "attn.indexer.compressor.ape": "self_attn.compressor.indexer.position_bias",
    "attn.indexer.compressor.norm.weight": "self_attn.compressor.indexer.kv_norm.weight",
    "ffn.gate.weight": "mlp.gate.weight",
    "ffn.gate.bias": "mlp.gate.e_score_correction_bias",
    "ffn.gate.tid2eid": "mlp.gate.tid2eid",
    "ffn.shared_experts.w1.weight": "mlp.shared_experts.gate_proj.weight",
    "ffn.shared_experts.w2.weight": "mlp.shared_experts.down_proj.weight",
    "ffn.shared_experts.w3.weight": "mlp.shared_experts.up_proj.weight",
}
GLOBAL_MAP = {
    "embed.weight": "model.embed_tokens.weight", "head.weight": "lm_head.weight",
    "norm.weight": "model.norm.weight", "hc_head_fn": "model.hc_head.hc_fn",
    "hc_head_base": "model.hc_head.hc_base", "hc_head_scale": "model.hc_head.hc_scale",
}


def hf_state_dict(eff, sp):
    sd, used = {}, set()
    for name, t in eff.items():
        if name.startswith("mtp."):
            used.add(name)
            continue
        if name in GLOBAL_MAP:
            sd[GLOBAL_MAP[name]] = t
            used.add(name)
            continue
        parts = name.split(".", 2)
        assert parts[0] == "layers", name
        L, rest = int(parts[1]), parts[2]
        if rest in SIMPLE_MAP:
            sd[f"model.layers.{L}.{SIMPLE_MAP[rest]}"] = t
            used.add(name)
    E, nl = sp["n_routed_experts"], sp["num_hidden_layers"]
    for L in range(nl):
        gu, dn = [], []
        for j in range(E):
            p = f"layers.{L}.ffn.experts.{j}."
            gu.append(torch.cat([eff[p + "w1.weight"], eff[p + "w3.weight"]], 0))  # [2I, D]: gate then up
            dn.append(eff[p + "w2.weight"])                                          # [D, I]
            used.update({p + "w1.weight", p + "w2.weight", p + "w3.weight"})
        sd[f"model.layers.{L}.mlp.experts.gate_up_proj"] = torch.stack(gu)
        sd[f"model.layers.{L}.mlp.experts.down_proj"] = torch.stack(dn)
    missing = set(eff) - used
    assert not missing, f"official tensors with no HF home: {sorted(missing)}"
    return sd


def build_model(cfg, eff, sp):
    from transformers import DeepseekV4ForCausalLM
    model = DeepseekV4ForCausalLM(cfg).float().eval()
    for fn, arg in (("set_attn_implementation", "eager"), ("set_experts_implementation", "eager")):
        if hasattr(model, fn):
            try:
                getattr(model, fn)(arg)
            except Exception as e:
                log(f"{fn}('{arg}') failed: {e!r}")
    if getattr(model.config, "_experts_implementation", "eager") not in (None, "eager"):
        try:
            model.config._experts_implementation = "eager"
        except Exception as e:
            log("cannot force eager experts:", repr(e))
    log("attn impl:", getattr(model.config, "_attn_implementation", None),
        "experts impl:", getattr(model.config, "_experts_implementation", None))
    sd = hf_state_dict(eff, sp)
    msd = model.state_dict()
    for k, v in sd.items():
        assert k in msd, f"HF has no {k}"
        assert tuple(msd[k].shape) == tuple(v.shape), (k, tuple(msd[k].shape), tuple(v.shape))
    missing, unexpected = model.load_state_dict(sd, strict=False)
    assert not unexpected, unexpected
    assert not missing, f"HF params not set from the checkpoint: {missing}"
    msd = model.state_dict()
    for k, v in sd.items():
        assert torch.equal(msd[k].to(v.dtype), v), k
    return model


def layer_of(modname):
    parts = modname.split(".")
    return int(parts[parts.index("layers") + 1])


class Capture:
    """Forward hooks on routers, indexer scorers and indexers (active only when .on)."""

    def __init__(self, model):
        self.on = False
        self.clear()
        for name, mod in model.named_modules():
            cls = type(mod).__name__
            if cls in ("DeepseekV4TopKRouter", "DeepseekV4HashRouter"):
                mod.register_forward_hook(self._hook("router", layer_of(name)))
            elif cls == "DeepseekV4IndexerScorer":
                mod.register_forward_hook(self._hook("scorer", layer_of(name)))
            elif cls == "DeepseekV4Indexer":
                mod.register_forward_hook(self._hook("indexer", layer_of(name)))
            elif cls == "DeepseekV4DecoderLayer":
                mod.register_forward_hook(self._hook("hidden", layer_of(name)))
            elif cls == "DeepseekV4Attention":
                mod.register_forward_hook(self._hook("attn_out", layer_of(name)))
            elif cls == "DeepseekV4SparseMoeBlock":
                mod.register_forward_hook(self._hook("ffn_out", layer_of(name)))

    def clear(self):
        self.router, self.scorer, self.indexer = {}, {}, {}
        self.hidden, self.attn_out, self.ffn_out = {}, {}, {}

    def _hook(self, kind, L):
        def hook(mod, args, out):
            if not self.on:
                return
            if kind == "router":
                self.router[L] = (mod, out[0].detach().clone(), out[2].detach().clone())
            elif kind == "attn_out":
                self.attn_out[L] = out[0].detach().clone()
            else:
                getattr(self, kind)[L] = out.detach().clone()
        return hook


def compute_margins(cap, cfg, sp, T):
    """Decision margins: per layer the smallest, and per token (m["per_token"]:
    route_margin.L / index_margin.L, F32 [T]) the relative gap of the last chosen
    over the first not chosen (inf where nothing was chosen among more)."""
    k, topk = sp["num_experts_per_tok"], sp["index_topk"]
    m = {"router": {}, "indexer": {}, "min_rel": float("inf"), "per_token": {}}
    for L in sorted(cap.router):
        mod, logits, idx = cap.router[L]
        if type(mod).__name__ == "DeepseekV4HashRouter":
            continue
        s = mod.score_fn(logits.float()) + mod.e_score_correction_bias.float()
        v, order = s.sort(-1, descending=True)
        a, b = v[:, k - 1], v[:, k]
        gap = a - b
        rel = gap / torch.maximum(a.abs(), b.abs()).clamp_min(1e-30)
        same = torch.equal(order[:, :k].sort(-1).values, idx.long().sort(-1).values)
        i = int(rel.argmin())
        m["per_token"][f"route_margin.{L}"] = rel.float().contiguous()
        m["router"][L] = {"min_abs_gap": float(gap.min()), "min_rel_gap": float(rel.min()),
                          "at_token": i, "hf_selection_is_topk": bool(same)}
        m["min_rel"] = min(m["min_rel"], float(rel.min()))
    ratio = cfg.compress_rates["compressed_sparse_attention"]
    for L in sorted(cap.scorer):
        sc = cap.scorer[L][0].float()          # [S, n_entries], before the causal mask
        S, n_ent = sc.shape
        vis = (torch.arange(S) + 1) // ratio
        fut = torch.arange(n_ent)[None, :] >= vis[:, None]
        rows = vis > topk
        entry = {"queries_with_more_visible_than_topk": int(rows.sum()), "n_entries": n_ent}
        per = torch.full((S,), float("inf"))
        if rows.any():
            scr = sc[rows].masked_fill(fut[rows], float("-inf"))
            maxabs = sc[rows].abs().masked_fill(fut[rows], 0.0).amax(-1)
            v = scr.sort(-1, descending=True).values
            a, b = v[:, topk - 1], v[:, topk]
            gap = a - b
            den = torch.maximum(torch.maximum(a.abs(), b.abs()), 1e-3 * maxabs).clamp_min(1e-30)
            rel = gap / den
            qi = torch.nonzero(rows).flatten()
            per[qi] = rel.float()
            i = int(rel.argmin())
            entry.update({"min_abs_gap": float(gap.min()), "min_rel_gap": float(rel.min()),
                          "min_gap_over_maxabs": float((gap / maxabs.clamp_min(1e-30)).min()),
                          "at_query": int(qi[i])})
            m["min_rel"] = min(m["min_rel"], float(rel.min()))
        m["indexer"][L] = entry
        m["per_token"][f"index_margin.{L}"] = per.contiguous()
    return m


def selections(cap):
    """Per-layer routed experts and indexer picks from the last captured full pass."""
    out = {}
    for L in sorted(cap.router):
        _, _, idx = cap.router[L]
        out[f"route.{L}"] = idx.long().sort(-1).values.to(torch.int32)
    for L in sorted(cap.indexer):
        x = cap.indexer[L][0].long()
        big = torch.iinfo(torch.int64).max
        x = torch.where(x < 0, torch.full_like(x, big), x).sort(-1).values
        out[f"index.{L}"] = torch.where(x == big, torch.full_like(x, -1), x).to(torch.int32)
    return out


@torch.no_grad()
def full_logits(model, ids, use_cache=False):
    return model(input_ids=ids[None], use_cache=use_cache).logits[0].float()


@torch.no_grad()
def incremental_logits(model, cfg, ids, chunk, info=None):
    from transformers import DynamicCache
    cache = DynamicCache(config=cfg)
    outs = []
    for s in range(0, ids.shape[0], chunk):
        outs.append(model(input_ids=ids[None, s:s + chunk], past_key_values=cache, use_cache=True).logits[0].float())
    if info is not None:
        info["cache_layer_types"] = [type(l).__name__ for l in cache.layers]
    return torch.cat(outs, 0)


@torch.no_grad()
def greedy(model, cfg, prompt, n_new):
    from transformers import DynamicCache
    cache = DynamicCache(config=cfg)
    logits = model(input_ids=prompt[None], past_key_values=cache, use_cache=True).logits[0, -1].float()
    toks, steps = [], []
    for i in range(n_new):
        steps.append(logits)
        t = int(logits.argmax())
        toks.append(t)
        if i + 1 < n_new:
            logits = model(input_ids=torch.tensor([[t]]), past_key_values=cache, use_cache=True).logits[0, -1].float()
    return torch.tensor(toks, dtype=torch.int64), torch.stack(steps)


def json_clean(x):
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): json_clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_clean(v) for v in x]
    return x


def argmax_gap_rel(logits):
    v = logits.topk(2, -1).values
    return float(((v[:, 0] - v[:, 1]) / torch.maximum(v[:, 0].abs(), v[:, 1].abs()).clamp_min(1e-30)).min())


# ----------------------------------------------------------------------------- per model

def modeling_sha():
    import hashlib
    from transformers.models.deepseek_v4 import modeling_deepseek_v4 as mod
    with open(mod.__file__, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def run_model(name, sp, outroot, argv):
    import transformers
    t0 = time.time()
    out = os.path.join(outroot, name)
    os.makedirs(out, exist_ok=True)
    log(f"=== {name}: building weights (seed {sp['weight_seed']})")
    W = gen_master(sp, sp["weight_seed"])
    entries, eff = store_weights(W, sp["quantized"])
    cfg = hf_config(sp)
    model = build_model(cfg, eff, sp)
    cap = Capture(model)
    V = sp["vocab_size"]
    rec = {
        "model": name,
        "generator": "tools/gen_fixtures.py",
        "command": "PYTHONUNBUFFERED=1 python3 " + " ".join(argv),
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "compute": "HF DeepseekV4ForCausalLM, float32, CPU, eager attention, torch threads=%d" % torch.get_num_threads(),
        "modeling_file_sha256": modeling_sha(),
        "weight_seed": sp["weight_seed"],
        "margin_threshold_rel": MARGIN_REL,
        "sizes": {kk: vv for kk, vv in sp.items() if kk not in ("weight_seed", "token_seed")},
        "official_config": official_config(sp),
        "rope": {},
        "sequences": [],
    }
    re = model.model.rotary_emb
    for lt in ("main", "compress"):
        rec["rope"][f"{lt}_inv_freq"] = [float(x) for x in getattr(re, f"{lt}_inv_freq")]
        rec["rope"][f"{lt}_attention_scaling"] = float(getattr(re, f"{lt}_attention_scaling"))
    log("rope main inv_freq:", rec["rope"]["main_inv_freq"])
    log("rope compress inv_freq:", rec["rope"]["compress_inv_freq"], "scaling", rec["rope"]["compress_attention_scaling"])

    ref_entries = []
    for i, T in enumerate(sp["seq_lens"]):
        ids = logits = m = None
        for attempt in range(1 if sp.get("long") else MAX_TOKEN_ATTEMPTS):
            tseed = sp["token_seed"] + 1000 * i + attempt
            ids = torch.randint(0, V, (T,), generator=torch.Generator().manual_seed(tseed))
            cap.clear()
            cap.on = True
            logits = full_logits(model, ids, use_cache=False)
            cap.on = False
            m = compute_margins(cap, cfg, sp, T)
            log(f"seq {i} T={T} token_seed={tseed}: min rel margin {m['min_rel']:.3e}")
            if m["min_rel"] >= MARGIN_REL or sp.get("long"):
                break
        else:
            log(f"WARNING: seq {i}: no token seed passed the margin check")
        sel = selections(cap)
        if i == 0:  # per-layer intermediates at a few positions, for debugging an engine mismatch
            pos = torch.tensor([p for p in DEBUG_POSITIONS if p < T])
            dbg = {"debug.positions": pos.to(torch.int32)}
            for L in sorted(cap.hidden):
                dbg[f"debug.hidden.{L}"] = cap.hidden[L][0, pos].float().contiguous()
                dbg[f"debug.attn_out.{L}"] = cap.attn_out[L][0, pos].float().contiguous()
                dbg[f"debug.ffn_out.{L}"] = cap.ffn_out[L][0, pos].float().contiguous()
            for kk, v in dbg.items():
                ref_entries.append((kk, "I32" if v.dtype == torch.int32 else "F32", list(v.shape), tbytes(v)))
        per_token = m.pop("per_token")
        srec = {"index": i, "length": T, "token_seed": tseed, "attempts": attempt + 1,
                "margins": m, "max_abs_logit": float(logits.abs().max()),
                "logit_std": float(logits.std()), "diff_vs_full": {}, "argmax_agree": {}}
        t1 = time.time()
        variants = {"full_use_cache": full_logits(model, ids, use_cache=True)}
        info = {}
        if sp.get("long"):
            variants["chunk4096"] = incremental_logits(model, cfg, ids, 4096, info)
        else:
            variants["chunk7"] = incremental_logits(model, cfg, ids, 7, info)
            variants["chunk128"] = incremental_logits(model, cfg, ids, 128)
            variants["decode"] = incremental_logits(model, cfg, ids, 1)
        srec["cache_layer_types"] = info.get("cache_layer_types")
        am = logits.argmax(-1)
        for kk, v in variants.items():
            dd = (v - logits).abs()
            srec["diff_vs_full"][kk] = float(dd.max())
            srec["argmax_agree"][kk] = int((v.argmax(-1) == am).sum())
            if float(dd.max()) > 1e-3:
                row = int(dd.max(-1).values.argmax())
                srec.setdefault("first_bad_position", {})[kk] = int(torch.nonzero(dd.max(-1).values > 1e-3)[0])
                log(f"  !! {kk}: max diff {float(dd.max()):.3e} at position {row}")
        log(f"  seq {i}: diffs {srec['diff_vs_full']} ({time.time() - t1:.1f}s)")
        rec["sequences"].append(srec)
        ref_entries.append((f"tokens.{i}", "I32", [T], tbytes(ids.to(torch.int32))))
        ref_entries.append((f"logits.{i}", "F32", [T, V], tbytes(logits)))
        for kk, v in sel.items():
            ref_entries.append((f"{kk.split('.')[0]}.{i}.{kk.split('.')[1]}", "I32", list(v.shape), tbytes(v)))
        for kk, v in per_token.items():
            ref_entries.append((f"{kk.split('.')[0]}.{i}.{kk.split('.')[1]}", "F32", list(v.shape), tbytes(v)))

    # greedy decoding reference
    P, N = sp["greedy"]
    for attempt in range(MAX_TOKEN_ATTEMPTS):
        gseed = sp["token_seed"] + 9000 + attempt
        prompt = torch.randint(0, V, (P,), generator=torch.Generator().manual_seed(gseed))
        gtoks, glogits = greedy(model, cfg, prompt, N)
        seq = torch.cat([prompt, gtoks[:-1]])
        cap.clear()
        cap.on = True
        fl = full_logits(model, seq, use_cache=False)
        cap.on = False
        gm = compute_margins(cap, cfg, sp, seq.shape[0])
        gm.pop("per_token")
        agap = argmax_gap_rel(glogits)
        log(f"greedy prompt_seed={gseed}: min rel margin {gm['min_rel']:.3e}, argmax gap {agap:.3e}")
        if gm["min_rel"] >= MARGIN_REL and agap >= MARGIN_REL:
            break
    rec["greedy"] = {"prompt_seed": gseed, "prompt_len": P, "new_tokens": N, "attempts": attempt + 1,
                     "tokens": [int(x) for x in gtoks], "margins_on_full_sequence": gm,
                     "min_rel_argmax_gap": agap,
                     "max_abs_diff_decode_vs_full_prefill": float((fl[P - 1:] - glogits).abs().max())}
    write_safetensors(os.path.join(out, "greedy.safetensors"), [
        ("prompt", "I32", [P], tbytes(prompt.to(torch.int32))),
        ("tokens", "I32", [N], tbytes(gtoks.to(torch.int32))),
        ("logits", "F32", [N, V], tbytes(glogits)),
    ], {"format": "pt"})

    # files
    write_model(out, entries, sp["shards"])
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(official_config(sp), f, indent=2)
        f.write("\n")
    with open(os.path.join(out, "config.hf.json"), "w") as f:
        f.write(cfg.to_json_string(use_diff=False))
    write_safetensors(os.path.join(out, "reference.safetensors"), ref_entries, {"format": "pt"})

    rec["checks"] = checks(name, sp, out, cfg, model, eff, entries, rec)
    rec["files"] = {fn: os.path.getsize(os.path.join(out, fn)) for fn in sorted(os.listdir(out))}
    with open(os.path.join(out, "reference.json"), "w") as f:
        json.dump(json_clean(rec), f, indent=1, allow_nan=False)
        f.write("\n")
    rec["files"]["reference.json"] = os.path.getsize(os.path.join(out, "reference.json"))
    log(f"=== {name}: done in {time.time() - t0:.1f}s; files {rec['files']}; total {sum(rec['files'].values())} bytes")


def checks(name, sp, out, cfg, model, eff, entries, rec):
    res = {}
    # 1. our safetensors files read back by the safetensors library, byte for byte
    try:
        from safetensors import safe_open
        want = {e[0]: e for e in entries}
        fns = [f for f in os.listdir(out) if f.startswith("model") and f.endswith(".safetensors")]
        seen, bad = 0, []
        for fn in fns:
            with safe_open(os.path.join(out, fn), framework="pt") as f:
                for key in f.keys():
                    t = f.get_tensor(key)
                    e = want[key]
                    if list(t.shape) != e[2] or tbytes(t) != e[3]:
                        bad.append(key)
                    seen += 1
        res["safetensors_readback"] = {"tensors": seen, "expected": len(entries), "mismatches": bad}
    except Exception as ex:
        res["safetensors_readback"] = {"error": repr(ex)}
    log("check safetensors_readback:", res["safetensors_readback"])
    # 2. the OFFICIAL config.json parsed by transformers gives the same model config
    try:
        from transformers import AutoConfig
        from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4RotaryEmbedding
        c2 = AutoConfig.from_pretrained(out)
        diffs = {}
        for key in ("layer_types", "mlp_layer_types", "compress_rates", "sliding_window", "head_dim",
                    "qk_rope_head_dim", "partial_rotary_factor", "index_topk", "swiglu_limit",
                    "routed_scaling_factor", "hc_sinkhorn_iters", "num_experts_per_tok"):
            a, b = getattr(cfg, key, None), getattr(c2, key, None)
            if a != b:
                diffs[key] = [repr(a), repr(b)]
        r1, r2 = DeepseekV4RotaryEmbedding(cfg), DeepseekV4RotaryEmbedding(c2)
        for lt in ("main", "compress"):
            a, b = getattr(r1, f"{lt}_inv_freq"), getattr(r2, f"{lt}_inv_freq")
            if a.shape != b.shape or not torch.allclose(a, b, rtol=1e-6, atol=0):
                diffs[f"{lt}_inv_freq"] = [a.tolist(), b.tolist()]
            if getattr(r1, f"{lt}_attention_scaling") != getattr(r2, f"{lt}_attention_scaling"):
                diffs[f"{lt}_attention_scaling"] = [getattr(r1, f"{lt}_attention_scaling"),
                                                    getattr(r2, f"{lt}_attention_scaling")]
        res["official_config_via_AutoConfig"] = {"differences": diffs,
                                                 "rope_parameters": json.loads(json.dumps(c2.rope_parameters, default=str))}
    except Exception as ex:
        res["official_config_via_AutoConfig"] = {"error": repr(ex)}
    log("check official_config_via_AutoConfig:", res["official_config_via_AutoConfig"])
    # 3. transformers' own loader (conversion_mapping 'deepseek_v4') on the official files
    try:
        from transformers import DeepseekV4ForCausalLM
        import copy
        kw = dict(config=copy.deepcopy(cfg), attn_implementation="eager")
        if sp["quantized"]:
            from transformers import FineGrainedFP8Config
            kw = dict(attn_implementation="eager", quantization_config=FineGrainedFP8Config(dequantize=True))
        try:
            m2 = DeepseekV4ForCausalLM.from_pretrained(out, dtype=torch.float32, **kw)
        except TypeError:
            m2 = DeepseekV4ForCausalLM.from_pretrained(out, torch_dtype=torch.float32, **kw)
        m2 = m2.float().eval()
        s1, s2 = model.state_dict(), m2.state_dict()
        only1 = sorted(set(s1) - set(s2))
        only2 = sorted(set(s2) - set(s1))
        worst = {}
        for key in set(s1) & set(s2):
            a, b = s1[key], s2[key]
            if a.shape != b.shape:
                worst[key] = f"shape {tuple(a.shape)} vs {tuple(b.shape)}"
            elif not torch.equal(a.float(), b.float()):
                worst[key] = float((a.float() - b.float()).abs().max())
        ids = torch.randint(0, sp["vocab_size"], (64,), generator=torch.Generator().manual_seed(5))
        try:
            m2.config._experts_implementation = "eager"
        except Exception:
            pass
        ld = float((full_logits(m2, ids) - full_logits(model, ids)).abs().max())
        res["hf_from_pretrained"] = {"only_in_ours": only1[:20], "only_in_hf_loaded": only2[:20],
                                     "n_value_mismatch": len(worst),
                                     "value_mismatch": dict(list(sorted(worst.items()))[:20]),
                                     "logit_max_abs_diff_64tok": ld}
    except Exception as ex:
        res["hf_from_pretrained"] = {"error": repr(ex)[:2000]}
        traceback.print_exc()
    log("check hf_from_pretrained:", res["hf_from_pretrained"])
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--threads", type=int, default=16)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    import transformers
    log("python", sys.version.split()[0], "torch", torch.__version__, "transformers", transformers.__version__)
    argv = ["tools/gen_fixtures.py"] + sys.argv[1:]
    failed = []
    for name in args.models.split(","):
        try:
            run_model(name, MODELS[name], args.out, argv)
        except Exception:
            traceback.print_exc()
            failed.append(name)
    if failed:
        log("FAILED:", failed)
        sys.exit(1)


if __name__ == "__main__":
    main()
