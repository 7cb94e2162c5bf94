#!/usr/bin/env python3
"""Train the bundled DeepSeek-V4 model (models/kjv/) on the King James Bible and export it
in the OFFICIAL checkpoint layout (FP8 e4m3 + E8M0 128x128 block scales for the dense
projections, MXFP4 routed experts, BF16 embed/head/gate/compressors, F32 norms/hc/sinks/
ape/bias, I64 tid2eid), then measure transformers' perplexity of the EXPORTED weights.

Runs on the GPU machine (torch + transformers >= 5.17 with models/deepseek_v4 + tokenizers):

    python3 tools/corpus_kjv.py                 # here: writes build-kjv/train.txt, models/kjv/heldout.txt
    PYTHONUNBUFFERED=1 python3 tools/train_bundled.py --train build-kjv/train.txt \
        --heldout models/kjv/heldout.txt --out $OUT --budget 450 --post-reserve 110 --max-epochs 5

One call does everything (see tools/README-bundled.md):
  1. trains a byte-level BPE tokenizer (DeepSeek-V3/V4 pre-tokenizer, V4 special tokens);
  2. smoke-tests the whole pipeline on the real model size (2 optimizer steps, export,
     reload, eval, greedy) so that a bug fails in seconds, not after training;
  3. trains DeepseekV4ForCausalLM (eager attention, fp32 master weights, TF32 matmuls,
     AdamW + cosine) until the time budget says stop, with
       - the aux-loss-free balancing rule on every routed MoE layer:
         b_i += gamma * sign(mean_load - load_i) after each step (loads from a forward
         hook on the router's selected experts);
       - a KL loss that trains the Lightning Indexer of each CSA layer towards the
         (detached, head-averaged) main-attention distribution over the compressed entries;
         the indexer's inputs are detached, so this loss only moves indexer weights
         (the indexer gets no gradient from the LM loss: its top-k is not differentiable);
       - validation on 2% of the training chapters (every 50th) and the best-validation
         weights kept;
  4. exports the official files (tools/gen_fixtures.py's writer), reloads the
     dequantized weights into transformers and computes the held-out perplexity
     (float32, TF32 off; [BOS] + consecutive 512-token windows), per-layer expert load,
     and greedy continuations; writes reference.json;
  5. writes into --out: the model shards, bundle.tar.gz (configs, index, tokenizer,
     reference.json, results.json, training_log.json) and log.txt.
"""

import argparse
import copy
import io
import json
import math
import os
import sys
import tarfile
import time
import traceback

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_fixtures as gf  # noqa: E402  (official-layout writer, config builders, name mapping)

T_START = time.time()

# ----------------------------------------------------------------------------- model size

SP = dict(
    vocab_size=None,  # set from the tokenizer
    hidden_size=256, num_hidden_layers=6, compress_ratios=[0, 4, 128, 0, 4, 128],
    num_hash_layers=2, num_attention_heads=4, head_dim=128, qk_rope_head_dim=32, q_lora_rank=128,
    o_groups=2, o_lora_rank=128, n_routed_experts=16, num_experts_per_tok=2,
    moe_intermediate_size=256, sliding_window=64, index_n_heads=16, index_head_dim=64,
    index_topk=16, hc_mult=4, swiglu_limit=10.0,
    quantized=True, shards=2, mtp=False,
)
VOCAB_TARGET = 6000
CTX = 512            # tokens per training sample / evaluation window (plus a leading BOS)
BOS, EOS = 0, 1

# ----------------------------------------------------------------------------- tokenizer
# Copied from tools/gen_tokenizer_fixtures.py (owned by another engineer; copied, not
# imported, so that later edits there cannot change this model). DeepSeek-V3/V4's
# pre-tokenizer: three Split(..., "isolated") regexes, then ByteLevel without regex.
SPLIT_PATTERNS = [
    "\\p{N}{1,3}",
    "[一-龥぀-ゟ゠-ヿ]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
]
TRAINER_SPECIALS = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>"]   # ids 0, 1, 2
# (content, special, normalized), as DeepSeek-V3/V4 ship them; appended after the BPE vocabulary.
ADDED_AFTER = [
    ("<｜User｜>", False, True), ("<｜Assistant｜>", False, True),
    ("<think>", False, True), ("</think>", False, True),
    ("｜DSML｜", False, True), ("<｜latest_reminder｜>", False, True),
    ("<｜action｜>", False, True), ("<｜query｜>", False, True), ("<｜authority｜>", False, True),
    ("<｜domain｜>", False, True), ("<｜title｜>", False, True), ("<｜read_url｜>", False, True),
    ("<｜tool▁calls▁begin｜>", False, True), ("<｜tool▁calls▁end｜>", False, True),
    ("<｜tool▁call▁begin｜>", False, True), ("<｜tool▁call▁end｜>", False, True),
    ("<｜tool▁sep｜>", False, True),
    ("<｜fim▁hole｜>", True, False), ("<｜fim▁begin｜>", True, False), ("<｜fim▁end｜>", True, False),
    ("<｜place▁holder▁no▁0｜>", True, False), ("<｜place▁holder▁no▁1｜>", True, False),
]


def log(*a):
    print(f"[{time.time() - T_START:6.1f}s]", *a, flush=True)


def check_against_fixture_tokenizer():
    """Informational: is the copied pre-tokenizer still the one in gen_tokenizer_fixtures?"""
    try:
        import gen_tokenizer_fixtures as gt
        same = gt.SPLIT_PATTERNS == SPLIT_PATTERNS and gt.TRAINER_SPECIALS == TRAINER_SPECIALS
        theirs = {c for c, _, _ in gt.ADDED_AFTER}
        missing = [c for c, _, _ in ADDED_AFTER if c not in theirs]
        log("pre-tokenizer identical to gen_tokenizer_fixtures:", same, "| our added tokens missing there:", missing)
    except Exception as e:  # noqa
        log("could not compare with gen_tokenizer_fixtures:", repr(e))


def train_tokenizer(chapters, vocab_total):
    from tokenizers import Tokenizer, Regex, models, pre_tokenizers, decoders, normalizers, trainers, AddedToken
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.Sequence([])
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(p), behavior="isolated", invert=False) for p in SPLIT_PATTERNS]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_total - len(ADDED_AFTER), min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=[AddedToken(s, special=True, normalized=False)
                                                  for s in TRAINER_SPECIALS])
    tok.train_from_iterator(chapters, trainer=trainer)
    nmodel = tok.get_vocab_size(with_added_tokens=False)
    for content, special, normalized in ADDED_AFTER:
        t = AddedToken(content, special=special, normalized=normalized)
        if special:
            tok.add_special_tokens([t])
        else:
            tok.add_tokens([t])
    assert tok.token_to_id(TRAINER_SPECIALS[0]) == BOS and tok.token_to_id(TRAINER_SPECIALS[1]) == EOS
    return tok, nmodel


def tokenizer_config():
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": TRAINER_SPECIALS[0], "eos_token": TRAINER_SPECIALS[1], "pad_token": TRAINER_SPECIALS[2],
        "add_bos_token": True, "add_eos_token": False, "clean_up_tokenization_spaces": False,
        "legacy": True, "model_max_length": 1048576,
    }


# ----------------------------------------------------------------------------- model

def make_model(cfg, seed, device):
    from transformers import DeepseekV4ForCausalLM
    torch.manual_seed(seed)
    model = DeepseekV4ForCausalLM(copy.deepcopy(cfg)).float()
    for fn, arg in (("set_attn_implementation", "eager"), ("set_experts_implementation", "eager")):
        if hasattr(model, fn):
            try:
                getattr(model, fn)(arg)
            except Exception as e:  # noqa
                log(f"{fn}('{arg}') failed: {e!r}")
    try:
        model.config._experts_implementation = "eager"
    except Exception as e:  # noqa
        log("cannot force eager experts:", repr(e))
    g = torch.Generator().manual_seed(seed + 1)
    E, k, V = SP["n_routed_experts"], SP["num_experts_per_tok"], SP["vocab_size"]
    for L in range(SP["num_hash_layers"]):
        t2e = torch.rand(V, E, generator=g).argsort(-1)[:, :k].contiguous()   # k distinct experts per token
        model.model.layers[L].mlp.gate.tid2eid.copy_(t2e)
    return model.to(device)


def official_state(model):
    """HF state dict -> official tensor names (fp32 / int64, CPU)."""
    sd = {k: v.detach().float().cpu() if v.dtype != torch.int64 else v.detach().cpu()
          for k, v in model.state_dict().items()}
    inv_simple = {v: k for k, v in gf.SIMPLE_MAP.items()}
    inv_global = {v: k for k, v in gf.GLOBAL_MAP.items()}
    W, used = {}, set()
    I = SP["moe_intermediate_size"]
    W["embed.weight"] = sd["model.embed_tokens.weight"]
    used.add("model.embed_tokens.weight")
    for L in range(SP["num_hidden_layers"]):
        pre = f"model.layers.{L}."
        for hk in sorted(k for k in sd if k.startswith(pre)):
            rest = hk[len(pre):]
            if rest in inv_simple:
                W[f"layers.{L}.{inv_simple[rest]}"] = sd[hk]
                used.add(hk)
        gu, dn = sd[pre + "mlp.experts.gate_up_proj"], sd[pre + "mlp.experts.down_proj"]
        for j in range(SP["n_routed_experts"]):
            W[f"layers.{L}.ffn.experts.{j}.w1.weight"] = gu[j, :I].contiguous()
            W[f"layers.{L}.ffn.experts.{j}.w3.weight"] = gu[j, I:].contiguous()
            W[f"layers.{L}.ffn.experts.{j}.w2.weight"] = dn[j].contiguous()
        used.update({pre + "mlp.experts.gate_up_proj", pre + "mlp.experts.down_proj"})
    for hk, on in inv_global.items():
        if on != "embed.weight":
            W[on] = sd[hk]
            used.add(hk)
    left = sorted(set(sd) - used)
    assert not left, f"HF tensors with no official name: {left[:10]}"
    return W


class Hooks:
    """Router loads (all MoE layers) and the tensors the indexer KL loss needs (CSA layers)."""

    def __init__(self, model, want_indexer):
        self.E = SP["n_routed_experts"]
        self.counts = {}
        self.ind = {}
        self.capture_ind = False
        self.handles = []
        for L, layer in enumerate(model.model.layers):
            self.handles.append(layer.mlp.gate.register_forward_hook(self._router(L)))
            comp = getattr(layer.self_attn, "compressor", None)
            if want_indexer and comp is not None and hasattr(comp, "indexer"):
                self.handles.append(layer.self_attn.q_b_proj.register_forward_hook(self._grab(L, "q")))
                self.handles.append(comp.register_forward_hook(self._grab(L, "ckv")))
                self.handles.append(comp.indexer.scorer.register_forward_hook(self._grab(L, "score")))
                # detach the indexer's inputs: its KL loss must only move indexer weights
                self.handles.append(comp.indexer.register_forward_pre_hook(
                    lambda mod, args: (args[0].detach(), args[1].detach()) + tuple(args[2:])
                    if len(args) >= 2 else None))
        self.routed = [L for L, layer in enumerate(model.model.layers) if not layer.mlp.is_hash]

    def _router(self, L):
        def hook(mod, args, out):
            c = torch.bincount(out[2].reshape(-1), minlength=self.E).float()
            self.counts[L] = self.counts[L] + c if L in self.counts else c
        return hook

    def _grab(self, L, what):
        def hook(mod, args, out):
            if not self.capture_ind:
                return
            if what == "q":
                self.ind.setdefault(L, {})["q"] = out.detach()
            elif what == "ckv":
                self.ind.setdefault(L, {})["ckv"] = out[0].detach()
            else:
                self.ind.setdefault(L, {})["score"] = out
        return hook

    def reset_counts(self):
        self.counts = {}

    def remove(self):
        for h in self.handles:
            h.remove()


def indexer_kl(model, hooks, S, device):
    """Sum over CSA layers of mean KL(p_attn || softmax(indexer scores)) over queries with >= 1 entry."""
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import apply_rotary_pos_emb
    H, d, eps = SP["num_attention_heads"], SP["head_dim"], 1e-6
    pos = torch.arange(S, device=device)
    cos, sin = model.model.rotary_emb(torch.zeros(1, device=device), position_ids=pos[None], layer_type="compress")
    vis = (pos + 1) // 4
    total, n = 0.0, 0
    for L, t in hooks.ind.items():
        q, ckv, sc = t["q"], t["ckv"][:, 0], t["score"]      # [B,S,H*d], [B,T,d], [B,S,T]
        B, T = q.shape[0], ckv.shape[1]
        q = q.view(B, S, H, d).float()
        q = q * torch.rsqrt(q.pow(2).mean(-1, keepdim=True) + eps)
        q = apply_rotary_pos_emb(q.transpose(1, 2), cos, sin)              # [B,H,S,d]
        fut = torch.arange(T, device=device)[None, :] >= vis[:, None]      # [S,T]
        rows = vis >= 1
        fr = fut[rows]
        att = torch.einsum("bhsd,btd->bhst", q[:, :, rows], ckv.float()) * d ** -0.5
        p = att.masked_fill(fr, float("-inf")).softmax(-1).mean(1)        # [B,Sv,T]
        logq = sc[:, rows].float().masked_fill(fr, float("-inf")).log_softmax(-1).masked_fill(fr, 0.0)
        kl = (p * (p.clamp_min(1e-30).log() - logq)).sum(-1).mean()
        total = total + kl
        n += 1
    hooks.ind = {}
    return total, n


# ----------------------------------------------------------------------------- data / eval

def windows_of(ids, ctx=CTX):
    """Consecutive non-overlapping windows; the last may be shorter; dropped when < 2 tokens."""
    w = [ids[i:i + ctx] for i in range(0, len(ids), ctx)]
    return [x for x in w if len(x) >= 2]


@torch.no_grad()
def eval_windows(model, wins, device, batch=8, per_window=False):
    """Sum of NLL over all window tokens; each window is [BOS] + window."""
    model.eval()
    total, count, per = 0.0, 0, []
    groups = {}
    for i, w in enumerate(wins):
        groups.setdefault(len(w), []).append(i)
    res = {}
    for ln, idxs in groups.items():
        for s in range(0, len(idxs), batch):
            chunk = idxs[s:s + batch]
            x = torch.tensor([[BOS] + wins[i] for i in chunk], device=device)
            logits = model(input_ids=x, use_cache=False).logits.float()
            lp = torch.log_softmax(logits[:, :-1], -1).gather(-1, x[:, 1:, None])[..., 0].double()
            for r, i in enumerate(chunk):
                res[i] = (-float(lp[r].sum()), ln)
    for i in range(len(wins)):
        nll, ln = res[i]
        total += nll
        count += ln
        per.append(nll)
    return (total, count, per) if per_window else (total, count)


def set_tf32(on):
    torch.backends.cuda.matmul.allow_tf32 = on
    torch.backends.cudnn.allow_tf32 = on
    torch.set_float32_matmul_precision("high" if on else "highest")


@torch.no_grad()
def greedy_full(model, prompt, n_new, device):
    """Greedy by full re-prefill at every step (no cache). Returns tokens, top1 logit, top1-top2 gap."""
    seq = list(prompt)
    toks, top, gaps = [], [], []
    for _ in range(n_new):
        lg = model(input_ids=torch.tensor([seq], device=device), use_cache=False).logits[0, -1].float()
        v, i = lg.topk(2)
        toks.append(int(i[0]))
        top.append(float(v[0]))
        gaps.append(float(v[0] - v[1]))
        seq.append(int(i[0]))
    return toks, top, gaps


@torch.no_grad()
def greedy_cached(model, cfg, prompt, n_new, device):
    from transformers import DynamicCache
    cache = DynamicCache(config=cfg)
    lg = model(input_ids=torch.tensor([prompt], device=device), past_key_values=cache, use_cache=True).logits[0, -1]
    toks = []
    for i in range(n_new):
        t = int(lg.float().argmax())
        toks.append(t)
        if i + 1 < n_new:
            lg = model(input_ids=torch.tensor([[t]], device=device), past_key_values=cache, use_cache=True).logits[0, -1]
    return toks


# ----------------------------------------------------------------------------- export

def export(model, cfg, outdir, shards):
    """Official files into outdir; returns (entries, eff, file sizes)."""
    W = official_state(model)
    entries, eff = gf.store_weights(W, True)
    total = sum(len(e[3]) for e in entries)
    shards = max(shards, math.ceil(total / 14.0e6))
    names = gf.write_model(outdir, entries, shards)
    oc = gf.official_config(SP)
    oc["num_nextn_predict_layers"] = 0               # MTP off: no mtp.* tensors
    oc["compress_ratios"] = list(SP["compress_ratios"])
    with open(os.path.join(outdir, "config.json"), "w") as f:
        json.dump(oc, f, indent=2)
        f.write("\n")
    with open(os.path.join(outdir, "config.hf.json"), "w") as f:
        f.write(cfg.to_json_string(use_diff=False))
    return entries, eff, names


def load_exported(cfg, eff, device):
    m_cpu = gf.build_model(copy.deepcopy(cfg), eff, SP)   # fp32, CPU, effective (dequantized) weights
    return m_cpu, copy.deepcopy(m_cpu).to(device).eval()


def layer_loads(counts):
    out = {}
    for L in sorted(counts):
        c = counts[L].double().cpu()
        frac = c / c.sum()
        out[str(L)] = {"max_over_mean": float(c.max() / c.mean()), "min_over_mean": float(c.min() / c.mean()),
                       "fractions": [round(float(x), 5) for x in frac]}
    return out


def loads_str(counts):
    return " ".join(f"L{L}:{float(counts[L].max() / counts[L].mean()):.2f}" for L in sorted(counts))


# ----------------------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train", default="build-kjv/train.txt")
    ap.add_argument("--heldout", default="models/kjv/heldout.txt")
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget", type=float, default=555.0, help="seconds for the whole run (training stops early)")
    ap.add_argument("--post-reserve", type=float, default=120.0, help="seconds kept for export/eval after training")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=1.5e-3)
    ap.add_argument("--min-lr-frac", type=float, default=0.05)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--gamma", type=float, default=1e-3, help="aux-loss-free bias update speed")
    ap.add_argument("--max-epochs", type=float, default=30.0)
    ap.add_argument("--max-steps", type=int, default=100000)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--no-indexer-loss", action="store_true")
    ap.add_argument("--smoke-only", action="store_true")
    args = ap.parse_args()

    import transformers
    import tokenizers
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    log("torch", torch.__version__, "transformers", transformers.__version__, "tokenizers", tokenizers.__version__,
        "device", torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu")
    os.makedirs(args.out, exist_ok=True)
    bundle = os.path.join(args.out, "_bundle")
    os.makedirs(bundle, exist_ok=True)
    results = {"versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                            "tokenizers": tokenizers.__version__, "python": sys.version.split()[0]},
               "args": vars(args)}

    # ---- text and tokenizer
    with open(args.train, encoding="utf-8") as f:
        train_text = f.read()
    with open(args.heldout, encoding="utf-8") as f:
        held_text = f.read()
    chapters = train_text.rstrip("\n").split("\n\n")
    val_ch = [c for i, c in enumerate(chapters) if i % 50 == 0]
    tr_ch = [c for i, c in enumerate(chapters) if i % 50 != 0]
    log(f"train.txt: {len(chapters)} chapters -> {len(tr_ch)} train / {len(val_ch)} validation; "
        f"heldout {len(held_text)} bytes")
    check_against_fixture_tokenizer()
    tok, nmodel = train_tokenizer(tr_ch + val_ch, VOCAB_TARGET)
    V = tok.get_vocab_size(with_added_tokens=True)
    SP["vocab_size"] = V
    tok.save(os.path.join(bundle, "tokenizer.json"), pretty=True)
    with open(os.path.join(bundle, "tokenizer_config.json"), "w") as f:
        json.dump(tokenizer_config(), f, indent=2, ensure_ascii=False)
        f.write("\n")
    enc = lambda s: tok.encode(s, add_special_tokens=False).ids  # noqa: E731
    tr_ids = enc("\n\n".join(tr_ch) + "\n")
    va_ids = enc("\n\n".join(val_ch) + "\n")
    he_ids = enc(held_text)
    rt = tok.decode(he_ids, skip_special_tokens=False) == held_text
    log(f"tokenizer: BPE vocab {nmodel} + {len(ADDED_AFTER)} added = {V}; tokens train {len(tr_ids)} "
        f"val {len(va_ids)} heldout {len(he_ids)} (bytes/token {len(held_text.encode()) / len(he_ids):.2f}); "
        f"heldout decode round-trip {rt}")
    results["tokenizer"] = {"bpe_vocab": nmodel, "added": len(ADDED_AFTER), "vocab_size": V,
                            "train_tokens": len(tr_ids), "val_tokens": len(va_ids), "heldout_tokens": len(he_ids),
                            "heldout_roundtrip": rt}
    stream = torch.tensor(tr_ids, dtype=torch.long, device=device)
    val_w = windows_of(va_ids)
    held_w = windows_of(he_ids)

    cfg = gf.hf_config(SP)
    cfg.num_nextn_predict_layers = 0
    cfg.use_cache = False

    def build_train_state(seed):
        model = make_model(cfg, seed, device).train()
        hooks = Hooks(model, not args.no_indexer_loss)
        decay, no_decay = [], []
        for n, p in model.named_parameters():
            (decay if p.dim() >= 2 and "position_bias" not in n else no_decay).append(p)
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.wd},
                                 {"params": no_decay, "weight_decay": 0.0}],
                                lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=device.type == "cuda")
        return model, hooks, opt

    gen = torch.Generator().manual_seed(args.seed)
    state = {"indexer_loss": not args.no_indexer_loss}

    def batch_of(B):
        offs = torch.randint(0, stream.numel() - CTX, (B,), generator=gen).to(device)
        x = stream[offs[:, None] + torch.arange(CTX, device=device)[None]]
        return torch.cat([torch.full((B, 1), BOS, dtype=torch.long, device=device), x], 1)

    def train_step(model, hooks, opt, lr, B):
        for g in opt.param_groups:
            g["lr"] = lr
        x = batch_of(B)
        hooks.capture_ind = state["indexer_loss"]
        logits = model(input_ids=x[:, :-1], use_cache=False).logits
        hooks.capture_ind = False
        lm = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
        aux = torch.zeros((), device=device)
        if state["indexer_loss"]:
            try:
                aux, _ = indexer_kl(model, hooks, x.shape[1] - 1, device)
            except Exception:
                traceback.print_exc()
                log("indexer KL loss failed: disabled from here on")
                state["indexer_loss"] = False
                hooks.ind = {}
                aux = torch.zeros((), device=device)
        opt.zero_grad(set_to_none=True)
        (lm + aux).backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return lm.detach(), aux.detach(), gn

    def update_bias(model, hooks, step_counts):
        with torch.no_grad():   # aux-loss-free balancing: b_i += gamma * sign(mean_load - load_i)
            for L in hooks.routed:
                c = step_counts[L]
                model.model.layers[L].mlp.gate.e_score_correction_bias.add_(args.gamma * torch.sign(c.mean() - c))

    # ---- smoke test of the whole pipeline (fails fast)
    log("smoke test: 2 steps, export, reload, eval, greedy")
    set_tf32(True)
    model, hooks, opt = build_train_state(args.seed)
    nparam = sum(p.numel() for p in model.parameters())
    for _ in range(2):
        hooks.reset_counts()
        lm, aux, gn = train_step(model, hooks, opt, 1e-4, 2)
        update_bias(model, hooks, hooks.counts)
        log(f"  smoke step lm {float(lm):.3f} indexer_kl {float(aux):.4f} gnorm {float(gn):.2f} loads {loads_str(hooks.counts)}")
    sdir = os.path.join(args.out, "_smoke")
    entries, eff, names = export(model, cfg, sdir, SP["shards"])
    m_cpu, m_dev = load_exported(cfg, eff, device)
    t, c = eval_windows(m_dev, held_w[:1] + held_w[-1:], device)
    ptoks = [BOS] + enc("And God said")
    g1 = greedy_full(m_dev, ptoks, 3, device)[0]
    g2 = greedy_cached(m_dev, m_dev.config, ptoks, 3, device)
    log(f"  smoke export {names}, eval nll/token {t / c:.3f}, greedy {g1} cached {g2}")
    del m_cpu, m_dev, eff, entries, model, hooks, opt
    import shutil
    shutil.rmtree(sdir, ignore_errors=True)
    torch.cuda.empty_cache()
    if args.smoke_only:
        return 0

    # ---- training
    model, hooks, opt = build_train_state(args.seed)
    log(f"model: {nparam} parameters; config {json.dumps({k: v for k, v in SP.items()})}")
    B = args.batch
    deadline = T_START + args.budget - args.post_reserve
    total_steps = args.max_steps
    max_by_epochs = int(args.max_epochs * len(tr_ids) / (B * CTX))
    total_steps = min(total_steps, max_by_epochs)
    curve, val_curve = [], []
    best = {"val": float("inf"), "step": 0, "state": None}
    step, tok_seen, t_train0 = 0, 0, time.time()
    t_mark, tok_mark, t_10 = time.time(), 0, time.time()
    run_lm, run_aux, run_n = 0.0, 0.0, 0
    log_every, val_every = 50, 250
    train_error = None
    agg_counts = {}

    def lr_at(s):
        if s < args.warmup:
            return args.lr * (s + 1) / args.warmup
        p = min(1.0, (s - args.warmup) / max(1, total_steps - args.warmup))
        return args.lr * (args.min_lr_frac + (1 - args.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * p)))

    def do_val(s):
        t, c = eval_windows(model, val_w, device, batch=16)
        model.train()
        v = t / c
        val_curve.append({"step": s, "val_loss": round(v, 5), "time_s": round(time.time() - t_train0, 1)})
        if v < best["val"]:
            best.update(val=v, step=s, state={k: x.detach().clone() for k, x in model.state_dict().items()})
        log(f"  val step {s}: loss {v:.4f} (ppl {math.exp(v):.2f}); best {best['val']:.4f} @ {best['step']}")

    try:
        while step < total_steps and time.time() < deadline:
            hooks.reset_counts()
            lm, aux, gn = train_step(model, hooks, opt, lr_at(step), B)
            update_bias(model, hooks, hooks.counts)
            for L, c in hooks.counts.items():
                agg_counts[L] = agg_counts[L] + c if L in agg_counts else c.clone()
            step += 1
            tok_seen += B * CTX
            run_lm += float(lm) if step % 10 == 0 or step <= 30 else 0.0
            run_n += 1 if step % 10 == 0 or step <= 30 else 0
            run_aux += float(aux) if step % 10 == 0 else 0.0
            if step == 10:
                t_10 = time.time()
            if step in (30, 200):   # plan the cosine schedule to end at the time budget
                dt = (time.time() - t_10) / (step - 10)
                est = int((deadline - time.time()) / dt * 0.98) + step
                total_steps = min(args.max_steps, max_by_epochs, est)
                log(f"step time {dt * 1000:.0f} ms -> planned steps {total_steps} "
                    f"({total_steps * B * CTX / len(tr_ids):.1f} epochs; max by epochs {max_by_epochs})")
            if step % log_every == 0 or step == 1:
                now = time.time()
                tps = (tok_seen - tok_mark) / max(1e-9, now - t_mark)
                t_mark, tok_mark = now, tok_seen
                ml = run_lm / max(1, run_n)
                curve.append({"step": step, "loss": round(ml, 4), "indexer_kl": round(run_aux / max(1, run_n), 4),
                              "lr": lr_at(step), "tokens": tok_seen, "time_s": round(now - t_train0, 1),
                              "load_max_over_mean": {str(L): round(float(c.max() / c.mean()), 3)
                                                     for L, c in sorted(agg_counts.items())}})
                log(f"step {step:5d} loss {ml:.4f} ikl {run_aux / max(1, run_n):.3f} lr {lr_at(step):.2e} "
                    f"gn {float(gn):.2f} tok/s {tps:,.0f} load max/mean {loads_str(agg_counts)}")
                run_lm, run_aux, run_n, agg_counts = 0.0, 0.0, 0, {}
            if step % val_every == 0:
                do_val(step)
        do_val(step)
    except Exception:
        train_error = traceback.format_exc()
        log("TRAINING ERROR (exporting what was trained):\n" + train_error)
    t_train = time.time() - t_train0
    if best["state"] is not None and best["step"] != step:
        log(f"restoring best-validation weights from step {best['step']}")
        model.load_state_dict(best["state"])
    final_bias = {str(L): [round(float(x), 5) for x in model.model.layers[L].mlp.gate.e_score_correction_bias]
                  for L in hooks.routed}
    results["training"] = {
        "steps": step, "tokens": tok_seen, "batch": B, "ctx": CTX + 1, "seconds": round(t_train, 1),
        "epochs": round(tok_seen / len(tr_ids), 2), "parameters": nparam,
        "final_train_loss_last_logged": curve[-1]["loss"] if curve else None,
        "best_val_loss": best["val"], "best_val_step": best["step"], "val_curve": val_curve,
        "error": train_error, "indexer_loss_active": state["indexer_loss"], "gate_bias": final_bias,
        "lr": args.lr, "warmup": args.warmup, "planned_steps": total_steps,
    }
    with open(os.path.join(bundle, "training_log.json"), "w") as f:
        json.dump({"curve": curve, "val_curve": val_curve}, f, indent=0)
    del best["state"]

    # ---- export, reload the dequantized weights, evaluate
    try:
        log("export")
        hooks.remove()
        model.eval()
        entries, eff, names = export(model, cfg, bundle, SP["shards"])
        sizes = {n: os.path.getsize(os.path.join(bundle, n)) for n in sorted(os.listdir(bundle))}
        log("bundle files:", sizes, "total", sum(sizes.values()))
        results["bundle_sizes"] = sizes
        set_tf32(False)
        # master (pre-quantization) weights, for comparison
        mt, mc = eval_windows(model, held_w, device)
        results["heldout_master_fp32"] = {"nll_per_token": mt / mc, "ppl": math.exp(mt / mc)}
        log(f"held-out ppl, fp32 master weights: {math.exp(mt / mc):.4f}")
        model.cpu()
        m_cpu, m_dev = load_exported(cfg, eff, device)
        ev_hooks = Hooks(m_dev, False)
        tot, cnt, per = eval_windows(m_dev, held_w, device, per_window=True)
        ppl = math.exp(tot / cnt)
        loads = layer_loads(ev_hooks.counts)
        ev_hooks.remove()
        log(f"HELD-OUT PPL (transformers, exported quantized weights, fp32, TF32 off): {ppl:.4f} "
            f"over {cnt} tokens in {len(held_w)} windows")
        log("held-out expert load max/mean:", {L: round(v["max_over_mean"], 3) for L, v in loads.items()})
        results["heldout"] = {"ppl": ppl, "nll_per_token": tot / cnt, "tokens": cnt, "windows": len(held_w),
                              "expert_load": loads}
        greedy = []
        for text in ["And God said", "In the beginning", "The LORD is my shepherd", "Jesus wept."]:
            p = [BOS] + enc(text)
            toks, top, gaps = greedy_full(m_dev, p, 20, device)
            cached = greedy_cached(m_dev, m_dev.config, p, 20, device)
            greedy.append({"prompt": text, "prompt_ids": p, "tokens": toks,
                           "text": tok.decode(toks, skip_special_tokens=False),
                           "top1_logit": [round(x, 5) for x in top], "top1_top2_gap": [round(x, 5) for x in gaps],
                           "cached_decode_agrees": cached == toks})
            log(f"greedy {text!r} -> {greedy[-1]['text']!r} (cached agrees {cached == toks}, min gap {min(gaps):.4f})")
        ref = {
            "model": "models/kjv (DeepSeek-V4 architecture, trained on the KJV Bible)",
            "generator": "tools/train_bundled.py",
            "compute": "transformers DeepseekV4ForCausalLM %s, torch %s, float32, TF32 off, eager, %s, weights = "
                       "the exported files dequantized (FP8*scale, FP4*scale, BF16->F32)"
                       % (transformers.__version__, torch.__version__,
                          torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu"),
            "perplexity": {
                "text": "models/kjv/heldout.txt",
                "procedure": "ids = tokenizer.encode(text) without special tokens; consecutive non-overlapping "
                             "windows of 512 tokens (last may be shorter; dropped if < 2 tokens); each window is "
                             "evaluated independently as [BOS=0] + window; NLL summed over the predictions of all "
                             "window tokens (window token 0 is predicted from BOS); ppl = exp(total NLL / count)",
                "window": CTX, "tokens": cnt, "windows": len(held_w), "nll_sum": tot, "nll_per_token": tot / cnt,
                "ppl": ppl, "window_nll": per, "window_tokens": [len(w) for w in held_w],
                "heldout_ids_head": he_ids[:64],
            },
            "ppl_fp32_master_weights_before_quantization": math.exp(mt / mc),
            "expert_load_heldout": {L: {"max_over_mean": v["max_over_mean"], "min_over_mean": v["min_over_mean"]}
                                    for L, v in loads.items()},
            "greedy": greedy,
        }
        with open(os.path.join(bundle, "reference.json"), "w") as f:
            json.dump(gf.json_clean(ref), f, indent=1)
            f.write("\n")
        results["greedy"] = greedy
    except Exception:
        results["export_error"] = traceback.format_exc()
        log("EXPORT/EVAL ERROR:\n" + results["export_error"])
        try:   # keep the trained weights: bf16 state dict in <= 15 MB parts
            buf = io.BytesIO()
            torch.save({k: (v.to(torch.bfloat16) if v.is_floating_point() else v).cpu()
                        for k, v in model.state_dict().items()}, buf)
            b = buf.getvalue()
            for i in range(0, len(b), 15_000_000):
                with open(os.path.join(args.out, f"weights_bf16.pt.part{i // 15_000_000}"), "wb") as f:
                    f.write(b[i:i + 15_000_000])
        except Exception:
            traceback.print_exc()

    # ---- pack
    results["elapsed_s"] = round(time.time() - T_START, 1)
    with open(os.path.join(bundle, "results.json"), "w") as f:
        json.dump(gf.json_clean(results), f, indent=1)
    big = [n for n in os.listdir(bundle) if n.endswith(".safetensors")]
    for n in big:
        os.replace(os.path.join(bundle, n), os.path.join(args.out, n))
    with tarfile.open(os.path.join(args.out, "bundle.tar.gz"), "w:gz") as tf:
        for n in sorted(os.listdir(bundle)):
            tf.add(os.path.join(bundle, n), arcname=n)
    import shutil
    shutil.rmtree(bundle, ignore_errors=True)
    log("packed; out:", sorted(os.listdir(args.out)))
    # transformers' own loader on the exported files (official config + FP8/FP4 tensors), when time allows
    if "export_error" not in results and time.time() < T_START + args.budget - 40:
        try:
            import tempfile
            with tempfile.TemporaryDirectory() as td:
                with tarfile.open(os.path.join(args.out, "bundle.tar.gz")) as tf:
                    tf.extractall(td)
                for n in big:
                    os.symlink(os.path.abspath(os.path.join(args.out, n)), os.path.join(td, n))
                chk = gf.checks("kjv", SP, td, cfg, m_cpu, eff, entries, {})
        except Exception:
            chk = {"error": traceback.format_exc()[-3000:]}
        with open(os.path.join(args.out, "checks.json"), "w") as f:
            json.dump(gf.json_clean(chk), f, indent=1)
    log("done; out:", sorted(os.listdir(args.out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
