# Independent PyTorch reference of the DBRX Mixture-of-Experts transformer, written only from the
# DBRX specification (the public model card, config and modeling facts) plus the test conventions, WITHOUT reading the C++
# engine. It is a test oracle: it reads a dump written by the C++ side (weights, batch, results),
# recomputes forward, losses, gradients and a few AdamW steps in float64, and the parity script
# (test_pytorch_parity.py) compares the two.
#
# Dump format (little-endian): b"DBRXDUMP", then records until EOF:
#   int32 name_len, name (utf-8), int32 dtype (0=f32, 1=i32, 2=f64, 3=utf-8 text), int32 ndim,
#   int64 dims[ndim], raw data (prod(dims) elements; text: ndim=1, dims[0] = byte length).
import json
import math
import struct

import numpy as np
import torch
import torch.nn.functional as F

MAGIC = b"DBRXDUMP"
_DTYPES = {0: np.float32, 1: np.int32, 2: np.float64}


class DumpError(Exception):
    pass


def read_dump(path):
    """Returns an ordered dict name -> numpy array (dtypes 0..2) or str (dtype 3)."""
    with open(path, "rb") as f:
        buf = f.read()
    if buf[:8] != MAGIC:
        raise DumpError("bad magic (not a DBRXDUMP file)")
    out, pos = {}, 8

    def take(n):
        nonlocal pos
        if n < 0 or pos + n > len(buf):
            raise DumpError("truncated record at byte %d" % pos)
        pos += n
        return buf[pos - n:pos]

    while pos < len(buf):
        (nlen,) = struct.unpack("<i", take(4))
        name = take(nlen).decode("utf-8")
        if name in out:
            raise DumpError("duplicate record %r" % name)
        dtype, ndim = struct.unpack("<ii", take(8))
        if ndim < 0 or ndim > 16:
            raise DumpError("record %r: bad ndim %d" % (name, ndim))
        dims = struct.unpack("<%dq" % ndim, take(8 * ndim))
        if any(d < 0 for d in dims):
            raise DumpError("record %r: negative dim" % name)
        count = int(np.prod(dims)) if ndim else 1
        if dtype == 3:
            out[name] = take(count).decode("utf-8")
        elif dtype in _DTYPES:
            dt = np.dtype(_DTYPES[dtype]).newbyteorder("<")
            out[name] = np.frombuffer(take(count * dt.itemsize), dtype=dt).reshape(dims).astype(dt.newbyteorder("="))
        else:
            raise DumpError("record %r: unknown dtype %d" % (name, dtype))
    return out


def load_config(dump):
    return json.loads(dump["config"])


def weight_shapes(cfg):
    """HF DbrxForCausalLM parameter names and shapes, in a fixed order."""
    d, V, E, Fh = cfg["d_model"], cfg["vocab_size"], cfg["n_experts"], cfg["ffn_hidden"]
    qkv = d + 2 * cfg["kv_heads"] * cfg["head_dim"]
    shapes = [("transformer.wte.weight", (V, d))]
    for i in range(cfg["n_layers"]):
        b = "transformer.blocks.%d." % i
        shapes += [(b + "norm_attn_norm.norm_1.weight", (d,)),
                   (b + "norm_attn_norm.attn.Wqkv.weight", (qkv, d)),
                   (b + "norm_attn_norm.attn.out_proj.weight", (d, d)),
                   (b + "norm_attn_norm.norm_2.weight", (d,)),
                   (b + "ffn.router.layer.weight", (E, d)),
                   (b + "ffn.experts.mlp.w1", (E * Fh, d)),
                   (b + "ffn.experts.mlp.v1", (E * Fh, d)),
                   (b + "ffn.experts.mlp.w2", (E * Fh, d))]
    shapes += [("transformer.norm_f.weight", (d,)), ("lm_head.weight", (V, d))]
    return shapes


def rope(x, theta):
    """NeoX (rotate_half) RoPE on x [B, heads, T, hd]; positions 0..T-1 of each sequence."""
    T, hd = x.shape[2], x.shape[3]
    inv_freq = theta ** (-torch.arange(0, hd // 2, dtype=torch.float64) * 2.0 / hd)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq[None, :]  # [T, hd/2]
    cos, sin = torch.cos(ang).to(x.dtype), torch.sin(ang).to(x.dtype)
    x1, x2 = x[..., :hd // 2], x[..., hd // 2:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def stable_topk(p, k):
    """Top-k along the last dim, ties broken towards the lower index (stable sort on -p)."""
    _, idx = torch.sort(-p.detach(), dim=-1, stable=True)
    return idx[..., :k]


def forward(params, cfg, inputs, targets, stats=None):
    """params: name -> tensor (requires_grad as needed); inputs/targets: int [B, T].
    Returns (logits [B,T,V], ce, lbl, z). If stats is a dict, stats["topk_margin"] receives the
    smallest gap between the k-th and (k+1)-th router probability (near-ties make top-k fragile)."""
    d, H, KV, hd = cfg["d_model"], cfg["n_heads"], cfg["kv_heads"], cfg["head_dim"]
    L, E, Fh, k = cfg["n_layers"], cfg["n_experts"], cfg["ffn_hidden"], cfg["top_k"]
    eps, clip = cfg["ln_eps"], cfg["clip_qkv"]
    inputs = torch.as_tensor(np.asarray(inputs)).long()
    targets = torch.as_tensor(np.asarray(targets)).long()
    B, T = inputs.shape
    N = B * T
    x = params["transformer.wte.weight"][inputs]  # [B, T, d]
    causal = torch.ones(T, T, dtype=torch.bool).tril()[None, None]  # [1, 1, T, T]
    eot = cfg.get("doc_mask_eot")
    if eot is not None:
        # --doc-mask: an end-of-text opens a document; query t sees the keys from its document's first token on
        # (LLM Foundry's attn_uses_sequence_id with the separator opening a document rather than closing one)
        pos = torch.arange(T).expand(B, T)
        start = torch.cummax(torch.where(inputs == eot, pos, torch.zeros_like(pos)), dim=1).values  # [B, T]
        causal = causal & (pos[:, None, :] >= start[:, :, None])[:, None]  # [B, 1, T, T]
    lbl_sum, z_sum, margin = 0.0, 0.0, math.inf
    for i in range(L):
        b = "transformer.blocks.%d." % i
        # --- attention ---
        h = F.layer_norm(x, (d,), params[b + "norm_attn_norm.norm_1.weight"], None, eps)
        qkv = h @ params[b + "norm_attn_norm.attn.Wqkv.weight"].t()
        if clip is not None and clip > 0:
            qkv = torch.clamp(qkv, -clip, clip)
        q, kk, v = torch.split(qkv, [H * hd, KV * hd, KV * hd], dim=-1)
        q = q.reshape(B, T, H, hd).transpose(1, 2)    # [B, H, T, hd]
        kk = kk.reshape(B, T, KV, hd).transpose(1, 2)  # [B, KV, T, hd]
        v = v.reshape(B, T, KV, hd).transpose(1, 2)
        q, kk = rope(q, cfg["rope_theta"]), rope(kk, cfg["rope_theta"])
        rep = H // KV  # query head h uses kv head h // rep
        kk, v = kk.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        s = (q @ kk.transpose(-1, -2)) / math.sqrt(hd)
        s = s.masked_fill(~causal, float("-inf"))
        a = torch.softmax(s, dim=-1) @ v                # [B, H, T, hd]
        a = a.transpose(1, 2).reshape(B, T, H * hd)     # head h -> columns h*hd..(h+1)*hd
        x = x + a @ params[b + "norm_attn_norm.attn.out_proj.weight"].t()
        # --- MoE FFN ---
        h = F.layer_norm(x, (d,), params[b + "norm_attn_norm.norm_2.weight"], None, eps).reshape(N, d)
        rlogits = h @ params[b + "ffn.router.layer.weight"].t()  # [N, E]
        p = torch.softmax(rlogits, dim=-1)
        idx = stable_topk(p, k)                                  # [N, k]
        if k < E:
            ps = torch.sort(p.detach(), dim=-1, descending=True).values
            margin = min(margin, float((ps[:, k - 1] - ps[:, k]).min()))
        wk = p.gather(1, idx)
        # moe_normalize_expert_weights: the top-k weights over their p-norm (DBRX: p = 1, i.e. their sum);
        # None (the HF config's null): used as they are
        pn = cfg.get("moe_normalize_expert_weights", 1.0)
        if pn is not None:
            wk = wk / torch.norm(wk, p=float(pn), dim=-1, keepdim=True)
        wdense = torch.zeros_like(p).scatter(1, idx, wk)         # [N, E], zero for unrouted experts
        w1 = params[b + "ffn.experts.mlp.w1"].reshape(E, Fh, d)
        v1 = params[b + "ffn.experts.mlp.v1"].reshape(E, Fh, d)
        w2 = params[b + "ffn.experts.mlp.w2"].reshape(E, Fh, d)
        g = F.silu(torch.einsum("nd,efd->enf", h, w1)) * torch.einsum("nd,efd->enf", h, v1)
        ye = torch.einsum("enf,efd->end", g, w2)                 # every expert on every token
        y = torch.einsum("ne,end->nd", wdense, ye)
        x = x + y.reshape(B, T, d)
        # --- router losses ---
        counts = torch.zeros(E, dtype=p.dtype).scatter_add_(
            0, idx.reshape(-1), torch.ones(N * k, dtype=p.dtype))  # c[l,e], no gradient
        lbl_sum = lbl_sum + (counts * p.mean(dim=0)).sum()
        z_sum = z_sum + (torch.logsumexp(rlogits, dim=-1) ** 2).mean()
    h = F.layer_norm(x, (d,), params["transformer.norm_f.weight"], None, eps)
    logits = h @ params["lm_head.weight"].t()
    ce = F.cross_entropy(logits.reshape(N, -1), targets.reshape(N))
    lbl = cfg["moe_loss_weight"] * E / (L * N * k) * lbl_sum
    z = cfg["z_loss_weight"] / L * z_sum
    if stats is not None:
        stats["topk_margin"] = margin
    return logits, ce, lbl, z


def params_from_dump(dump, cfg, dtype=torch.float64):
    return {n: torch.tensor(np.asarray(dump[n]), dtype=dtype).requires_grad_(True)
            for n, _ in weight_shapes(cfg)}


def loss_and_grads(params, cfg, inputs, targets, stats=None):
    """Forward + backward of the total loss ce + lbl + z. Returns (logits, ce, lbl, z, grads)."""
    for p in params.values():
        p.grad = None
    logits, ce, lbl, z = forward(params, cfg, inputs, targets, stats)
    (ce + lbl + z).backward()
    grads = {n: p.grad.detach().clone() for n, p in params.items()}
    return logits.detach(), ce.detach(), lbl.detach(), torch.as_tensor(z).detach(), grads


def lr_at(s, cfg):
    lr, warm, steps = cfg["lr"], cfg["warmup_steps"], cfg["train_steps"]
    if s < warm:
        return lr * (s + 1) / warm
    decay = (s - warm) / max(1, steps - warm)
    lr_min = lr * cfg["lr_floor_frac"]
    return lr_min + 0.5 * (1.0 + math.cos(math.pi * decay)) * (lr - lr_min)


def train_steps(params, cfg, inputs, targets, steps=None, optimizer="adamw"):
    """AdamW with global-norm clipping on the same batch each step (hand-written, see the brief), or LionW
    (optimizer "lion": Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms", Algorithm 2 with decoupled
    weight decay times lr, at cfg["lion_lr"]). Updates params in place; returns (ce per step, lbl per step), each
    measured before the update."""
    steps = cfg["train_steps"] if steps is None else steps
    b1, b2, eps, wd = cfg["beta1"], cfg["beta2"], cfg["adam_eps"], cfg["weight_decay"]
    m = {n: torch.zeros_like(p) for n, p in params.items()}
    v = {n: torch.zeros_like(p) for n, p in params.items()}
    ces, lbls = [], []
    for s in range(steps):
        _, ce, lbl, _, grads = loss_and_grads(params, cfg, inputs, targets)
        ces.append(float(ce))
        lbls.append(float(lbl))
        norm = math.sqrt(sum(float((g * g).sum()) for g in grads.values()))
        if norm > cfg["grad_clip"]:
            grads = {n: g * (cfg["grad_clip"] / norm) for n, g in grads.items()}
        lr, t = lr_at(s, cfg), s + 1
        if optimizer == "lion":
            lr = lr_at(s, dict(cfg, lr=cfg["lion_lr"]))
            with torch.no_grad():
                for n, p in params.items():
                    g = grads[n]
                    update = torch.sign(b1 * m[n] + (1 - b1) * g)   # the interpolation's sign, then the moment
                    m[n] = b2 * m[n] + (1 - b2) * g
                    wd_p = wd if p.dim() == 2 else 0.0
                    p -= lr * (update + wd_p * p)
            continue
        with torch.no_grad():
            for n, p in params.items():
                g = grads[n]
                m[n] = b1 * m[n] + (1 - b1) * g
                v[n] = b2 * v[n] + (1 - b2) * g * g
                mhat, vhat = m[n] / (1 - b1 ** t), v[n] / (1 - b2 ** t)
                wd_p = wd if p.dim() == 2 else 0.0  # decay 2-D weights only, not LayerNorm weights
                p -= lr * (mhat / (torch.sqrt(vhat) + eps) + wd_p * p)
    return ces, lbls
