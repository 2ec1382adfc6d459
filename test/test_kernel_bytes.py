"""test_kernel_bytes.py — every kernel of an emulated training step against its byte / FLOP formula.

  python3 test/test_kernel_bytes.py NAME LOG [LOG...]       one verdict line per kernel (pass / fail ...)
  python3 test/test_kernel_bytes.py --control LOG           the negative controls (a doubled formula, a kernel
                                                            made to read twice, a kernel without a formula must fail)

LOG: a work log of train_dbrx_emu_count (SIMT_WORKLOG): each kernel line carries the global-memory bytes the
instrumented emulator counted ("rd", "wr": distinct bytes, test/simt/bytecount.h) and the tensor-core FLOPs of its
mma.sync ("mma"). dev/predict/kernel_cost.py's kernel_rw gives the formula's. For each kernel (by name, every launch
of it in the log): CHECK "exact" (the default) passes when formula and count agree within TOL (2%) or SLACK bytes
(a few scalars), read and written apart; "bound" (kernel_cost.BOUND: a gather by token id, whose repeated rows are
read once; under EP the rows an expert receives) when the count lies between the written bytes and the formula; the mma FLOPs must be equal. A kernel in
the log without a formula fails: a new kernel must get one. Python 3, standard library only.
"""
import json
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "dev", "predict"))
import kernel_cost as K  # noqa: E402

TOL = 0.02


def read(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def agree(formula, counted, tol=TOL):
    return abs(formula - counted) <= max(tol * counted, K.SLACK)


def check_launch(it, ctx, rw=None):
    """None when the launch's count matches its formula, else why not"""
    base = re.sub(r"<.*", "", it["name"]).strip()
    rw = rw or K.kernel_rw(it, ctx)
    if rw is None:
        return "no formula"
    rd, wr, mma = rw
    if K.data_dependent(it, ctx):
        ok = it["wr"] <= it["rd"] + it["wr"] <= rd + wr + K.SLACK and agree(wr, it["wr"])
    else:
        ok = agree(rd, it["rd"]) and agree(wr, it["wr"])
    ok = ok and mma == it.get("mma", 0)
    if ok:
        return None
    return "formula rd %d wr %d mma %d, counted rd %d wr %d mma %d (args %s, grid %s)" % (
        rd, wr, mma, it["rd"], it["wr"], it.get("mma", 0), json.dumps(it.get("args"))[:160], it["grid"])


def kernels(items):
    return [it for it in items if it["t"] == "kernel" and "rd" in it]


def main(argv):
    if argv[1:2] == ["--control"]:
        return control(argv[2])
    name, logs = argv[1], argv[2:]
    byname = {}   # kernel name -> [launches, failures, first failure, rd, wr]
    total = 0
    for path in logs:
        items = read(path)
        ctx = K.kernel_context(items)
        for it in kernels(items):
            total += 1
            why = check_launch(it, ctx)
            e = byname.setdefault(re.sub(r"<.*", "", it["name"]), [0, 0, None, 0, 0, set()])
            e[5].add("bound" if K.data_dependent(it, ctx) else "exact")
            e[0] += 1
            e[3] += it["rd"]
            e[4] += it["wr"]
            if why:
                e[1] += 1
                e[2] = e[2] or why
    if not total:
        print("fail %s: no counted kernel lines in %s (not a train_dbrx_emu_count log?)" % (name, " ".join(logs)))
        return
    for k in sorted(byname):
        n, bad, why, rd, wr, checks = byname[k]
        check = "/".join(sorted(checks))
        if bad:
            print("fail %s: %s: %d of %d launches: %s" % (name, k, bad, n, why))
        else:
            print("pass %s: %s: %d launches, %s rd %d wr %d bytes = its formula (%s)" % (name, k, n, "counted", rd, wr, check))


def control(path):
    items = read(path)
    ctx = K.kernel_context(items)
    ks = kernels(items)
    sw = next(it for it in ks if it["name"].startswith("swiglu_forward_kernel"))
    rd, wr, mma = K.kernel_rw(sw, ctx)
    # a doubled formula
    why = check_launch(sw, ctx, (2 * rd, wr, mma))
    print(("pass" if why else "fail") + " negative control: swiglu_forward's formula with twice the bytes read is caught (%s)" % why)
    # a kernel made to read twice the bytes (its counted rd doubled, as a second pass over a second input would)
    twice = dict(sw, rd=2 * sw["rd"])
    why = check_launch(twice, ctx)
    print(("pass" if why else "fail") + " negative control: swiglu_forward reading twice the bytes it should is caught (%s)" % why)
    # the flash forward's (wgmma at head_dim 128) mma FLOPs one tile pair off
    fl = next(it for it in ks if it["name"].startswith("flash_attention_forward_wgmma"))
    frd, fwr, fmma = K.kernel_rw(fl, ctx)
    why = check_launch(fl, ctx, (frd, fwr, fmma + 2 * 2 * K.FLASH_BR * K.FLASH_BC * 128))
    print(("pass" if why else "fail") + " negative control: flash attention's mma FLOPs with a tile pair more are caught (%s)" % why)
    # a kernel without a formula
    why = check_launch(dict(sw, name="new_kernel<8>"), ctx)
    print(("pass" if why == "no formula" else "fail") + " negative control: a kernel without a formula fails (%s)" % why)


if __name__ == "__main__":
    main(sys.argv)
