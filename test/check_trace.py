#!/usr/bin/env python3
"""check_trace.py — checks one --profile trace (Chrome trace-event JSON, model/profile.h) for
test/test_profile.sh, printing one "pass ..." or "fail ..." line per check (test/lib.sh's verdicts):

  1. it parses (json.load), has traceEvents and displayTimeUnit, and every event has ph, ts, dur, pid
     and tid (numbers; dur >= 0), pid = the rank, and a "process_name" naming the rank;
  2. the complete events ("ph": "X") of every track (tid) nest: two ranges of one track are disjoint or
     one contains the other (within EPS microseconds: device times come from float milliseconds);
  3. every --need NAME is there (NAME* : a prefix), on a track whose name holds TRACK for TRACK:NAME;
  4. exactly one "step N" range per step of --steps A:B; with --log (rank 0), each one's duration is the
     time the log prints for that step (its "ms", %.3f) within 0.002 ms;
  5. the phases of each step (cat "phase": zero grad, data, forward, backward, gradient reduction,
     optimizer) add up to the step's duration within --tol (relative): nothing of the step is missing.

usage: check_trace.py TRACE --rank R --steps A:B [--log LOG] [--need [TRACK:]NAME ...] [--tol 0.1]
"""
import argparse
import json
import sys

EPS = 2.0   # microseconds

ap = argparse.ArgumentParser()
ap.add_argument("trace")
ap.add_argument("--rank", type=int, required=True)
ap.add_argument("--steps", required=True)
ap.add_argument("--log")
ap.add_argument("--need", action="append", default=[])
ap.add_argument("--tol", type=float, default=0.1)
a = ap.parse_args()
name = "%s (rank %d)" % (a.trace, a.rank)


def verdict(ok, what):
    print("%s %s: %s" % ("pass" if ok else "fail", name, what))
    return ok


try:
    doc = json.load(open(a.trace))
except Exception as e:   # (the one verdict: nothing else can be checked)
    verdict(False, "not valid JSON: %s" % e)
    sys.exit(0)
ev = doc.get("traceEvents") if isinstance(doc, dict) else None
if not verdict(isinstance(ev, list) and doc.get("displayTimeUnit") in ("ms", "ns"), "a traceEvents list and displayTimeUnit"):
    sys.exit(0)

# 1. every event's fields
bad = []
for e in ev:
    for k in ("ph", "ts", "dur", "pid", "tid", "name"):
        if k not in e:
            bad.append("%s without %s" % (e, k))
    if not bad and not all(isinstance(e[k], (int, float)) for k in ("ts", "dur", "pid", "tid")):
        bad.append("%s: not numbers" % e)
    if not bad and (e["dur"] < 0 or e["pid"] != a.rank):
        bad.append("%s: dur < 0 or pid not the rank" % e)
procs = [e["args"]["name"] for e in ev if e.get("ph") == "M" and e.get("name") == "process_name"]
verdict(not bad and procs and procs[0].startswith("rank %d" % a.rank),
        "%d events, each with ph/ts/dur/pid/tid (dur >= 0, pid %d), the process named '%s'%s"
        % (len(ev), a.rank, procs[0] if procs else "?", ("; " + "; ".join(bad[:3])) if bad else ""))
tracks = {e["tid"]: e["args"]["name"] for e in ev if e.get("ph") == "M" and e.get("name") == "thread_name"}
X = [e for e in ev if e.get("ph") == "X"]

# 2. nesting per track
overlaps = []
for tid in sorted(set(e["tid"] for e in X)):
    stack = []
    for e in sorted((e for e in X if e["tid"] == tid), key=lambda e: (e["ts"], -e["dur"])):
        while stack and e["ts"] >= stack[-1]["ts"] + stack[-1]["dur"] - EPS:
            stack.pop()
        if stack and e["ts"] + e["dur"] > stack[-1]["ts"] + stack[-1]["dur"] + EPS:
            overlaps.append("'%s' and '%s' on %s" % (stack[-1]["name"], e["name"], tracks.get(tid, tid)))
        stack.append(e)
verdict(not overlaps, "%d ranges on %d track(s) (%s) nest properly%s" % (len(X), len(set(e["tid"] for e in X)),
        ", ".join(sorted(set(tracks.get(e["tid"], "?") for e in X))), ("; " + "; ".join(overlaps[:3])) if overlaps else ""))

# 3. the ranges asked for
missing = []
for need in a.need:
    track, _, want = need.partition(":") if ":" in need else ("", "", need)   # (no range's name holds a colon)
    hit = [e for e in X if (e["name"].startswith(want[:-1]) if want.endswith("*") else e["name"] == want)
           and track in tracks.get(e["tid"], "")]
    if not hit:
        missing.append(need)
verdict(not missing, "every range asked for is there (%d: %s)%s" % (len(a.need), ", ".join(a.need),
        ("; missing: " + ", ".join(missing)) if missing else ""))

# 4. the step ranges, against the log
first, last = (int(x) for x in a.steps.split(":"))
steps = {}
for e in X:
    if e.get("cat") == "step":
        steps.setdefault(e["name"], []).append(e)
want = ["step %d" % s for s in range(first, last + 1)]
verdict(sorted(steps) == sorted(want) and all(len(v) == 1 for v in steps.values()),
        "one range per profiled step: %s (want %s)" % (sorted(steps), want))
if a.log:
    logged = {}
    for line in open(a.log):
        o = json.loads(line)
        if "loss" in o and "ms" in o:
            logged[o["step"]] = o["ms"]
    off = []
    for s in range(first, last + 1):
        e = steps.get("step %d" % s, [None])[0]
        if e is None or s not in logged or abs(e["dur"] / 1000 - logged[s]) > 0.002:
            off.append("step %d: trace %s ms, log %s ms" % (s, e and e["dur"] / 1000, logged.get(s)))
    verdict(not off, "each step's range lasts the time the log prints for it%s" % (("; " + "; ".join(off)) if off else ""))

# 5. the phases of each step add up to it
sums = []
ok = True
for s in range(first, last + 1):
    e = steps.get("step %d" % s, [None])[0]
    phases = [p for p in X if p.get("cat") == "phase" and p.get("args", {}).get("step") == s]
    total = sum(p["dur"] for p in phases)
    if e is None or e["dur"] <= 0:
        ok = False
        continue
    r = total / e["dur"]
    ok = ok and abs(r - 1) <= a.tol and len(set(p["name"] for p in phases)) >= 6
    sums.append("step %d: %d phases %.3f ms of %.3f ms (%.1f%%)" % (s, len(phases), total / 1000, e["dur"] / 1000, 100 * r))
verdict(ok and sums, "the step's phases add up to it within %g%%: %s" % (100 * a.tol, "; ".join(sums)))
