#!/usr/bin/env python3
"""hf_logits.py — loads a Hugging Face DBRX export written by train_dbrx (config.json + safetensors in the
DbrxForCausalLM layout and names, BF16 or FP32) and reproduces train_dbrx's logits.

    /usr/bin/python3 dev/hf_logits.py EXPORT_DIR LOGITS.safetensors [--tol X]

LOGITS.safetensors is what `train_dbrx --dump-logits` writes: inputs (I32 [B, T]) and logits
(F32 [B, T, V]) of the first validation batch. The export is read by hand (the safetensors format:
an 8-byte little-endian header length, a JSON header, raw little-endian data; a split export has
model.safetensors.index.json), the model is the project's independent PyTorch DBRX
(test/dbrx_torch_reference.py, written from the specification, in float64), and the script prints the
largest difference of the logits and how many tokens (positions) differ by more than --tol; it exits 1 if more
than --outliers of them do. Needs only Debian's python3-torch.

The default --tol follows the precision the dump records in its __metadata__ ("precision", written by
train_dbrx): fp32 (the CPU backend) 1e-4; bf16 (the CUDA backend) 1e-1, since a token whose router sees
a near-tie can take another expert in BF16 (measured on the emulated GPU: 0.05 at one token of 32, 2e-3 on
average; test/test_zero_gpu.sh); a dump without the field (older train_dbrx) is taken as fp32. The default
--outliers: fp32 none; bf16 2% of the tokens. dbrx-tiny after 20 steps at lr 2e-3, dumped on the emulated GPU, had
21 tokens of 2048 above 1e-1 (the worst 0.60), with a median of 1.2e-2 per token; on an H200, the worst was 0.30.
A model that is wrong, not near a tie, is off at most tokens. An FP8 run's
dump (fp8-<recipe>) has no default: the reference does not emulate FP8, so --tol must be given.
"""
import argparse
import json
import os
import struct
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "test"))
import dbrx_torch_reference as ref  # noqa: E402

_DT = {"F32": np.float32, "F64": np.float64, "I32": np.int32, "I64": np.int64, "F16": np.float16}


DEFAULT_TOL = {"fp32": 1e-4, "bf16": 1e-1}


def read_metadata(path):
    """the __metadata__ object of a safetensors file ({} if none)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n).decode("utf-8")).get("__metadata__", {})


def read_safetensors(path):
    """name -> float64/int64 torch tensor, reading the format by hand."""
    with open(path, "rb") as f:
        buf = f.read()
    (n,) = struct.unpack("<Q", buf[:8])
    header = json.loads(buf[8:8 + n].decode("utf-8"))
    data = buf[8 + n:]
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        b, e = t["data_offsets"]
        raw, shape = data[b:e], tuple(t["shape"])
        if t["dtype"] == "BF16":  # bf16 = the top half of a float32
            u16 = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
            arr = u16.view(np.float32)
        else:
            arr = np.frombuffer(raw, dtype=np.dtype(_DT[t["dtype"]]).newbyteorder("<"))
        arr = arr.reshape(shape)
        out[name] = torch.from_numpy(arr.astype(np.int64 if arr.dtype.kind == "i" else np.float64))
    return out


def load_export(d):
    cfg = json.load(open(os.path.join(d, "config.json")))
    index = os.path.join(d, "model.safetensors.index.json")
    files = sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index) else ["model.safetensors"]
    params = {}
    for f in files:
        params.update(read_safetensors(os.path.join(d, f)))
    return cfg, params


def reference_config(hf):
    """HF DbrxConfig fields -> the reference's config (LayerNorm eps 1e-5 and no z-loss unless train_dbrx says).
    clip_qkv: null or absent is no clamp; moe_normalize_expert_weights: null is no renormalisation, absent is
    DbrxFFNConfig's default 1."""
    a, f, ours = hf["attn_config"], hf["ffn_config"], hf.get("train_dbrx", {})
    return {"d_model": hf["d_model"], "n_heads": hf["n_heads"], "kv_heads": a["kv_n_heads"],
            "head_dim": hf["d_model"] // hf["n_heads"], "n_layers": hf["n_layers"], "vocab_size": hf["vocab_size"],
            "n_experts": f["moe_num_experts"],
            "ffn_hidden": f["ffn_hidden_size"], "top_k": f["moe_top_k"], "ln_eps": ours.get("ln_eps", 1e-5),
            "clip_qkv": a.get("clip_qkv"), "rope_theta": a.get("rope_theta", 10000.0),
            "moe_normalize_expert_weights": f.get("moe_normalize_expert_weights", 1.0),
            "moe_loss_weight": f.get("moe_loss_weight", 0.01), "z_loss_weight": ours.get("z_loss_weight", 0.0)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("export_dir")
    ap.add_argument("logits")
    ap.add_argument("--tol", type=float, default=None,
                    help="largest allowed |logit difference| (default: by the dump's precision: fp32 1e-4, bf16 1e-1)")
    ap.add_argument("--outliers", type=float, default=None,
                    help="the fraction of tokens allowed above --tol (default: by the dump's precision: fp32 0, bf16 0.02)")
    args = ap.parse_args()
    precision = read_metadata(args.logits).get("precision", "fp32")
    if args.tol is None:
        if precision not in DEFAULT_TOL:
            sys.exit("error: %s: a %s dump has no default tolerance (the reference does not emulate it): pass --tol"
                     % (args.logits, precision))
        args.tol = DEFAULT_TOL[precision]
    if args.outliers is None:
        args.outliers = 0.02 if precision == "bf16" else 0.0
    hf, params = load_export(args.export_dir)
    cfg = reference_config(hf)
    missing = [n for n, _ in ref.weight_shapes(cfg) if n not in params]
    if missing:
        sys.exit("error: %s: tensors missing from the export: %s" % (args.export_dir, ", ".join(missing[:5])))
    dump = read_safetensors(args.logits)
    inputs, want = dump["inputs"], dump["logits"]
    with torch.no_grad():
        logits, _, _, _ = ref.forward(params, cfg, inputs.numpy(), dump["targets"].numpy())
    diff = float((logits - want).abs().max())
    scale = float(want.abs().max())
    print("hf_logits: %s (%s): %d tensors, logits %s, max |torch - train_dbrx| = %.3e (max |logit| %.3f), tol %.1e (%s dump)" % (
        args.export_dir, hf.get("torch_dtype"), len(params), tuple(want.shape), diff, scale, args.tol, precision))
    per_token = (logits - want).abs().amax(dim=-1).flatten()   # (B*T,) the largest difference of each token's logits
    over = int((per_token > args.tol).sum())
    print("hf_logits: %d of %d tokens above tol (%.2f%%; allowed %.2f%%), median per token %.3e" % (
        over, per_token.numel(), 100.0 * over / per_token.numel(), 100.0 * args.outliers, float(per_token.median())))
    sys.exit(0 if over <= args.outliers * per_token.numel() else 1)


if __name__ == "__main__":
    main()
