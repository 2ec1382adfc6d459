#!/usr/bin/env python3
"""check_layout.py — the house rules of the source tree (issue 20), checked on every file git tracks:

  1. nothing outside test/ includes test/, but the platform header (model/platform.h: the emulator,
     the cuBLASLt and NCCL twins are a platform the emulated build compiles against);
  2. nothing outside dev/ includes dev/ (dev/ holds benchmarks and tools: leaves, never the product);
  3. model/ never names the communicator, the parameter store or the expert-parallel exchange
     (comm_, zero_, ep_exchange): sharding and expert parallelism reach the model through its hooks;
  4. the training step reads no environment variable: no getenv in the trainer's step, observers or
     logging, and in the product only the listed readers, each read once at start-up;
  5. no product file over 700 lines, no function over 150 lines, but the exceptions listed below with
     their reason.

Prints one "pass ..." or "fail ..." line per rule (test/lib.sh's verdicts reads them).
Run from the repository root: python3 test/check_layout.py
Negative control: python3 test/check_layout.py --planted builds a small git tree that breaks every rule
and checks that each rule fails on it.
"""
import os
import re
import subprocess
import sys

MAX_FILE_LINES = 700
MAX_FUNCTION_LINES = 150

# the product files allowed over MAX_FILE_LINES, and why
FILE_EXCEPTIONS = {
}
# (file, function) allowed over MAX_FUNCTION_LINES, and why
FUNCTION_EXCEPTIONS = {
}
# model/ files that may name the store's calls, and why
MODEL_NAMING_EXCEPTIONS = {
    "model/api.h": "the written backend contract states the store's calls (zero_*) the loop makes; it includes nothing of parallel/",
}
# the product's getenv readers (each reads at start-up or once per process), and what they read
GETENV_READERS = {
    "model/debug_hooks.h": "every DBRX_DEBUG_* switch, once, from main (debug_hooks_read)",
    "model/matmul.cuh": "MATMUL_PLAN_CACHE, once per process (a function-local static)",
    "model/platform.h": "SIMT_STEP_COUNTERS (emulated build only), once per process",
    "parallel/comm.h": "OMPI_COMM_WORLD_SIZE and PMIX_RANK once before MPI_Init (a singleton is started isolated)",
    "parallel/gpu_select.h": "the launcher's CUDA_VISIBLE_DEVICES, OMPI_COMM_WORLD_LOCAL_*, SLURM_LOCALID/STEP_TASKS_PER_NODE/NODEID, "
                             "once per process when the GPU is picked (comm_select_gpu)",
    "train_dbrx.cu": "OMP_NUM_THREADS at the CPU backend's set-up (ranks share the node's cores unless it is set); OMPI_MCA_odls_base_sigkill_timeout once before MPI_Init (mpirun's grace after Ctrl-C)",
}
# the training step and what it calls in the trainer: no getenv at all
STEP_FILES = ["train_step.h", "train_observers.h", "train_log.h"]
PLATFORM_HEADER = "model/platform.h"

SOURCE = re.compile(r"\.(h|cuh|cu|cpp|c)$")


def tracked():
    out = subprocess.run(["git", "ls-files"], capture_output=True, text=True, check=True).stdout
    return [f for f in out.split("\n") if f and os.path.exists(f)]


def is_product(f):
    return not (f.startswith("test/") or f.startswith("dev/")) and SOURCE.search(f)


def includes(path):
    """(line number, resolved path) of every #include "..." in path"""
    res = []
    for n, line in enumerate(open(path, encoding="utf-8", errors="replace"), 1):
        m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
        if m:
            res.append((n, os.path.normpath(os.path.join(os.path.dirname(path), m.group(1)))))
    return res


def strip_code(text):
    """text with comments, strings and character literals blanked (newlines kept)"""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i)); i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j])); i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(c + " " * (j - i - 1) + c); i = j + 1
        else:
            out.append(c); i += 1
    return "".join(out)


def functions(path):
    """(name, first line, lines) of every function defined at namespace scope in path"""
    code = strip_code(open(path, encoding="utf-8", errors="replace").read())
    code = "\n".join("" if l.lstrip().startswith("#") else l for l in code.split("\n"))   # no preprocessor lines
    res, depth, start, stmt_start, head = [], 0, None, 0, ""
    line = 1
    for c in code:
        if c == "\n":
            line += 1
        if depth == 0:
            if c in ";}":
                head, stmt_start = "", None
                continue
            if c == "{":
                m = re.search(r"([A-Za-z_~][A-Za-z_0-9:]*)\s*\(", head)
                is_type = re.match(r"\s*(typedef\s+)?(struct|union|enum|class|namespace|extern)\b", head)
                if m and not is_type and "=" not in head.split("(")[0]:
                    start = (m.group(1), stmt_start or line)
                depth = 1
                continue
            if not c.isspace() and stmt_start is None:
                stmt_start = line
            head += c
        else:
            if c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
                if depth == 0:
                    if start:
                        res.append((start[0], start[1], line - start[1] + 1))
                    start, head, stmt_start = None, "", None
    return res


PLANTED = {   # a tree that breaks each rule once
    "model/platform.h": "#pragma once\n",
    "model/bad_include.h": '#include "../test/simt/simt.h"\n',
    "parallel/bad_dev.h": '#include "../dev/cuda/common.h"\n',
    "model/bad_names.h": "static void f() { comm_barrier(); }\n",
    "train_step.h": 'static void g() { getenv("X"); }\n',
    "checkpoint/big.h": "static int h() {\n" + "    h();\n" * 160 + "}\n",
}


def planted():
    """every rule fails on PLANTED (run in a scratch git tree)"""
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        for f, text in PLANTED.items():
            os.makedirs(os.path.join(d, os.path.dirname(f)), exist_ok=True)
            open(os.path.join(d, f), "w").write(text)
        subprocess.run(["git", "init", "-q", d], check=True)
        subprocess.run(["git", "-C", d, "add", "-A"], check=True)
        out = subprocess.run([sys.executable, os.path.abspath(__file__), "--root", d], capture_output=True, text=True).stdout
    lines = out.strip().split("\n")
    rules = lines[:5]
    ok = len(rules) == 5 and all(l.startswith("fail") for l in rules)
    print(("pass" if ok else "fail") + " negative control: a planted tree breaks each of the 5 rules and each is caught"
          + ("" if ok else ": " + " | ".join(l[:80] for l in lines)))


def main():
    if "--planted" in sys.argv:
        return planted()
    root = sys.argv[sys.argv.index("--root") + 1] if "--root" in sys.argv else \
        subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True, check=True).stdout.strip()
    os.chdir(root)
    files = tracked()
    sources = [f for f in files if SOURCE.search(f)]
    product = [f for f in sources if is_product(f)]

    bad = [f"{f}:{n} includes {inc}" for f in sources if not f.startswith("test/") and f != PLATFORM_HEADER
           for n, inc in includes(f) if inc.startswith("test/")]
    print(("pass" if not bad else "fail") + " nothing outside test/ includes test/ but " + PLATFORM_HEADER
          + ("" if not bad else ": " + "; ".join(bad[:6])))

    bad = [f"{f}:{n} includes {inc}" for f in sources if not f.startswith("dev/") for n, inc in includes(f) if inc.startswith("dev/")]
    print(("pass" if not bad else "fail") + " nothing outside dev/ includes dev/" + ("" if not bad else ": " + "; ".join(bad[:6])))

    bad = []
    for f in sources:
        if not f.startswith("model/") or f in MODEL_NAMING_EXCEPTIONS:
            continue
        for n, l in enumerate(open(f, encoding="utf-8", errors="replace"), 1):
            m = re.search(r"\b(comm_|zero_|ep_exchange)\w*", l)
            if m:
                bad.append(f"{f}:{n} names {m.group(0)}")
    print(("pass" if not bad else "fail") + " model/ names no comm_, zero_ or ep_exchange (but " + ", ".join(MODEL_NAMING_EXCEPTIONS) + ")" + ("" if not bad else ": " + "; ".join(bad[:6])))

    bad = []
    for f in product:
        code = strip_code(open(f, encoding="utf-8", errors="replace").read())
        for n, l in enumerate(code.split("\n"), 1):
            if re.search(r"\bgetenv\s*\(", l) and (f in STEP_FILES or f not in GETENV_READERS):
                bad.append(f"{f}:{n}")
    print(("pass" if not bad else "fail") + " the training step reads no environment variable (getenv only in the start-up readers: "
          + ", ".join(sorted(GETENV_READERS)) + ")" + ("" if not bad else ": getenv at " + "; ".join(bad[:6])))

    bad, stale = [], [f for f in FILE_EXCEPTIONS if not os.path.exists(f)]
    for f in product:
        n = sum(1 for _ in open(f, encoding="utf-8", errors="replace"))
        if n > MAX_FILE_LINES and f not in FILE_EXCEPTIONS:
            bad.append(f"{f} has {n} lines")
        for name, first, length in functions(f):
            if length > MAX_FUNCTION_LINES and (f, name) not in FUNCTION_EXCEPTIONS:
                bad.append(f"{f}:{first} {name} has {length} lines")
    print(("pass" if not bad and not stale else "fail") + f" no product file over {MAX_FILE_LINES} lines, no function over "
          f"{MAX_FUNCTION_LINES} ({len(FILE_EXCEPTIONS)} file and {len(FUNCTION_EXCEPTIONS)} function exceptions listed)"
          + ("" if not bad else ": " + "; ".join(bad[:8])) + ("" if not stale else "; stale exceptions: " + ", ".join(stale)))

    # the measure itself, on a fixture: a 3-line function, a struct, a kernel whose signature spans lines
    fixture = "/tmp/check_layout_fixture.h"
    with open(fixture, "w") as fx:
        fx.write('typedef struct { int a; } S;\nstatic int f(int x) {\n    return x; // }\n}\n__global__ void k(int a,\n'
                 '                  int b) {\n    if (a) { b++; }\n    const char* s = "}";\n}\n')
    got = functions(fixture)
    os.remove(fixture)
    ok = got == [("f", 2, 3), ("k", 5, 5)]
    print(("pass" if ok else "fail") + f" the function measure counts a fixture's functions right ({got})")


if __name__ == "__main__":
    main()
