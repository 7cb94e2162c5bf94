#!/usr/bin/env python3
"""mtp_reference.py — a PyTorch reference of DeepSeek-V4's MTP block (docs/deepseek-v4.md §3.7)
from a checkpoint in the official layout (mtp.0.* tensors), for checking the engine's block
(`dsv4 logits --mtp` writes the engine's rows of the same tokens).

What it computes is the definition in DeepSeek's inference/model.py:

    e = enorm(embed[x_{p+1}]);  X_i = e_proj @ e + h_proj @ hnorm(h_p[i])   (every stream i)
    X = Block(X) (one V4 layer, index num_hidden_layers, sliding window only);
    logits = head(norm(hc_head(X)))   with the block's own hc_head_* and norm

How: transformers' DeepseekV4ForCausalLM (the engine's behavioural reference, float32, eager) is
built with num_hidden_layers + 1 layers from tools/gen_fixtures.py's config builder: the first
ones are the model's, the last one is the MTP layer (mtp.0.* renamed to layers.N.*), and the
model's final hc head and norm are loaded with the block's (mtp.0.hc_head_*, mtp.0.norm.weight).
A forward pre-hook on the last layer replaces its input (the main model's streams h, [B, T, n, D])
with the block's input X computed from h and the next tokens. The logits it returns are then the
block's: row p predicts token p + 2.

Usage (tokens x_0 .. x_T; the block sees (h_p, x_{p+1}) for p < T):
    python3 tools/mtp_reference.py -m DIR --tokens 5,17,42,7 -o PREFIX
writes PREFIX.mtp_logits.f32 ([T][vocab] float32, little endian) and prints each row's argmax.
With --compare FILE (the engine's `dsv4 logits --mtp` output of the same tokens, PREFIX.0.mtp.f32)
it prints the largest difference and exits 1 above --tol (default 1e-4).
tools/train_mtp.py trains a block with the same construction.
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_fixtures as gf  # noqa: E402  (the fixtures' decoders, config builder and name maps)


def load_checkpoint(d):
    """Every tensor of DIR as float32 (FP8 and MXFP4 dequantized with their scales), by name."""
    from safetensors import safe_open
    idx = os.path.join(d, "model.safetensors.index.json")
    files = sorted(set(json.load(open(idx))["weight_map"].values())) if os.path.exists(idx) else ["model.safetensors"]
    raw = {}
    for f in files:
        with safe_open(os.path.join(d, f), framework="pt") as st:
            for k in st.keys():
                raw[k] = st.get_tensor(k)
    out = {}
    for k, t in raw.items():
        if k.endswith(".scale"):
            continue
        s = raw.get(k[: -len(".weight")] + ".scale") if k.endswith(".weight") else None
        if s is not None and t.dtype == torch.float8_e4m3fn:
            w = gf.decode_fp8_bits(t.view(torch.uint8))
            sc = gf.decode_e8m0(s.view(torch.uint8)) if s.dtype != torch.float32 else s
            w = w * sc.repeat_interleave(128, 0)[: w.shape[0]].repeat_interleave(128, 1)[:, : w.shape[1]]
        elif s is not None and t.dtype == torch.int8:
            w = gf.decode_fp4(t.view(torch.uint8), s.view(torch.uint8))
        elif t.dtype in (torch.int64, torch.int32):
            w = t
        else:
            w = t.float()
        out[k] = w
    return out


SP_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "head_dim", "qk_rope_head_dim",
           "q_lora_rank", "o_groups", "o_lora_rank", "n_routed_experts", "num_experts_per_tok",
           "moe_intermediate_size", "num_hash_layers", "sliding_window", "index_n_heads", "index_head_dim",
           "index_topk", "hc_mult", "swiglu_limit")


def shape_of(oc):
    """gen_fixtures' shape dict of an official config.json; its fixed constants must be the config's."""
    sp = {k: oc[k] for k in SP_KEYS}
    n = oc["num_hidden_layers"]
    sp["compress_ratios"] = list(oc.get("compress_ratios", [0] * n))[:n]
    for k, v in gf.COMMON.items():
        if k in oc:
            same = oc[k] == v if isinstance(v, str) else float(oc[k]) == float(v)
            assert same, f"config.json {k} = {oc[k]}, gen_fixtures' reference builds {v}"
    ys = oc.get("rope_scaling") or {}
    for k, v in gf.YARN.items():
        if k in ys:
            assert float(ys[k]) == float(v), f"config.json rope_scaling.{k} = {ys[k]}, the reference builds {v}"
    return sp


def block_model(oc, W):
    """(model, set_next): transformers' model of N + 1 layers whose last layer is the block
    (input replaced by the pre-hook), final hc head and norm the block's. set_next(tokens [B, T])
    gives the hook the next tokens x_{p+1} of the batch about to run."""
    n_layers = oc["num_hidden_layers"]
    assert "mtp.0.e_proj.weight" in W and "mtp.0.h_proj.weight" in W, "the checkpoint has no (complete) MTP block"
    eff = {}
    for k, t in W.items():
        if k.startswith("mtp.0."):
            rest = k[len("mtp.0."):]
            if rest.startswith(("enorm.", "hnorm.", "e_proj.", "h_proj.")):
                continue
            if rest == "norm.weight" or rest.startswith("hc_head_"):
                eff[rest] = t
            else:
                eff[f"layers.{n_layers}.{rest}"] = t
        elif k.startswith("mtp."):
            continue
        elif k == "norm.weight" or k.startswith("hc_head_"):
            continue  # the model's own: this run's final hc head and norm are the block's
        else:
            eff[k] = t
    for k in ("norm.weight", "hc_head_fn", "hc_head_base", "hc_head_scale"):
        assert k in eff, f"mtp.0.{k} is missing"
    sp1 = dict(shape_of(oc))
    sp1["num_hidden_layers"] = n_layers + 1
    sp1["compress_ratios"] = sp1["compress_ratios"] + [0]  # the MTP layer: sliding window only
    cfg = gf.hf_config(sp1)
    model = gf.build_model(cfg, eff, sp1)

    D = oc["hidden_size"]
    eps = oc.get("rms_norm_eps", 1e-6)
    blk = {k: W[f"mtp.0.{k}.weight"] for k in ("enorm", "hnorm", "e_proj", "h_proj")}
    emb = W["embed.weight"].float()
    state = {"nxt": None}

    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w

    def pre_hook(mod, args, kwargs):
        h = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
        assert h.dim() == 4 and h.shape[-1] == D, f"expected streams [B, T, n, D], got {tuple(h.shape)}"
        nxt = state["nxt"]
        p = {k: v.to(h.device) for k, v in blk.items()}
        e = rms(emb.to(h.device)[nxt.to(h.device)], p["enorm"]) @ p["e_proj"].t()   # [B, T, D]
        x = e[:, :, None, :] + rms(h, p["hnorm"]) @ p["h_proj"].t()                 # [B, T, n, D]
        if "hidden_states" in kwargs:
            return args, dict(kwargs, hidden_states=x)
        return (x,) + tuple(args[1:]), kwargs

    model.model.layers[n_layers].register_forward_pre_hook(pre_hook, with_kwargs=True)

    def set_next(nxt, params=None):
        state["nxt"] = nxt
        if params is not None:
            blk.update(params)

    return model, set_next


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--tokens", required=True, help="x_0,...,x_T (at least 2)")
    ap.add_argument("-o", "--out", required=True)
    ap.add_argument("--compare", help="the engine's rows (dsv4 logits --mtp: PREFIX.0.mtp.f32)")
    ap.add_argument("--tol", type=float, default=1e-4)
    a = ap.parse_args()
    toks = [int(x) for x in a.tokens.split(",")]
    assert len(toks) >= 2, "need at least two tokens"
    oc = json.load(open(os.path.join(a.model, "config.json")))
    W = load_checkpoint(a.model)
    model, set_next = block_model(oc, W)
    set_next(torch.tensor([toks[1:]]))
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([toks[:-1]])).logits[0].float()   # [T, vocab]
    logits.numpy().astype("<f4").tofile(a.out + ".mtp_logits.f32")
    print("argmax per position:", logits.argmax(-1).tolist())
    if a.compare:
        import numpy as np
        eng = torch.from_numpy(np.fromfile(a.compare, dtype="<f4").copy())
        assert eng.numel() == logits.numel(), f"{a.compare}: {eng.numel()} values, the reference has {logits.numel()}"
        eng = eng.view_as(logits)
        d = (eng - logits).abs()
        same = int((eng.argmax(-1) == logits.argmax(-1)).sum())
        print(f"engine vs reference: max |diff| {float(d.max()):.3g} (row {int(d.max(-1).values.argmax())}), "
              f"mean {float(d.mean()):.3g}; argmax equal in {same} of {logits.shape[0]} rows; tol {a.tol:g}")
        sys.exit(0 if float(d.max()) <= a.tol else 1)


if __name__ == "__main__":
    main()
