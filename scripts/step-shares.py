#!/usr/bin/env python3
"""How the GPU was shared between models' steps on a node, against the
simulator's sharing rule.

Reads a node's per-step log (SLOW_STEP_MS=0.001, its last run: the steps
after the last stretch of at least 0.5 s with none in flight), asks
`ballast simulate steps` for each step's time alone (the calibrated engine
model), and measures each decode-only step's share of the GPU: its time
alone over its period (the gap between its model's collections while the
model stepped back to back). It prints:
  * decode steps with no other model's step in flight: period over time
    alone, by decode rows (1.0: the engine model's alone time holds);
  * decode steps beside one other model's prefill step of >= 1,024 tokens:
    the share measured, and the share the rolling rule gives
    (policy.rolling_share_exponent: work to that power);
  * decode steps beside one other model's decode steps, by both sides'
    rows: the share of each, and their sum (above 1: the steps overlap).

Usage: scripts/step-shares.py SERVE_LOG[.gz] --ballast build/server/ballast
       [--calibration configs/sim/calibration-h200.json] [--shape llama-8b]
"""
import argparse
import collections
import csv
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile

_here = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("step_timeline",
                                               os.path.join(_here, "step-timeline.py"))
timeline = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(timeline)
sys.path.insert(0, _here)
from run_start import run_start  # noqa: E402
WORK = ["decode_tokens", "decode_context", "prefill_tokens", "prefill_attention", "prefill_logits"]


def last_run(path):
    """The last run's steps, each a dict with the work, launch and collection."""
    steps = []
    opener = timeline.gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        for line in f:
            m = timeline.step_log.STEP.search(line) if "slow step" in line else None
            if m:
                g = m.groups()
                steps.append(dict(model=g[0], prefill_tokens=int(g[2]), decode_tokens=int(g[3]),
                                  decode_context=int(g[4]), prefill_attention=int(g[5]),
                                  prefill_logits=int(g[6]), launch=int(g[7]),
                                  collected=int(g[8])))
    if not steps:
        sys.exit("no steps with their work in %s (SLOW_STEP_MS=0.001)" % path)
    steps.sort(key=lambda s: s["launch"])
    spans = [(s["model"], s["launch"] / 1e6, s["collected"] / 1e6) for s in steps]
    return steps[run_start(spans, 0.5):]


def predict(steps, ballast, calibration, shape):
    """Each step's time alone (ms), by `ballast simulate steps --out`."""
    with tempfile.TemporaryDirectory() as d:
        src, out = os.path.join(d, "steps.csv"), os.path.join(d, "pred.csv")
        with open(src, "w") as f:
            f.write(",".join(WORK) + ",ms\n")
            for s in steps:
                f.write(",".join(str(s[c]) for c in WORK) + ",-1\n")
        subprocess.run([ballast, "simulate", "steps", "--calibration", calibration, "--shape",
                        shape, "--steps", src, "--out", out], check=True,
                       stdout=subprocess.DEVNULL)
        for s, row in zip(steps, csv.DictReader(open(out))):
            s["alone"] = float(row["predicted_ms"])


def periods(steps):
    """(step, others in flight during its period, period ms) for each
    decode-only step whose model stepped back to back."""
    by = collections.defaultdict(list)
    for s in steps:
        by[s["model"]].append(s)
    out = []
    for model, mine in by.items():
        mine.sort(key=lambda s: s["collected"])
        for prev, cur in zip(mine, mine[1:]):
            if cur["launch"] > prev["collected"] or cur["prefill_tokens"] > 0:
                continue
            lo, hi = prev["collected"], cur["collected"]
            others = [s for s in steps if s["model"] != model and s["collected"] > lo and
                      s["launch"] < hi]
            out.append((cur, others, (hi - lo) / 1e3))
    return out


def rows_class(n):
    return "1-2" if n <= 2 else "3-8" if n <= 8 else ">8"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("log")
    ap.add_argument("--ballast", required=True)
    ap.add_argument("--calibration", default="configs/sim/calibration-h200.json")
    ap.add_argument("--shape", default="llama-8b")
    a = ap.parse_args()
    steps = last_run(a.log)
    predict(steps, a.ballast, a.calibration, a.shape)
    alone, beside_prefill = collections.defaultdict(list), []
    pairs, sums = collections.defaultdict(list), collections.defaultdict(list)
    for s, others, d in periods(steps):
        if not others:
            alone[rows_class(s["decode_tokens"])].append(d / s["alone"])
            continue
        if len({o["model"] for o in others}) != 1:
            continue
        big = [o for o in others if o["prefill_tokens"] >= 1024]
        if big:
            beside_prefill.append((s["alone"] / d, s["alone"], max(o["alone"] for o in big)))
            continue
        if any(o["prefill_tokens"] > 0 for o in others):
            continue
        done = [o for o in others if s["collected"] - d * 1e3 < o["collected"] <= s["collected"]]
        if not done:
            continue
        share = s["alone"] / d
        key = (rows_class(s["decode_tokens"]),
               rows_class(statistics.mean(o["decode_tokens"] for o in done)))
        pairs[key].append(share)
        sums[key].append(share + sum(o["alone"] for o in done) / d)
    print("decode steps alone: period / time alone, by rows")
    for k in sorted(alone):
        print("  rows %-4s n %5d  median %.3f" % (k, len(alone[k]), statistics.median(alone[k])))
    if beside_prefill:
        share = statistics.median(b[0] for b in beside_prefill)
        pa = statistics.median(b[1] for b in beside_prefill)
        pb = statistics.median(b[2] for b in beside_prefill)
        print("decode beside a >= 1,024-token prefill: n %d, share %.2f (median; decode %.1f ms, "
              "prefill %.1f ms alone)" % (len(beside_prefill), share, pa, pb))
        for e in (1, 0.5, 0):
            print("  rolling_share_exponent %.1f gives %.2f" % (e, pa**e / (pa**e + pb**e)))
    print("decode beside one other model's decodes: this step's share, and both shares' sum")
    for k in sorted(pairs):
        print("  rows %-4s beside %-4s n %5d  share %.2f  sum %.2f" %
              (k[0], k[1], len(pairs[k]), statistics.median(pairs[k]), statistics.median(sums[k])))


if __name__ == "__main__":
    main()
