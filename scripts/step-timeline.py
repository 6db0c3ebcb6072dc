#!/usr/bin/env python3
"""Lines up a node's steps with the simulator's, window by window.

A node logs every step when node.engine.slow_step_warn_ms is at or below
its steps' times (SLOW_STEP_MS=0.001 in deploy/gpu-host's scripts);
`ballast simulate --step-log` writes the simulated run's steps to
steps-<rate>.csv. For each window of the run and each model this prints
what both did: steps, decode rows per step, KV tokens the decodes attended
over per step, prefill tokens, and (simulator only) its running and queued
requests and the GPU's lent weight layers (every model's) at the
window's last step. Where the two
part (a model stepping less often, holding fewer sequences, or admitting
later) says where a simulated run's attainment departs from the daemon's.

The node's run begins after a stretch of at least --gap-s with no step in
flight: the one that puts each model's first step closest to the
simulator's (scripts/run_start.py; at a low rate a run can idle that long
inside it; --last-gap takes the last such stretch). Its clock starts at
that run's first launch; the simulator's at its first step's start (both at the first
request's arrival, give or take the node's admission).

Usage: scripts/step-timeline.py SERVE_LOG[.gz] SIM_STEPS_CSV [--window-s 1]
       [--from-s 0] [--to-s inf] [--gap-s 0.5] [--model NAME] [--last-gap]
"""
import argparse
import collections
import csv
import importlib.util
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from log_open import open_log  # noqa: E402
from run_start import first_steps, run_start  # noqa: E402

_spec = importlib.util.spec_from_file_location(
    "step_log", os.path.join(os.path.dirname(os.path.abspath(__file__)), "step-log.py"))
step_log = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(step_log)


def node_steps(path, gap_s, sim_first=None):
    """Every model's logged steps of the measured run: (model, start_s,
    end_s, decodes, kv_tokens, prefill_tokens), seconds from the run's
    start."""
    steps = []
    with open_log(path) as f:
        for line in f:
            m = step_log.STEP.search(line) if "slow step" in line else None
            if m:
                g = m.groups()
                steps.append((g[0], int(g[7]) / 1e6, int(g[8]) / 1e6, int(g[3]), int(g[4]),
                              int(g[2])))
    if not steps:
        sys.exit("no steps with their work and times in %s (log every step: SLOW_STEP_MS=0.001)"
                 % path)
    steps.sort(key=lambda s: s[1])
    first = run_start(steps, gap_s, sim_first)
    t0 = steps[first][1]
    return [(s[0], s[1] - t0, s[2] - t0, s[3], s[4], s[5]) for s in steps[first:]]


def sim_steps(path):
    """The simulated steps (a stretch of n steps counted as n), seconds
    from the first step's start, and the state columns."""
    rows = list(csv.DictReader(open(path)))
    if not rows:
        sys.exit("%s: no steps (run `ballast simulate ... --step-log`)" % path)
    t0 = min(float(r["start_s"]) for r in rows)
    out = []
    for r in rows:
        n = int(r["steps"])
        out.append(dict(model=r["model"], start=float(r["start_s"]) - t0,
                        end=float(r["end_s"]) - t0, n=n, decodes=int(r["decode_tokens"]) * n,
                        kv=float(r["decode_context"]) * n, prefill=int(r["prefill_tokens"]),
                        running=int(r["running"]), waiting=int(r["waiting"]),
                        lent=int(r["device_lent"])))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("log")
    ap.add_argument("sim")
    ap.add_argument("--window-s", type=float, default=1.0)
    ap.add_argument("--from-s", type=float, default=0.0)
    ap.add_argument("--to-s", type=float, default=float("inf"))
    ap.add_argument("--gap-s", type=float, default=0.5)
    ap.add_argument("--model")
    ap.add_argument("--last-gap", action="store_true",
                    help="the node's run begins after its last stretch of --gap-s idle "
                    "(by default, after the one that lines its models' first steps up "
                    "with the simulator's)")
    a = ap.parse_args()
    if a.window_s <= 0:
        sys.exit("--window-s must be > 0")

    def key(t):
        return int(t // a.window_s)

    node = collections.defaultdict(lambda: [0, 0, 0, 0])  # steps, decodes, kv, prefill
    simulated = sim_steps(a.sim)
    sim_first = None if a.last_gap else first_steps(
        [(s["model"], s["start"]) for s in simulated])
    for model, _, end, dec, kv, pre in node_steps(a.log, a.gap_s, sim_first):
        if a.model in (None, model) and a.from_s <= end < a.to_s:
            v = node[(key(end), model)]
            v[0] += 1
            v[1] += dec
            v[2] += kv
            v[3] += pre
    sim = collections.defaultdict(lambda: [0, 0, 0, 0, 0, 0, 0])
    for s in simulated:
        if a.model in (None, s["model"]) and a.from_s <= s["end"] < a.to_s:
            v = sim[(key(s["end"]), s["model"])]
            v[0] += s["n"]
            v[1] += s["decodes"]
            v[2] += s["kv"]
            v[3] += s["prefill"]
            v[4:] = [s["running"], s["waiting"], s["lent"]]
    print("%8s %-8s | %-38s | %-38s | sim at the window's end" % ("window", "model",
                                                                "node", "simulator"))
    cols = "%6s %8s %9s %9s" % ("steps", "rows", "KV/step", "prefill")
    print("%8s %-8s | %s | %s | %7s %7s %4s" % ("s", "", cols, cols, "running", "waiting",
                                                "lent"))
    for k in sorted(set(node) | set(sim)):
        n, s = node.get(k, [0, 0, 0, 0]), sim.get(k, [0, 0, 0, 0, 0, 0, 0])

        def part(v):
            steps = max(v[0], 1)
            return "%6d %8.1f %9.0f %9d" % (v[0], v[1] / steps, v[2] / steps, v[3])
        print("%8.1f %-8s | %s | %s | %7d %7d %4d" % (k[0] * a.window_s, k[1], part(n), part(s),
                                                      s[4], s[5], s[6]))


if __name__ == "__main__":
    main()
