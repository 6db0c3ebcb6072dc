#!/usr/bin/env python3
"""Median step times by kind, on the card and in the simulator.

The simulator shares the GPU among the models' rolling steps by a rule
with two parameters (policy.rolling_share_exponent and
rolling_overlap_share, sim/sim_device.h); this compares what that rule
gives with what a node's steps took, beside the same traffic: the median
time of the steps with at least 1,900 prefill tokens, with 600-1,899, with
fewer, and of decode-only steps, within a window of the run. Each node log
counts once (the node's medians are their mean); the error is the sum over
the four kinds of |ln(simulated / node)|, the figure a refit minimises
(docs/benchmarks.md gives the loop over the two parameters).

A node step's time runs from when it began on the device to when the node
collected it: a step queued behind its model's previous one (ahead
steps) begins when that one was collected, not when it was launched.

Node logs: every step logged (SLOW_STEP_MS=0.001); the run begins after a
stretch of --gap-s with nothing in flight, the one that puts each model's
first step closest to the simulator's (scripts/run_start.py; a run can
idle that long inside), its clock from its first step. Simulated steps:
`ballast simulate --step-log`'s steps-<rate>.csv (a stretch of n decode
steps counts as n steps of its mean time), its clock from its first step.

Usage: scripts/step-medians.py SIM_STEPS_CSV SERVE_LOG[.gz|.xz] [...]
       [--from-s 8] [--to-s 30] [--gap-s 0.5] [--last-gap]
"""
import argparse
import csv
import math
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from log_open import open_log  # noqa: E402
from run_start import first_steps, run_start  # noqa: E402

STEP = re.compile(
    r"model (\S+): slow step, [0-9.]+ ms \(\d+ chunks, (\d+) prefill tokens, \d+ loads\): "
    r".*launched at (\d+) us, collected at (\d+) us")

KINDS = [("prefill >= 1900", lambda p: p >= 1900),
         ("prefill 600-1899", lambda p: 600 <= p < 1900),
         ("prefill < 600", lambda p: 0 < p < 600),
         ("decode only", lambda p: p == 0)]


def node_steps(path, gap_s, sim_first):
    """(start_s, end_s, prefill_tokens) of the log's measured run."""
    steps, collected = [], {}
    with open_log(path) as f:
        for line in f:
            m = STEP.search(line) if "slow step" in line else None
            if not m:
                continue
            model, prefill, launched, done = m.group(1), int(m.group(2)), int(m.group(3)), \
                int(m.group(4))
            began = max(launched, collected.get(model, 0))
            collected[model] = done
            steps.append((model, began / 1e6, done / 1e6, prefill))
    if not steps:
        sys.exit("no steps with their times in %s (log every step: SLOW_STEP_MS=0.001)" % path)
    steps.sort(key=lambda s: s[1])
    first = run_start(steps, gap_s, sim_first)
    t0 = steps[first][1]
    return [(b - t0, e - t0, p) for _, b, e, p in steps[first:]]


def sim_steps(path):
    """(model, start_s, end_s, prefill_tokens) of every simulated step, a
    stretch of n decode steps as n steps of its mean time, seconds from the
    first step's start."""
    rows = list(csv.DictReader(open(path)))
    if not rows:
        sys.exit("%s: no steps (run `ballast simulate ... --step-log`)" % path)
    t0 = min(float(r["start_s"]) for r in rows)
    out = []
    for r in rows:
        n, b, e = int(r["steps"]), float(r["start_s"]) - t0, float(r["end_s"]) - t0
        dt = (e - b) / n
        out.extend((r["model"], b + j * dt, b + (j + 1) * dt, int(r["prefill_tokens"]))
                   for j in range(n))
    return out


def medians(steps, lo, hi):
    out = []
    for _, kind in KINDS:
        v = [(e - b) * 1e3 for b, e, p in steps if kind(p) and lo <= b < hi]
        out.append((statistics.median(v), len(v)) if v else (float("nan"), 0))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("sim")
    ap.add_argument("logs", nargs="+")
    ap.add_argument("--from-s", type=float, default=8.0)
    ap.add_argument("--to-s", type=float, default=30.0)
    ap.add_argument("--gap-s", type=float, default=0.5)
    ap.add_argument("--last-gap", action="store_true",
                    help="the node's run begins after its last stretch of --gap-s idle "
                    "(by default, after the one that lines its models' first steps up "
                    "with the simulator's)")
    a = ap.parse_args()
    simulated = sim_steps(a.sim)
    sim_first = None if a.last_gap else first_steps(simulated)
    nodes = [medians(node_steps(p, a.gap_s, sim_first), a.from_s, a.to_s) for p in a.logs]
    sim = medians([s[1:] for s in simulated], a.from_s, a.to_s)
    print("%-17s %10s %6s %10s %6s %7s" % ("steps", "node ms", "n", "sim ms", "n", "sim/node"))
    err = 0.0
    for i, (name, _) in enumerate(KINDS):
        got = [n[i][0] for n in nodes if n[i][1] > 0]
        node = statistics.mean(got) if got else float("nan")
        count = sum(n[i][1] for n in nodes)
        s, sn = sim[i]
        ratio = s / node if got and sn else float("nan")
        if not math.isnan(ratio):
            err += abs(math.log(ratio))
        print("%-17s %10.1f %6d %10.1f %6d %7.3f" % (name, node, count, s, sn, ratio))
    print("error (sum of |ln(sim/node)|): %.3f" % err)


if __name__ == "__main__":
    main()
