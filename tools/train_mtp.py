#!/usr/bin/env python3
"""train_mtp.py — train the MTP block (docs/deepseek-v4.md §3.7) of a checkpoint in the official
layout with the main model frozen, and write it into the checkpoint as mtp.0.* tensors (FP8 e4m3
+ E8M0 128x128 scales for the dense projections and e_proj / h_proj, MXFP4 routed experts, the
rest as the layers store them), so that speculative decoding (`--mtp K`) has drafts worth
verifying. Runs on the GPU machine (torch + transformers >= 5.17):

    PYTHONUNBUFFERED=1 python3 tools/train_mtp.py -m models/kjv --train build-kjv/train.txt \
        --heldout models/kjv/heldout.txt --out OUTDIR --budget 300

The block is built as tools/mtp_reference.py builds it (transformers' model with one more
layer whose input a pre-hook replaces); it starts from a copy of the model's last sliding,
routed layer (its attention, experts and hyper-connections), enorm / hnorm = 1, h_proj = I,
e_proj small, and the model's hc head and norm. The loss distils the main model: the block's
row p against the main model's distribution at p + 1 (both predict token p + 2), so that its
argmax is the token greedy decoding will emit. Training stops at --budget seconds.

OUTDIR receives the checkpoint's files with the block added: the model's shards unchanged, one
more shard with the mtp.0.* tensors, the index and config.json (num_nextn_predict_layers: 1),
and mtp_results.json: the draft's agreement with the main model's greedy token on the held-out
text (the acceptance rate of a first draft), measured on the exported (quantized) block.
"""
import argparse
import json
import math
import os
import shutil
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_fixtures as gf  # noqa: E402
import mtp_reference as mr  # noqa: E402

T0 = time.time()
BOS = 0
CTX = 512


def log(*a):
    print(f"[{time.time() - T0:6.1f}s]", *a, flush=True)


def init_block(oc, W):
    """mtp.0.* from the model's last sliding (ratio 0), routed layer."""
    n, nh = oc["num_hidden_layers"], oc["num_hash_layers"]
    ratios = list(oc.get("compress_ratios", [0] * n))[:n]
    src = max(L for L in range(nh, n) if ratios[L] == 0)
    D = oc["hidden_size"]
    g = torch.Generator().manual_seed(7)
    out = {}
    for k, t in W.items():
        if k.startswith(f"layers.{src}."):
            out["mtp.0." + k[len(f"layers.{src}."):]] = t.clone()
    for k in ("hc_head_fn", "hc_head_base", "hc_head_scale", "norm.weight"):
        out["mtp.0." + k] = W[k].clone()
    out["mtp.0.enorm.weight"] = torch.ones(D)
    out["mtp.0.hnorm.weight"] = torch.ones(D)
    out["mtp.0.h_proj.weight"] = torch.eye(D)
    out["mtp.0.e_proj.weight"] = torch.randn(D, D, generator=g) * (0.5 / math.sqrt(D))
    log(f"block initialised from layer {src}: {len(out)} tensors")
    return out


def block_state(model, n, params):
    """The trained block under its official names (fp32)."""
    sd = {k: v.detach().float().cpu() for k, v in model.state_dict().items() if v.dtype != torch.int64}
    inv = {v: k for k, v in gf.SIMPLE_MAP.items()}
    pre = f"model.layers.{n}."
    out = {}
    for hk, t in sd.items():
        if hk.startswith(pre) and hk[len(pre):] in inv:
            out["mtp.0." + inv[hk[len(pre):]]] = t
    I = model.config.moe_intermediate_size
    gu, dn = sd[pre + "mlp.experts.gate_up_proj"], sd[pre + "mlp.experts.down_proj"]
    for j in range(gu.shape[0]):
        out[f"mtp.0.ffn.experts.{j}.w1.weight"] = gu[j, :I].contiguous()
        out[f"mtp.0.ffn.experts.{j}.w3.weight"] = gu[j, I:].contiguous()
        out[f"mtp.0.ffn.experts.{j}.w2.weight"] = dn[j].contiguous()
    for k, hk in gf.GLOBAL_MAP.items():
        if k.startswith("hc_head_") or k == "norm.weight":
            out["mtp.0." + k] = sd[hk]
    for k, p in params.items():
        out[f"mtp.0.{k}.weight"] = p.detach().float().cpu()
    return out


def write_checkpoint(src, out, entries, oc):
    os.makedirs(out, exist_ok=True)
    idx = json.load(open(os.path.join(src, "model.safetensors.index.json")))
    old = sorted(set(idx["weight_map"].values()))
    n = len(old) + 1
    wm = {}
    for i, f in enumerate(old):
        nf = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        shutil.copyfile(os.path.join(src, f), os.path.join(out, nf))
        wm.update({k: nf for k, v in idx["weight_map"].items() if v == f})
    nf = f"model-{n:05d}-of-{n:05d}.safetensors"
    size = gf.write_safetensors(os.path.join(out, nf), entries, {"format": "pt"})
    wm.update({e[0]: nf for e in entries})
    total = idx.get("metadata", {}).get("total_size", 0) + size
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": dict(sorted(wm.items()))}, f, indent=2)
        f.write("\n")
    oc = dict(oc)
    oc["num_nextn_predict_layers"] = 1
    n = oc["num_hidden_layers"]
    oc["compress_ratios"] = list(oc.get("compress_ratios", [0] * n))[:n] + [0]  # the block: sliding window
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(oc, f, indent=2)
        f.write("\n")
    return nf, size


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--train", required=True)
    ap.add_argument("--heldout", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget", type=float, default=300.0, help="seconds of training")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--max-steps", type=int, default=100000)
    a = ap.parse_args()

    from tokenizers import Tokenizer
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(a.seed)
    oc = json.load(open(os.path.join(a.model, "config.json")))
    n = oc["num_hidden_layers"]
    W = {k: v for k, v in mr.load_checkpoint(a.model).items() if not k.startswith("mtp.")}
    blk = init_block(oc, W)
    tok = Tokenizer.from_file(os.path.join(a.model, "tokenizer.json"))
    tr = torch.tensor(tok.encode(open(a.train, encoding="utf-8").read(), add_special_tokens=False).ids)
    he = tok.encode(open(a.heldout, encoding="utf-8").read(), add_special_tokens=False).ids
    log(f"device {dev}; tokens: train {tr.numel()}, held-out {len(he)}")

    # the main model (frozen) for the targets, and the model with the block
    sp = mr.shape_of(oc)
    main_m = gf.build_model(gf.hf_config(sp), W, sp).to(dev).eval()
    model, set_next = mr.block_model(oc, {**W, **blk})
    model = model.to(dev)
    for p in model.parameters():
        p.requires_grad_(False)
    train_p = [p for p in model.model.layers[n].parameters() if p.is_floating_point()]
    train_p += [p for nm, p in model.named_parameters() if nm.startswith(("model.hc_head.", "model.norm."))]
    for p in train_p:
        p.requires_grad_(True)
    extra = {k: torch.nn.Parameter(blk[f"mtp.0.{k}.weight"].clone().to(dev)) for k in ("enorm", "hnorm", "e_proj", "h_proj")}
    opt = torch.optim.AdamW([{"params": [p for p in train_p if p.dim() >= 2] + [extra["e_proj"], extra["h_proj"]],
                              "weight_decay": 0.01},
                             {"params": [p for p in train_p if p.dim() < 2] + [extra["enorm"], extra["hnorm"]],
                              "weight_decay": 0.0}], lr=a.lr, betas=(0.9, 0.95))
    log(f"trainable: {sum(p.numel() for p in train_p) + sum(p.numel() for p in extra.values())} parameters")

    def step_logits(x):
        """x [B, T + 2] -> (block logits [B, T, V] for rows 0..T-1, main distribution at rows 1..T)"""
        with torch.no_grad():
            tgt = main_m(input_ids=x[:, :-1], use_cache=False).logits.float()[:, 1:]
        set_next(x[:, 1:-1], extra)
        return model(input_ids=x[:, :-2], use_cache=False).logits.float(), tgt

    g = torch.Generator().manual_seed(a.seed)
    he_t = torch.tensor([BOS] + he)
    hw = [he_t[i:i + CTX + 2] for i in range(0, he_t.numel() - CTX - 2, CTX)]

    @torch.no_grad()
    def agreement(m_eval, set_eval, params):
        agree = total = 0
        for w in hw:
            x = w[None].to(dev)
            tgt = main_m(input_ids=x[:, :-1], use_cache=False).logits.float()[:, 1:]
            set_eval(x[:, 1:-1], params)
            lg = m_eval(input_ids=x[:, :-2], use_cache=False).logits.float()
            agree += int((lg.argmax(-1) == tgt.argmax(-1)).sum())
            total += tgt.shape[1]
        return agree / max(total, 1)

    model.eval()
    log(f"agreement with the main model's greedy token before training: {agreement(model, set_next, extra):.4f}")
    model.train()
    t_train, step, ema = time.time(), 0, None
    while time.time() - t_train < a.budget and step < a.max_steps:
        frac = (time.time() - t_train) / a.budget
        for gr in opt.param_groups:
            gr["lr"] = a.lr * (min(1.0, (step + 1) / 50) * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * frac))))
        offs = torch.randint(0, tr.numel() - CTX - 2, (a.batch,), generator=g)
        x = torch.stack([tr[o:o + CTX + 1] for o in offs.tolist()])
        x = torch.cat([torch.full((a.batch, 1), BOS, dtype=torch.long), x], 1).to(dev)
        lg, tgt = step_logits(x)
        loss = -(tgt.softmax(-1) * F.log_softmax(lg, -1)).sum(-1).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(train_p + list(extra.values()), 1.0)
        opt.step()
        lv = loss.item()
        ema = lv if ema is None else 0.98 * ema + 0.02 * lv
        step += 1
        if step % 100 == 0:
            log(f"step {step}: distillation loss {ema:.4f}")
    log(f"trained {step} steps in {time.time() - t_train:.0f} s")
    model.eval()
    a_train = agreement(model, set_next, extra)
    log(f"agreement (fp32 block): {a_train:.4f}")

    entries, _ = gf.store_weights(block_state(model, n, extra), True)
    nf, size = write_checkpoint(a.model, a.out, entries, oc)
    log(f"wrote {a.out}/{nf}: {len(entries)} tensors, {size} bytes")
    # the exported block, dequantized, through the reference construction
    W2 = mr.load_checkpoint(a.out)
    m2, set2 = mr.block_model(oc, W2)
    m2 = m2.to(dev).eval()
    a_exp = agreement(m2, set2, {k: W2[f"mtp.0.{k}.weight"].to(dev) for k in ("enorm", "hnorm", "e_proj", "h_proj")})
    log(f"agreement (exported, quantized block): {a_exp:.4f}")
    with open(os.path.join(a.out, "mtp_results.json"), "w") as f:
        json.dump({"steps": step, "seconds": round(time.time() - t_train), "batch": a.batch, "lr": a.lr,
                   "heldout_positions": len(hw) * CTX, "agreement_fp32": a_train, "agreement_exported": a_exp,
                   "final_loss": ema}, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
