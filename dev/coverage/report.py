"""report.py — which device lines of the product the emulated tests never executed (dev/coverage/run.sh).

    python3 dev/coverage/report.py TREE [--lines] [--json OUT]

TREE: a tree built with `make COVERAGE=1` whose test suite has run (its *.gcda counters beside the binaries). Every
counter file goes through gcov (JSON), the counts of a source line are summed over the binaries (train_dbrx_emu, the
emulated test programs, dev/cuda's emulated programs), and the product's device lines are reported: the lines of the
files the CPU build does not include (the CUDA-only headers: g++ -MM of train_dbrx.cu without DBRX_HAVE_CUDA) and,
in the files it does, the lines inside `#if DBRX_HAVE_CUDA` (or HAVE_CUDA_BACKEND) blocks. The product: model/,
parallel/, checkpoint/, data/, train_*. A line gcov saw no code for (a declaration, a brace, a template never
instantiated) is not counted either way: a function no binary instantiates shows up in neither list; `--lines` prints
the line numbers never executed. The race-detector and byte-counting builds are not instrumented (their
instrumentation is the emulator's own); what only they run counts as not executed here.
"""
import argparse, collections, json, os, re, subprocess, sys

PRODUCT = ("model/", "parallel/", "checkpoint/", "data/", "train_")
CUDA_IF = re.compile(r"#\s*if\s+(DBRX_HAVE_CUDA|HAVE_CUDA_BACKEND|defined\(__CUDACC__\) \|\| defined\(SIMT_EMULATION\)"
                     r"|defined\(PLATFORM_NCCL\) && DBRX_HAVE_CUDA)\b")


def cpu_build_files(tree):
    """the product files the CPU build (no DBRX_HAVE_CUDA) includes, train_dbrx.cu among them"""
    p = subprocess.run(["g++", "-std=c++17", "-fopenmp", "-MM", "-MG", "-x", "c++", "train_dbrx.cu"], cwd=tree,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
    if p.returncode != 0:
        sys.exit("error: report.py: g++ -MM train_dbrx.cu failed in %s: %s" % (tree, p.stderr.strip()[-300:]))
    words = p.stdout.replace("\\\n", " ").split()
    return {os.path.normpath(w) for w in words if not w.endswith(":") and not w.startswith("/")}


def device_lines(path, text, cpu_files):
    """the line numbers of `path` that only the CUDA builds compile"""
    lines = text.split("\n")
    if path not in cpu_files:
        return set(range(1, len(lines) + 1))
    stack, out = [], set()
    for i, l in enumerate(lines, 1):
        s = l.strip()
        if s.startswith("#if"):
            stack.append(bool(CUDA_IF.match(s)))
        elif s.startswith(("#else", "#elif")):
            if stack:
                stack[-1] = False
        elif s.startswith("#endif"):
            if stack:
                stack.pop()
        elif any(stack):
            out.add(i)
    return out


def gcov_counts(tree):
    """{file: {line: count}}, {file: {(first line, name): entries}} over every .gcda under tree"""
    lines, funcs = collections.defaultdict(dict), collections.defaultdict(lambda: collections.defaultdict(int))
    gcdas = []
    for d, _, fs in os.walk(tree):
        gcdas += [os.path.join(d, f) for f in fs if f.endswith(".gcda")]
    if not gcdas:
        sys.exit("error: report.py: no .gcda counters under %s (build with make COVERAGE=1 and run the tests)" % tree)
    for g in sorted(gcdas):
        p = subprocess.run(["gcov", "--json-format", "--stdout", g], cwd=tree, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, universal_newlines=True)
        if p.returncode != 0:
            sys.exit("error: report.py: gcov %s failed: %s" % (g, p.stderr.strip()[-300:]))
        for doc in p.stdout.splitlines():
            if not doc.startswith("{"):
                continue
            for f in json.loads(doc)["files"]:
                fn = os.path.normpath(f["file"])
                if fn.startswith("/") or not fn.startswith(PRODUCT):
                    continue
                for l in f["lines"]:
                    lines[fn][l["line_number"]] = lines[fn].get(l["line_number"], 0) + l["count"]
                for fu in f["functions"]:   # every instantiation of a template under its base name
                    base = re.sub(r"<.*", "", fu["demangled_name"].split("(")[0])
                    funcs[fn][(fu["start_line"], base)] += fu["execution_count"]
    return len(gcdas), lines, funcs


def ranges(ns):
    out, start, prev = [], None, None
    for n in ns:
        if start is None:
            start = prev = n
        elif n == prev + 1:
            prev = n
        else:
            out.append((start, prev)); start = prev = n
    if start is not None:
        out.append((start, prev))
    return ", ".join(str(a) if a == b else "%d-%d" % (a, b) for a, b in out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("tree")
    ap.add_argument("--lines", action="store_true", help="print the line numbers never executed")
    ap.add_argument("--json", default=None, help="write {file: [lines never executed]} here")
    a = ap.parse_args()
    tree = os.path.abspath(a.tree)
    cpu = cpu_build_files(tree)
    n, lines, funcs = gcov_counts(tree)
    tot, miss, fmiss = collections.Counter(), {}, []
    for fn in sorted(lines):
        path = os.path.join(tree, fn)
        if not os.path.exists(path):
            continue
        dev = device_lines(fn, open(path).read(), cpu)
        cov = {ln: c for ln, c in lines[fn].items() if ln in dev}
        tot[fn] = len(cov)
        never = sorted(ln for ln, c in cov.items() if c == 0)
        if never:
            miss[fn] = never
        fmiss += [(fn, ln, name) for (ln, name), c in funcs[fn].items() if c == 0 and ln in dev]
    T, U = sum(tot.values()), sum(len(v) for v in miss.values())
    print("coverage: %d counter files; the product's device lines with code: %d, never executed in the tests: %d (%.1f%%)"
          % (n, T, U, 100.0 * U / max(T, 1)))
    for fn in sorted(miss, key=lambda f: (-len(miss[f]), f)):
        print("%6d of %6d  %s%s" % (len(miss[fn]), tot[fn], fn, (": " + ranges(miss[fn])) if a.lines else ""))
    print("functions never entered (every instantiation): %d" % len(fmiss))
    for fn, ln, name in sorted(fmiss):
        print("  %s:%d %s" % (fn, ln, name))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(miss, f, indent=0)


if __name__ == "__main__":
    main()
