# Parity test: C++ DBRX engine vs the independent float64 PyTorch reference (dbrx_torch_reference.py).
#
# Usage: /usr/bin/python3 test/test_pytorch_parity.py DUMPFILE
#
# Checks, one output line each, then "N passed, M failed":
#   - every expected record is present (inputs, targets, every weight, logits, ce_loss, lbl_loss,
#     z_loss, grad/<weight> for every weight, train_ce, train_lbl) and no unexpected record exists
#     (so every weight in the dump has a grad record), with the expected shapes;
#   - logits, ce_loss, lbl_loss, z_loss and every grad/<name>: per-tensor relative error
#         rel = max|ours - ref| / max(max|ref|, 1e-30)  <=  1e-4
#   - train_ce, train_lbl: every step within 1e-5 absolute of the reference's AdamW run; lion_ce, lion_lbl the same
#     against its LionW run (--optimizer lion, at the config's lion_lr);
#   - RoPE at DBRX's shape (head_dim 128, theta 5e5), against the original DBRX code's own computation in
#     torch fp32 (inv_freq = 1 / (theta ** (arange(0, hd, 2).float() / hd)), angle = inv_freq @ position,
#     cos/sin in fp32): every inv_freq bit-identical; cos and sin at positions 0..32767 within one fp32
#     ulp and 1.2e-7 absolute (2^-23: torch's fp32 cos/sin are not correctly rounded, ours are).
# The config's moe_normalize_expert_weights (a p, or null: no renormalisation; absent: 1) is the model's.
# Exit status: 0 all passed, 1 some check failed, 2 unreadable/bad dump file or bad usage.
import json
import os
import struct
import sys

import numpy as np
import torch

sys.dont_write_bytecode = True  # keep test/ free of __pycache__
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dbrx_torch_reference as ref  # noqa: E402

REL_TOL = 1e-4
TRAIN_ABS_TOL = 1e-5
ROPE_HD, ROPE_THETA = 128, 500000.0
ROPE_ABS_TOL = 2.0 ** -23
CONFIG_KEYS = ["d_model", "n_heads", "kv_heads", "head_dim", "n_layers", "ffn_hidden", "n_experts",
               "top_k", "vocab_size", "rope_theta", "clip_qkv", "ln_eps", "moe_loss_weight",
               "z_loss_weight", "B", "T", "lr", "warmup_steps", "train_steps", "lr_floor_frac",
               "beta1", "beta2", "adam_eps", "weight_decay", "grad_clip"]


def main(argv):
    if len(argv) != 2:
        print("usage: %s DUMPFILE" % argv[0])
        return 2
    try:
        dump = ref.read_dump(argv[1])
        if "config" not in dump or not isinstance(dump["config"], str):
            raise ref.DumpError("no text 'config' record")
        cfg = json.loads(dump["config"])
        missing = [k for k in CONFIG_KEYS if k not in cfg]
        if missing:
            raise ref.DumpError("config lacks keys: %s" % ", ".join(missing))
    except (OSError, ValueError, UnicodeDecodeError, struct.error, ref.DumpError) as e:
        print("error: cannot read dump %s: %s" % (argv[1], e))
        return 2

    passed, failed = [0], [0]

    def report(ok, name, msg):
        print("%s %s  %s" % ("ok  " if ok else "FAIL", name, msg))
        (passed if ok else failed)[0] += 1

    B, T, V = cfg["B"], cfg["T"], cfg["vocab_size"]
    shapes = ref.weight_shapes(cfg)
    wnames = [n for n, _ in shapes]
    expected = {"inputs": (B, T), "targets": (B, T)}
    expected.update(shapes)
    expected.update({"logits": (B, T, V), "ce_loss": (1,), "lbl_loss": (1,), "z_loss": (1,)})
    expected.update({"grad/" + n: s for n, s in shapes})
    expected.update({"train_ce": (cfg["train_steps"],), "train_lbl": (cfg["train_steps"],)})
    if "lion_lr" in cfg:
        expected.update({"lion_ce": (cfg["train_steps"],), "lion_lbl": (cfg["train_steps"],)})
    n_pos = dump["rope/positions"].shape[0] if "rope/positions" in dump and not isinstance(dump["rope/positions"], str) else 0
    expected.update({"rope/inv_freq": (ROPE_HD // 2,), "rope/positions": (n_pos,), "rope/cos": (n_pos, ROPE_HD // 2),
                     "rope/sin": (n_pos, ROPE_HD // 2)})

    # --- presence and shapes ---
    bad = set()
    for name, shape in expected.items():
        if name not in dump:
            report(False, name, "missing record")
            bad.add(name)
        elif isinstance(dump[name], str) or tuple(dump[name].shape) != tuple(shape):
            got = "text" if isinstance(dump[name], str) else tuple(dump[name].shape)
            report(False, name, "shape %s, expected %s" % (got, tuple(shape)))
            bad.add(name)
    for name in dump:
        if name != "config" and name not in expected:
            why = "grad of unknown weight" if name.startswith("grad/") else "unexpected record (weight without grad?)"
            report(False, name, why)
    for name in ("inputs", "targets"):
        if name not in bad and (dump[name].min() < 0 or dump[name].max() >= V):
            report(False, name, "token id out of range [0, %d)" % V)
            bad.add(name)
    needed = ["inputs", "targets"] + wnames
    if any(n in bad for n in needed):
        report(False, "reference", "not computed: inputs, targets or weights missing/malformed")
        print("%d passed, %d failed" % (passed[0], failed[0]))
        return 1

    # --- forward / backward at the initial weights (float64) ---
    torch.set_grad_enabled(True)
    stats = {}
    params = ref.params_from_dump(dump, cfg)
    logits, ce, lbl, z, grads = ref.loss_and_grads(params, cfg, dump["inputs"], dump["targets"], stats)
    print("info moe_normalize_expert_weights %s; router min top-k probability margin %.3g (near 0: expert choice may "
          "differ by rounding)" % (cfg.get("moe_normalize_expert_weights", 1.0), stats["topk_margin"]))

    def compare(name, r):
        if name in bad:
            return
        ours = np.asarray(dump[name], dtype=np.float64)
        r = np.asarray(r, dtype=np.float64).reshape(ours.shape)
        err = float(np.max(np.abs(ours - r))) if ours.size else 0.0
        rel = err / max(float(np.max(np.abs(r))) if r.size else 0.0, 1e-30)
        ok = bool(rel <= REL_TOL)  # NaN -> fail
        report(ok, name, "rel %.2e" % rel + ("" if ok else " (max abs err %.3e, tol %.0e)" % (err, REL_TOL)))

    compare("logits", logits.numpy())
    compare("ce_loss", ce.numpy())
    compare("lbl_loss", lbl.numpy())
    compare("z_loss", z.numpy())
    for n in wnames:
        compare("grad/" + n, grads[n].numpy())

    # --- AdamW steps on the same batch (and LionW's) ---
    runs = [("adamw", "train_ce", "train_lbl")] + ([("lion", "lion_ce", "lion_lbl")] if "lion_lr" in cfg else [])
    for opt, ce_name, lbl_name in runs:
        if ce_name in bad and lbl_name in bad:
            continue
        params = ref.params_from_dump(dump, cfg)
        ces, lbls = ref.train_steps(params, cfg, dump["inputs"], dump["targets"], optimizer=opt)
        for name, r in ((ce_name, ces), (lbl_name, lbls)):
            if name in bad:
                continue
            ours = np.asarray(dump[name], dtype=np.float64)
            diff = np.abs(ours - np.asarray(r))
            worst = int(np.nanargmax(diff)) if diff.size and not np.all(np.isnan(diff)) else 0
            ok = bool(np.all(diff <= TRAIN_ABS_TOL))
            msg = "max abs %.2e over %d steps" % (float(np.max(diff)) if diff.size else 0.0, diff.size)
            if not ok:
                first = int(np.argmax(~(diff <= TRAIN_ABS_TOL)))
                msg += " (first bad step %d: ours %.8g ref %.8g; worst step %d; tol %.0e)" % (
                    first, ours[first], r[first], worst, TRAIN_ABS_TOL)
            report(ok, name, msg)

    # --- RoPE tables against the original DBRX code's fp32 computation ---
    if not any(n in bad for n in ("rope/inv_freq", "rope/positions", "rope/cos", "rope/sin")):
        check_rope(dump, report)

    print("%d passed, %d failed" % (passed[0], failed[0]))
    return 1 if failed[0] else 0


def check_rope(dump, report):
    """The inv_freq and cos/sin tables as DbrxRotaryEmbedding computes them (fp32 throughout)."""
    hd, theta = ROPE_HD, ROPE_THETA
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
    pos = torch.as_tensor(np.asarray(dump["rope/positions"], dtype=np.int64))
    freqs = (inv[None, :, None].float() @ pos[None, None, :].float()).transpose(1, 2)[0]   # [P, hd/2], fp32
    cos, sin = freqs.cos().numpy(), freqs.sin().numpy()
    ours = np.asarray(dump["rope/inv_freq"], dtype=np.float32)
    differ = int(np.sum(ours.view(np.int32) != inv.numpy().view(np.int32)))
    report(differ == 0, "rope/inv_freq", "hd %d, theta %g: %d of %d frequencies differ from torch fp32 (bit for bit)"
           % (hd, theta, differ, hd // 2))
    for name, ref in (("rope/cos", cos), ("rope/sin", sin)):
        got = np.asarray(dump[name], dtype=np.float32)
        err = float(np.max(np.abs(got.astype(np.float64) - ref.astype(np.float64))))
        # ulps apart where both have the same sign (across 0 the absolute bound alone applies)
        same = (np.signbit(got) == np.signbit(ref))
        dist = np.abs(got.view(np.int32).astype(np.int64) - ref.view(np.int32).astype(np.int64))
        ulps = int(np.max(np.where(same, dist, 0)))
        ok = err <= ROPE_ABS_TOL and ulps <= 1
        report(ok, name, "positions %d..%d: max |ours - torch fp32| %.2e (tol %.2e), max %d ulp"
               % (int(pos.min()), int(pos.max()), err, ROPE_ABS_TOL, ulps))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
