#!/usr/bin/env python3
"""mtp_reference.py — a PyTorch reference of DeepSeek-V4's MTP block (docs/deepseek-v4.md §3.7)
from a checkpoint in the official layout (mtp.0.* tensors), for checking the engine's block.

STATUS: NOT RUN. It was written where torch and transformers are not installed; it has not been
executed even once. Expect to fix small things (argument names of transformers' internals) the
first time it runs. What it computes is the definition in DeepSeek's inference/model.py:

    e = enorm(embed[x_{p+1}]);  X_i = e_proj @ e + h_proj @ hnorm(h_p[i])   (every stream i)
    X = Block(X) (one V4 layer, index num_hidden_layers, sliding window only);
    logits = head(norm(hc_head(X)))   with the block's own hc_head_* and norm

How: transformers' DeepseekV4ForCausalLM (the engine's behavioural reference, float32, eager) is
built with num_hidden_layers + 1 layers: the first ones are the model's, the last one is the MTP
layer (mtp.0.* renamed to layers.N.*), and the model's final hc head and norm are loaded with the
block's (mtp.0.hc_head_*, mtp.0.norm.weight). A forward pre-hook on the last layer replaces its
input (the main model's streams h, [B, T, n, D]) with the block's input X computed from h and the
next tokens. The logits it returns are then the block's: row p predicts token p + 2.

Usage (tokens x_0 .. x_T; the block sees (h_p, x_{p+1}) for p < T):
    python3 tools/mtp_reference.py -m DIR --tokens 5,17,42,7 -o PREFIX
writes PREFIX.mtp_logits.f32 ([T][vocab] float32, little endian) and prints each row's argmax.
The engine's side: `ds_forward` of `m->mtp_model` with h_in = the model's `hidden` (test_mtp.c shows
the calls); a command that dumps those logits for comparison is not written yet.
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_fixtures as gf  # noqa: E402  (the fixtures' decoders and name maps)


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


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--tokens", required=True, help="x_0,...,x_T (at least 2)")
    ap.add_argument("-o", "--out", required=True)
    a = ap.parse_args()
    toks = [int(x) for x in a.tokens.split(",")]
    assert len(toks) >= 2, "need at least two tokens"

    from transformers import DeepseekV4Config
    oc = json.load(open(os.path.join(a.model, "config.json")))
    n_layers = oc["num_hidden_layers"]
    W = load_checkpoint(a.model)
    assert "mtp.0.e_proj.weight" in W and "mtp.0.h_proj.weight" in W, "the checkpoint has no (complete) MTP block"

    # the block's layer as layer n_layers; its hc head and norm as the model's final ones
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

    oc2 = dict(oc)
    oc2["num_hidden_layers"] = n_layers + 1
    ratios = list(oc.get("compress_ratios", []))[:n_layers]
    oc2["compress_ratios"] = ratios + [0] if ratios else None  # the MTP layer: sliding window only
    oc2.pop("layer_types", None)
    oc2["num_nextn_predict_layers"] = 0
    cfg = DeepseekV4Config(**{k: v for k, v in oc2.items() if v is not None})
    sp = {"n_routed_experts": oc["n_routed_experts"], "num_hidden_layers": n_layers + 1}
    model = gf.build_model(cfg, eff, sp)

    D = oc["hidden_size"]
    eps = oc.get("rms_norm_eps", 1e-6)
    emb = W["embed.weight"].float()
    enorm, hnorm = W["mtp.0.enorm.weight"], W["mtp.0.hnorm.weight"]
    e_proj, h_proj = W["mtp.0.e_proj.weight"], W["mtp.0.h_proj.weight"]
    nxt = torch.tensor(toks[1:])

    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w

    def pre_hook(mod, args, kwargs):
        h = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
        assert h.dim() == 4 and h.shape[-1] == D, f"expected streams [B, T, n, D], got {tuple(h.shape)}"
        e = rms(emb[nxt], enorm) @ e_proj.t()                       # [T, D]
        x = e[None, :, None, :] + rms(h, hnorm) @ h_proj.t()          # [1, T, n, D]
        if "hidden_states" in kwargs:
            kwargs = dict(kwargs, hidden_states=x)
            return args, kwargs
        return (x,) + tuple(args[1:]), kwargs

    model.model.layers[n_layers].register_forward_pre_hook(pre_hook, with_kwargs=True)
    with torch.no_grad():
        ids = torch.tensor([toks[:-1]])
        logits = model(input_ids=ids).logits[0].float()              # [T, vocab]
    logits.numpy().astype("<f4").tofile(a.out + ".mtp_logits.f32")
    print("argmax per position:", logits.argmax(-1).tolist())


if __name__ == "__main__":
    main()
