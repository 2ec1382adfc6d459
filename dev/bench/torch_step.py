"""torch_step.py -- tokens/s of one full float32 training step of a PyTorch DBRX, the baseline for
dev/bench/bench_step.cpp (the CPU backend). Same model as /work/shared/dbrx-reference.md, written for
speed rather than as an oracle:

  x = wte[inputs]                                         (B, T, d)
  per block:
    h = layer_norm(x, norm_1)                             no bias, eps 1e-5
    qkv = clamp(h @ Wqkv^T, +-clip_qkv)                   (B, T, (H + 2 KV) hd)
    q, k = NeoX RoPE (rotate_half) of the Q and K heads   one pass over the H + KV heads
    causal GQA attention without repeating K/V: q is grouped as (B*KV, group*T, hd) against
      k, v (B*KV, T, hd); scores = baddbmm(causal bias, q, k^T, alpha=1/sqrt(hd)), softmax, @ v
      (torch 1.13 has no scaled_dot_product_attention)
    x = x + a @ Wo^T
    h = layer_norm(x, norm_2)                             (N, d), N = B*T
    p = softmax(h @ Wr^T); w, e = topk(p, k); w /= sum(w)
    dropless experts: the N*k (token, slot) pairs sorted by expert; per expert only its rows:
      ye_e = (silu(xe_e @ w1_e^T) * (xe_e @ v1_e^T)) @ w2_e
    y[t] = sum_j w[t, j] * ye[row(t, j)]                  (N, 1, k) bmm (N, k, d)
    x = x + y
  logits = layer_norm(x, norm_f) @ lm_head^T; loss = cross_entropy + MegaBlocks LBL (weight 0.05)
Step = zero_grad(set_to_none) + forward + backward + clip_grad_norm_(1.0) + AdamW (lr 2e-3, betas
0.9/0.95, eps 1e-8, weight decay 0.1 on matrices only), timed with time.perf_counter. Prints the
median and one last line:  RESULT impl=pytorch tok_per_s=<x> ms_per_step=<y>

  /usr/bin/python3 dev/bench/torch_step.py --threads 2   (defaults: dbrx-tiny, batch 8, seq 256)
"""
import argparse
import math
import statistics
import sys
import time

import torch
import torch.nn.functional as F


class Dbrx(torch.nn.Module):
    def __init__(self, a):
        super().__init__()
        self.a = a
        d, E, Fh, hd = a.d_model, a.experts, a.ffn_hidden, a.d_model // a.n_heads
        qd = d + 2 * a.kv_heads * hd

        def mat(rows, cols):
            return torch.nn.Parameter(torch.randn(rows, cols) * a.init_std)

        def vec(n):
            return torch.nn.Parameter(torch.ones(n))

        self.wte = mat(a.vocab, d)
        self.norm1 = torch.nn.ParameterList([vec(d) for _ in range(a.n_layers)])
        self.wqkv = torch.nn.ParameterList([mat(qd, d) for _ in range(a.n_layers)])
        self.wo = torch.nn.ParameterList([mat(d, d) for _ in range(a.n_layers)])
        self.norm2 = torch.nn.ParameterList([vec(d) for _ in range(a.n_layers)])
        self.router = torch.nn.ParameterList([mat(E, d) for _ in range(a.n_layers)])
        self.w1 = torch.nn.ParameterList([mat(E * Fh, d) for _ in range(a.n_layers)])
        self.v1 = torch.nn.ParameterList([mat(E * Fh, d) for _ in range(a.n_layers)])
        self.w2 = torch.nn.ParameterList([mat(E * Fh, d) for _ in range(a.n_layers)])
        self.norm_f = vec(d)
        self.lm_head = mat(a.vocab, d)
        # RoPE tables (T, hd): cos/sin of each half repeated, computed in fp32
        T = a.seq
        inv_freq = a.rope_theta ** (-torch.arange(0, hd // 2, dtype=torch.float64) * 2.0 / hd)
        ang = (torch.arange(T, dtype=torch.float64)[:, None] * inv_freq[None, :]).float()
        self.cos = torch.cat([ang.cos(), ang.cos()], dim=-1)[None, :, None, :]   # (1, T, 1, hd)
        self.sin = torch.cat([ang.sin(), ang.sin()], dim=-1)[None, :, None, :]
        # additive causal mask for the grouped queries: (group*T, T), 0 or -inf
        group = a.n_heads // a.kv_heads
        causal = torch.full((T, T), float("-inf")).triu(1)
        self.causal_bias = causal.repeat(group, 1)

    def attention(self, l, x):
        a = self.a
        B, T, d = x.shape
        H, KV, hd = a.n_heads, a.kv_heads, d // a.n_heads
        group = H // KV
        h = F.layer_norm(x, (d,), self.norm1[l], None, a.ln_eps)
        qkv = F.linear(h, self.wqkv[l])
        if a.clip_qkv > 0:
            qkv = qkv.clamp(-a.clip_qkv, a.clip_qkv)
        qk = qkv[..., :(H + KV) * hd].view(B, T, H + KV, hd)
        half = hd // 2
        rot = torch.cat([-qk[..., half:], qk[..., :half]], dim=-1)   # rotate_half
        qk = qk * self.cos + rot * self.sin
        q = qk[:, :, :H].reshape(B, T, KV, group, hd).permute(0, 2, 3, 1, 4).reshape(B * KV, group * T, hd)
        k = qk[:, :, H:].permute(0, 2, 1, 3).reshape(B * KV, T, hd)
        v = qkv[..., (H + KV) * hd:].view(B, T, KV, hd).permute(0, 2, 1, 3).reshape(B * KV, T, hd)
        s = torch.baddbmm(self.causal_bias, q, k.transpose(1, 2), alpha=1.0 / math.sqrt(hd))
        p = torch.softmax(s, dim=-1)
        y = torch.bmm(p, v)                                           # (B*KV, group*T, hd)
        y = y.view(B, KV, group, T, hd).permute(0, 3, 1, 2, 4).reshape(B, T, d)   # head = kvh*group + g
        return x + F.linear(y, self.wo[l])

    def moe(self, l, x):
        a = self.a
        B, T, d = x.shape
        N, E, k, Fh = B * T, a.experts, a.top_k, a.ffn_hidden
        h = F.layer_norm(x, (d,), self.norm2[l], None, a.ln_eps).view(N, d)
        p = torch.softmax(F.linear(h, self.router[l]), dim=-1)       # (N, E)
        topw, topi = torch.topk(p, k, dim=-1)                          # (N, k)
        topw = topw / topw.sum(dim=-1, keepdim=True)
        flat = topi.reshape(-1)                                        # slot t*k+j -> expert
        order = torch.argsort(flat, stable=True)                       # grouped row -> slot
        counts = torch.bincount(flat, minlength=E)
        xe = h.index_select(0, order // k)                             # (N*k, d), expert-major
        w1 = self.w1[l].view(E, Fh, d).unbind(0)
        v1 = self.v1[l].view(E, Fh, d).unbind(0)
        w2 = self.w2[l].view(E, Fh, d).unbind(0)
        ys = []
        for e, xs in enumerate(torch.split(xe, counts.tolist())):
            if xs.shape[0] == 0:
                continue
            ys.append(torch.mm(F.silu(F.linear(xs, w1[e])) * F.linear(xs, v1[e]), w2[e]))
        ye = torch.cat(ys)                                             # (N*k, d)
        inv = torch.empty_like(order)
        inv[order] = torch.arange(order.numel())                       # slot -> grouped row
        y = torch.bmm(topw.unsqueeze(1), ye.index_select(0, inv).view(N, k, d)).view(B, T, d)
        # MegaBlocks LBL term of this layer (weight applied by the caller): sum_e c[e] * P[e]
        lbl = (counts.to(p.dtype) * p.mean(dim=0)).sum()
        return x + y, lbl

    def forward(self, inputs, targets):
        a = self.a
        B, T = inputs.shape
        N = B * T
        x = F.embedding(inputs, self.wte)
        lbl = 0.0
        for l in range(a.n_layers):
            x = self.attention(l, x)
            x, lbl_l = self.moe(l, x)
            lbl = lbl + lbl_l
        h = F.layer_norm(x, (a.d_model,), self.norm_f, None, a.ln_eps)
        logits = F.linear(h, self.lm_head)
        ce = F.cross_entropy(logits.view(N, -1), targets.view(N))
        lbl = a.moe_loss_weight * a.experts / (a.n_layers * N * a.top_k) * lbl
        return ce, lbl


def int_at_least(lo):
    def parse(s):
        try:
            v = int(s)
        except ValueError:
            raise argparse.ArgumentTypeError("expects an integer, got %r" % s)
        if v < lo:
            raise argparse.ArgumentTypeError("must be >= %d, got %d" % (lo, v))
        return v
    return parse


positive_int, nonneg_int = int_at_least(1), int_at_least(0)


def main():
    ap = argparse.ArgumentParser(description="PyTorch DBRX training-step benchmark (defaults: dbrx-tiny)")
    ap.add_argument("--d-model", type=positive_int, default=128)
    ap.add_argument("--n-heads", type=positive_int, default=4)
    ap.add_argument("--kv-heads", type=positive_int, default=2)
    ap.add_argument("--n-layers", type=positive_int, default=4)
    ap.add_argument("--ffn-hidden", type=positive_int, default=224)
    ap.add_argument("--experts", type=positive_int, default=16)
    ap.add_argument("--top-k", type=positive_int, default=4)
    ap.add_argument("--vocab", type=positive_int, default=384)
    ap.add_argument("--batch", type=positive_int, default=8)
    ap.add_argument("--seq", type=positive_int, default=256)
    ap.add_argument("--steps", type=positive_int, default=10)
    ap.add_argument("--warmup-steps", type=nonneg_int, default=2)
    ap.add_argument("--threads", type=positive_int, default=torch.get_num_threads())
    ap.add_argument("--seed", type=nonneg_int, default=1337)
    ap.add_argument("--rope-theta", type=float, default=10000.0)
    ap.add_argument("--clip-qkv", type=float, default=8.0)
    ap.add_argument("--ln-eps", type=float, default=1e-5)
    ap.add_argument("--moe-loss-weight", type=float, default=0.05)
    ap.add_argument("--init-std", type=float, default=0.02)
    ap.add_argument("--no-foreach", action="store_true", help="AdamW without the multi-tensor (foreach) path")
    a = ap.parse_args()   # a bad flag: argparse prints usage and the error, exit 2
    if a.d_model % a.n_heads or a.n_heads % a.kv_heads or (a.d_model // a.n_heads) % 2 or a.top_k > a.experts:
        print("error: inconsistent shapes (d_model %d, n_heads %d, kv_heads %d, top_k %d, experts %d)"
              % (a.d_model, a.n_heads, a.kv_heads, a.top_k, a.experts), file=sys.stderr)
        sys.exit(2)

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    model = Dbrx(a)
    decay = [p for n, p in model.named_parameters() if p.dim() == 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=2e-3, betas=(0.9, 0.95), eps=1e-8, foreach=not a.no_foreach)
    nparams = sum(p.numel() for p in model.parameters())
    B, T = a.batch, a.seq
    print("torch_step: torch %s, %d thread(s) (OpenMP %s); d %d, heads %d, kv %d, layers %d, ffn %d, experts %d top-%d, "
          "vocab %d, %.2fM params; batch %d x seq %d = %d tokens/step; %d warmup + %d timed steps"
          % (torch.__version__, torch.get_num_threads(), "on" if torch.backends.openmp.is_available() else "off",
             a.d_model, a.n_heads, a.kv_heads, a.n_layers, a.ffn_hidden, a.experts, a.top_k, a.vocab, nparams / 1e6,
             B, T, B * T, a.warmup_steps, a.steps))

    gen = torch.Generator().manual_seed(a.seed ^ 0xB0BA7E57)
    times, tf, tb, tu = [], [], [], []
    for s in range(a.warmup_steps + a.steps):
        seq = torch.randint(0, a.vocab, (B, T + 1), generator=gen)   # untimed
        inputs, targets = seq[:, :T].contiguous(), seq[:, 1:].contiguous()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        ce, lbl = model(inputs, targets)
        t1 = time.perf_counter()
        (ce + lbl).backward()
        t2 = time.perf_counter()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        t3 = time.perf_counter()
        timed = s >= a.warmup_steps
        print("%s %3d | loss %.4f | lbl %.5f | gnorm %.3f | %8.2f ms (fwd %.2f, bwd %.2f, update %.2f)"
              % ("step  " if timed else "warmup", s - a.warmup_steps + 1 if timed else s + 1, float(ce), float(lbl),
                 float(gnorm), (t3 - t0) * 1e3, (t1 - t0) * 1e3, (t2 - t1) * 1e3, (t3 - t2) * 1e3))
        if timed:
            times.append(t3 - t0); tf.append(t1 - t0); tb.append(t2 - t1); tu.append(t3 - t2)
    med = statistics.median(times)
    print("median of %d steps: %.2f ms/step (zero_grad+fwd %.2f, bwd %.2f, update %.2f), %.1f tok/s"
          % (a.steps, med * 1e3, statistics.median(tf) * 1e3, statistics.median(tb) * 1e3,
             statistics.median(tu) * 1e3, B * T / med))
    print("RESULT impl=pytorch tok_per_s=%.1f ms_per_step=%.3f" % (B * T / med, med * 1e3))


if __name__ == "__main__":
    main()
