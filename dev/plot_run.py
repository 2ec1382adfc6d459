#!/usr/bin/env python3
"""
plot_run.py — one PNG of a training run from train_dbrx's JSONL log (--log), several runs overlaid.

    /usr/bin/python3 dev/plot_run.py LOG.jsonl [LOG2.jsonl ...] -o run.png [--labels A,B] [--smooth N] [--title T]

Panels (each only when some run logged it; runs in one colour each, the legend names the files):
train loss (thin: every step; thick: the mean of the last --smooth steps) and validation loss against
tokens seen, with the steps the spike guard skipped marked; --eval-mc accuracy (acc solid, acc_norm
dashed); the learning rate, gradient norm, tokens/s and MFU against the step; the load-balancing loss
(z-loss dashed when it is on) and the expert imbalance (max / mean tokens per expert, worst layer);
with --fp8-log-every, the largest amax of each kind of FP8 operand over the layers (first run with FP8
rows) and the number of saturated values per step (all runs); with --log-every-experts, a heatmap of the
first such run: every layer's experts (rows, layers separated by lines) against the step, each expert's
share of its layer's tokens times the number of experts (1 = balanced, 0 = unused).
A log a resumed run appended to holds some steps twice: the last line of a step counts. Needs
Debian's python3-matplotlib. Bad input (a missing file, a line that is not JSON): one line, exit 2.
"""
import argparse
import json
import os
import re
import sys

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def die(msg):
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(2)


def load(path):
    """The log's rows by kind: step rows by step (the last line of a step wins), and the others in order."""
    run = {"steps": {}, "val": {}, "mc": {}, "experts": {}, "fp8": {}, "skipped": set()}
    try:
        lines = open(path, encoding="utf-8").read().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        die(f"{path}: cannot read: {e}")
    for no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
        except ValueError as e:
            die(f"{path}:{no}: not a JSON object ({e})")
        if not isinstance(r, dict) or not isinstance(r.get("step"), int):
            continue   # (checkpoint events and the like carry no "step")
        s = r["step"]
        if "loss" in r:
            run["steps"][s] = r
            run["skipped"].discard(s)
        elif "val_loss" in r:
            run["val"][s] = r["val_loss"]
        elif "mc_acc" in r:
            run["mc"][s] = (r["mc_acc"], r["mc_acc_norm"])
        elif "expert_counts" in r:
            run["experts"][s] = r["expert_counts"]
        elif "fp8" in r:
            run["fp8"][s] = r["fp8"]
        if r.get("skipped"):
            run["skipped"].add(s)
    if not (run["steps"] or run["val"] or run["mc"]):
        die(f"{path}: no step, validation or evaluation rows: not a train_dbrx --log file")
    return run


def series(run, key):
    xs = sorted(s for s, r in run["steps"].items() if r.get(key) is not None)
    return np.array(xs), np.array([run["steps"][s][key] for s in xs], dtype=float)


def tokens_at(run, steps):
    """Tokens seen after each step (0 before step 1), from the step rows; steps not logged: by the rate."""
    have = {s: r["tokens"] for s, r in run["steps"].items() if "tokens" in r}
    rate = np.median([t / s for s, t in have.items() if s > 0]) if have else None
    return np.array([0 if s == 0 else have.get(s, s * rate) for s in steps], dtype=float)


def main():
    ap = argparse.ArgumentParser(description="plots of train_dbrx JSONL logs, several runs overlaid")
    ap.add_argument("logs", nargs="+", help="JSONL logs written by train_dbrx --log")
    ap.add_argument("-o", "--out", required=True, help="the PNG to write")
    ap.add_argument("--labels", default="", help="comma-separated legend labels (default: the file names)")
    ap.add_argument("--smooth", type=int, default=10, help="train loss: the mean of the last N steps (1: none)")
    ap.add_argument("--title", default="", help="figure title")
    ap.add_argument("--dpi", type=int, default=80)
    a = ap.parse_args()
    if a.smooth < 1:
        die(f"--smooth {a.smooth} must be >= 1")
    labels = a.labels.split(",") if a.labels else [re.sub(r"\.jsonl?$", "", os.path.basename(p)) for p in a.logs]
    if len(labels) != len(a.logs):
        die(f"--labels names {len(labels)} runs, {len(a.logs)} logs given")
    runs = [load(p) for p in a.logs]
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    use_tokens = all(any("tokens" in r for r in run["steps"].values()) for run in runs if run["steps"])
    xname = "tokens seen" if use_tokens else "step"

    def xof(run, steps):
        return tokens_at(run, steps) if use_tokens else np.asarray(steps, dtype=float)

    panels = []   # (title, function(ax)): only what some run logged

    def loss(ax):
        for i, run in enumerate(runs):
            c = colors[i % len(colors)]
            s, y = series(run, "loss")
            if len(s):
                x = xof(run, s)
                ax.plot(x, y, color=c, lw=0.6, alpha=0.35)
                k = min(a.smooth, len(y))
                sm = np.convolve(y, np.ones(k) / k, mode="valid")
                ax.plot(x[k - 1:], sm, color=c, lw=1.6, label=f"{labels[i]} train")
            if run["val"]:
                vs = sorted(run["val"])
                ax.plot(xof(run, vs), [run["val"][v] for v in vs], "o--", color=c, ms=4, lw=1, label=f"{labels[i]} val")
            sk = sorted(s_ for s_ in run["skipped"] if s_ in run["steps"])
            if sk:
                ax.plot(xof(run, sk), [run["steps"][s_]["loss"] or 0 for s_ in sk], "x", color="red", ms=7,
                        label=f"{labels[i]} skipped")
        ax.set_xlabel(xname)
        ax.set_ylabel("cross-entropy")
        ax.legend(fontsize=7)
    panels.append(("loss", loss))

    if any(run["mc"] for run in runs):
        def mc(ax):
            for i, run in enumerate(runs):
                if not run["mc"]:
                    continue
                s = sorted(run["mc"])
                x = xof(run, s)
                ax.plot(x, [run["mc"][t][0] for t in s], "o-", color=colors[i % len(colors)], ms=3, label=f"{labels[i]} acc")
                ax.plot(x, [run["mc"][t][1] for t in s], "s--", color=colors[i % len(colors)], ms=3, label=f"{labels[i]} acc_norm")
            ax.set_xlabel(xname)
            ax.set_ylim(-0.02, 1.02)
            ax.legend(fontsize=7)
        panels.append(("multiple-choice accuracy (--eval-mc)", mc))

    def per_step(key, ylabel, scale=1.0, log=False):
        def f(ax):
            for i, run in enumerate(runs):
                s, y = series(run, key)
                if len(s):
                    ax.plot(s, y * scale, color=colors[i % len(colors)], lw=1, label=labels[i])
            ax.set_xlabel("step")
            ax.set_ylabel(ylabel)
            if log:
                ax.set_yscale("log")
        return f
    for key, title, ylabel, scale, log in [("lr", "learning rate", "lr", 1, False), ("grad_norm", "gradient norm (before clipping)", "norm", 1, True),
                                           ("tok_per_s", "throughput", "tokens/s", 1, False), ("mfu", "MFU (matmul FLOPs / peak)", "%", 100, False)]:
        if any(len(series(run, key)[0]) for run in runs):
            panels.append((title, per_step(key, ylabel, scale, log)))

    if any(len(series(run, "lbl")[0]) for run in runs):
        def lbl(ax):
            for i, run in enumerate(runs):
                c = colors[i % len(colors)]
                s, y = series(run, "lbl")
                ax.plot(s, y, color=c, lw=1, label=f"{labels[i]} lbl")
                s, z = series(run, "z_loss")
                if len(z) and np.nanmax(np.abs(z)) > 0:
                    ax.plot(s, z, "--", color=c, lw=1, label=f"{labels[i]} z-loss")
            ax.set_xlabel("step")
            ax.legend(fontsize=7)
        panels.append(("load-balancing loss", lbl))
    if any(len(series(run, "imbalance")[0]) for run in runs):
        panels.append(("expert imbalance (max / mean, worst layer)", per_step("imbalance", "max / mean tokens per expert")))

    fp8_run = next((i for i, run in enumerate(runs) if run["fp8"]), None)
    if fp8_run is not None:
        def amax(ax):
            run = runs[fp8_run]
            s = sorted(run["fp8"])
            kinds = sorted({re.sub(r"^blocks\.\d+\.", "", n) for n in run["fp8"][s[0]]})
            cmap = plt.get_cmap("tab20")
            for j, kind in enumerate(kinds):
                y = [max((v["amax"] for n, v in run["fp8"][t].items() if re.sub(r"^blocks\.\d+\.", "", n) == kind), default=np.nan)
                     for t in s]
                ax.plot(s, y, color=cmap(j % 20), lw=1, label=kind)
            ax.set_yscale("log")
            ax.set_xlabel("step")
            ax.set_ylabel("amax (max over layers)")
            ax.legend(fontsize=6, ncol=2)
        panels.append((f"FP8 amax per operand ({labels[fp8_run]})", amax))

        def sat(ax):
            for i, run in enumerate(runs):
                if run["fp8"]:
                    s = sorted(run["fp8"])
                    ax.plot(s, [sum(v.get("saturated", 0) for v in run["fp8"][t].values()) for t in s], "o-", ms=3,
                            color=colors[i % len(colors)], label=labels[i])
            ax.set_xlabel("step")
            ax.set_ylabel("values clipped by the FP8 cast")
        panels.append(("FP8 saturation (all tensors)", sat))

    heat_run = next((i for i, run in enumerate(runs) if run["experts"]), None)
    ncol = 3
    nrow = (len(panels) + ncol - 1) // ncol
    heat_rows = 0
    if heat_run is not None:
        L = len(runs[heat_run]["experts"][min(runs[heat_run]["experts"])])
        heat_rows = 2 if L > 2 else 1
    fig = plt.figure(figsize=(5 * ncol, 3.4 * (nrow + heat_rows)))
    gs = fig.add_gridspec(nrow + heat_rows, ncol)
    for k, (title, f) in enumerate(panels):
        ax = fig.add_subplot(gs[k // ncol, k % ncol])
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
        f(ax)
    handles = [plt.Line2D([], [], color=colors[i % len(colors)], lw=2) for i in range(len(runs))]
    fig.legend(handles, labels, loc="upper right", ncol=min(len(runs), 4), fontsize=9)

    if heat_run is not None:
        run = runs[heat_run]
        s = sorted(run["experts"])
        counts = np.array([run["experts"][t] for t in s], dtype=float)   # (steps, L, E)
        n, L, E = counts.shape
        share = counts / np.maximum(counts.sum(axis=2, keepdims=True), 1) * E
        img = share.transpose(1, 2, 0).reshape(L * E, n)   # rows: layer-major experts; columns: logged steps
        ax = fig.add_subplot(gs[nrow:, :])
        im = ax.imshow(img, aspect="auto", interpolation="nearest", cmap="magma", vmin=0, vmax=max(2.0, float(np.nanmax(img))),
                       extent=(s[0] - 0.5, s[-1] + 0.5, L * E - 0.5, -0.5) if n > 1 else None)
        for l in range(1, L):
            ax.axhline(l * E - 0.5, color="white", lw=1)
        ax.set_yticks([l * E + (E - 1) / 2 for l in range(L)])
        ax.set_yticklabels([f"layer {l}" for l in range(L)])
        ax.set_xlabel("step")
        ax.set_title(f"expert load ({labels[heat_run]}): each expert's share of its layer's tokens x {E} experts "
                     f"(1 = balanced), {L} layers x {E} experts", fontsize=10)
        fig.colorbar(im, ax=ax, fraction=0.03, pad=0.01)
    if a.title:
        fig.suptitle(a.title, x=0.02, ha="left", fontsize=12)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    try:
        fig.savefig(a.out, dpi=a.dpi)
    except OSError as e:
        die(f"{a.out}: cannot write: {e}")
    print(f"{a.out}: {len(panels) + (heat_run is not None)} panels, {len(runs)} run(s)")


if __name__ == "__main__":
    main()
