"""kernel_cost.py — the global-memory bytes (and FLOPs) of each hand-written kernel, from the arguments the emulator's
work log records for its launch (SIMT_WORKLOG, test/simt/counters.h: pointers as true/false, integers and floats by
value). predict.py costs a kernel at bytes / (HBM x HBM_FRACTION); a kernel without a formula here costs its minimum
launch time only ("no formula" in predict's table). Python 3, standard library only.
"""
import re


def _ln_bytes(a):   # layernorm_forward_kernel(out, resid, mean, rstd, inp, add, weight, N, C, eps): BF16 rows
    N, C = a[7], a[8]
    return 2 * N * C * (2 + (1 if a[5] else 0) + (1 if a[1] else 0)) + 2 * C + 8 * N


# Global-memory bytes of a kernel from its logged arguments (a: the list, pointers as true/false), by the kernel's
# name without template arguments: what each thread reads and writes once (no L2 reuse counted)
KERNELS = {
    "adamw_kernel": lambda a: 30 * a[5],            # (param, param_bf16, grad, m, v, n, ...): p, m, v r+w 24, grad 4, bf16 2
    "grad_sumsq_kernel": lambda a: 4 * a[2],        # (partial, grad, n)
    "swiglu_forward_kernel": lambda a: 6 * a[3],    # (a, g, u, n): g, u read, a written, BF16
    "swiglu_backward_kernel": lambda a: 10 * a[5],  # (dg, du, da, g, u, n): 3 read, 2 written
    "zero_f32_to_bf16_kernel": lambda a: 6 * a[2],  # (out, in, n)
    "layernorm_forward_kernel": _ln_bytes,
    "classifier_fused_kernel": None,                # (logits, losses, targets, V, dloss, write_grad): needs N = grid.x
}


def kernel_bytes(item, ctx=None):
    base = re.sub(r"<.*", "", item["name"]).strip()
    a = item.get("args") or []
    try:
        if base == "adamw_multi_kernel":   # its segments' sizes are on the device: the step's gradient-norm pass
            n = (ctx or {}).get("shard_n")  # (grad_sumsq_kernel over the whole shard) gives their sum, padding included
            return 30 * n if n else None
        if base == "classifier_fused_kernel":
            N, V = item["grid"][0], a[3]
            return 2 * N * V * (2 if a[5] else 1) + 8 * N
        f = KERNELS.get(base)
        return f(a) if f else None
    except (IndexError, TypeError):
        return None
