#!/usr/bin/env python3
"""Turns a node's per-step log into the CSV `ballast simulate steps` reads.

The node logs every step when node.engine.slow_step_warn_ms is at or below
its steps' times (offline-bench.sh: SLOW_STEP_MS=0.001): its phases, its
work as the simulator counts it (decodes and the KV they attend over,
prefill tokens and their query x key pairs, prompts completed), when its
launch began and when its end was collected, in Unix microseconds.

A step's measured time (`ms`) is the gap between its collection and the
previous step's while the device had the next step queued before the
previous one ended (its launch began before that collection): that gap is
device time. Otherwise (the device was idle before it) it is the time
from its launch to its collection, or -1 (not measured) when the next
step began before that collection, which it may then have delayed. The
collections of two steps can fall close together and the next one late,
so read sums over many steps, not single steps.

Each row also has `collected_us`, the step's collection time (Unix
microseconds; divide by 1e6 for deploy/gpu-host/kernel-trace.py --wall,
which takes seconds), to find a run of steps in a kernel trace.

Usage: scripts/step-log.py SERVE_LOG[.gz] [--model NAME] [--from-prefill-tokens N] > steps.csv
  --model NAME: that model's steps (required when the log holds several:
  each model steps on its own).
  --from-prefill-tokens N: start at the last step that began on an idle
  device and is, or is followed by, a step of at least N prefill tokens
  (the last run of a log that holds a warm-up run first; 0 keeps every
  step).
"""
import argparse
import gzip
import re
import sys

STEP = re.compile(
    r"model (\S+): slow step, [0-9.]+ ms \((\d+) chunks, (\d+) prefill tokens, \d+ loads\): "
    r".*work: (\d+) decodes over (\d+) KV tokens, (\d+) prefill pairs, (\d+) prompts done; "
    r"launched at (\d+) us, collected at (\d+) us")


def read(path, model):
    """The steps logged for `model` (None: the log's only model)."""
    opener = gzip.open if path.endswith(".gz") else open
    steps, models, unparsed = [], set(), 0
    with opener(path, "rt") as f:
        for line in f:
            if "slow step" not in line:
                continue
            m = STEP.search(line)
            if not m:
                unparsed += 1
                continue
            g = m.groups()
            models.add(g[0])
            if model is not None and g[0] != model:
                continue
            steps.append(dict(model=g[0], prefill_tokens=int(g[2]), decode_tokens=int(g[3]),
                              decode_context=int(g[4]), prefill_attention=int(g[5]),
                              prefill_logits=int(g[6]), launch_start=int(g[7]),
                              collected=int(g[8])))
    if unparsed:
        print("step-log.py: %d slow-step lines without the work and times (a log from an older "
              "ballast?) were skipped" % unparsed, file=sys.stderr)
    if model is None and len(models) > 1:
        sys.exit("the log holds the steps of %s: pick one with --model" % ", ".join(sorted(models)))
    if not steps:
        sys.exit("no steps with their work in %s%s" % (path, " for " + model if model else ""))
    return steps


def first_of_last_run(steps, prefill_tokens):
    """The last step that began on an idle device and is, or is followed
    by, a step of at least `prefill_tokens` prefill tokens."""
    starts = []
    for i, s in enumerate(steps):
        idle = i == 0 or s["launch_start"] >= steps[i - 1]["collected"]
        big = max(s["prefill_tokens"],
                  steps[i + 1]["prefill_tokens"] if i + 1 < len(steps) else 0)
        if idle and big >= prefill_tokens:
            starts.append(i)
    if not starts:
        sys.exit("no step of %d prefill tokens after an idle device" % prefill_tokens)
    return starts[-1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("log")
    ap.add_argument("--model")
    ap.add_argument("--from-prefill-tokens", type=int, default=0)
    a = ap.parse_args()
    steps = read(a.log, a.model)
    first = first_of_last_run(steps, a.from_prefill_tokens) if a.from_prefill_tokens > 0 else 0
    cols = ["decode_tokens", "decode_context", "prefill_tokens", "prefill_attention",
            "prefill_logits"]
    print(",".join(cols + ["ms", "collected_us"]))
    for i in range(first, len(steps)):
        s = steps[i]
        prev = steps[i - 1]["collected"] if i > 0 else None
        busy = prev is not None and s["launch_start"] < prev
        ms = (s["collected"] - (prev if busy else s["launch_start"])) / 1e3
        nxt = steps[i + 1] if i + 1 < len(steps) else None
        if not busy and nxt is not None and nxt["launch_start"] < s["collected"]:
            ms = -1
        print(",".join(str(s[c]) for c in cols) + ",%.3f,%d" % (ms, s["collected"]))


if __name__ == "__main__":
    main()
