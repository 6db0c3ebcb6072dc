#!/usr/bin/env python3
"""Turns a node's per-step log into the CSV `ballast simulate steps` reads.

The node logs every step when node.engine.slow_step_warn_ms is at or below
its steps' times (offline-bench.sh: SLOW_STEP_MS=0.001): its phases, its
work as the simulator counts it (decodes and the KV they attend over,
prefill tokens and their query x key pairs, prompts completed) and when its
end was collected, in Unix microseconds.

A step's measured time (`ms`) is the gap between its collection and the
previous step's while the device had the next step queued before the
previous one ended (its launch began before that collection): that gap is
device time. Otherwise (the device was idle before it) it is the time
from its launch to its collection, or -1 (not measured) when the next
step began before that collection, which it may then have delayed. The collections of two steps can fall
close together and the next one late, so read sums over many steps, not
single steps.

Each row also has `collected_us`, the step's collection time (Unix
microseconds), to find a run of steps in a kernel trace
(deploy/gpu-host/kernel-trace.py --wall).

Usage: scripts/step-log.py SERVE_LOG[.gz] [--from-prefill-tokens N] > steps.csv
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
    r"slow step, [0-9.]+ ms \((\d+) chunks, (\d+) prefill tokens, \d+ loads\): inbox and tasks "
    r"([0-9.]+), plan ([0-9.]+), KV loads ([0-9.]+), launch ([0-9.]+), wait ([0-9.]+), tokens "
    r"and finishes ([0-9.]+); ([0-9.]+) from begin to end.*work: (\d+) decodes over (\d+) KV "
    r"tokens, (\d+) prefill pairs, (\d+) prompts done; collected at (\d+) us")


def read(path):
    opener = gzip.open if path.endswith(".gz") else open
    steps = []
    with opener(path, "rt") as f:
        for line in f:
            m = STEP.search(line)
            if not m:
                continue
            g = m.groups()
            inbox, plan, loads, launch, wait, tokens, begin_to_end = map(float, g[2:9])
            collected = int(g[13])
            began = collected + (tokens - begin_to_end) * 1e3
            steps.append(dict(prefill_tokens=int(g[1]), decode_tokens=int(g[9]),
                              decode_context=int(g[10]), prefill_attention=int(g[11]),
                              prefill_logits=int(g[12]), collected=collected,
                              launch_start=began + (inbox + plan + loads) * 1e3))
    return steps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("log")
    ap.add_argument("--from-prefill-tokens", type=int, default=0)
    a = ap.parse_args()
    steps = read(a.log)
    first = 0
    if a.from_prefill_tokens > 0:
        # The last step to start on an idle device that is, or is followed
        # by, a step of that many prefill tokens.
        starts = [i for i in range(1, len(steps) - 1)
                  if steps[i]["launch_start"] >= steps[i - 1]["collected"]
                  and max(steps[i]["prefill_tokens"], steps[i + 1]["prefill_tokens"])
                  >= a.from_prefill_tokens]
        if not starts:
            sys.exit("no step of %d prefill tokens after an idle device" % a.from_prefill_tokens)
        first = starts[-1]
    cols = ["decode_tokens", "decode_context", "prefill_tokens", "prefill_attention",
            "prefill_logits"]
    print(",".join(cols + ["ms", "collected_us"]))
    for i in range(first, len(steps)):
        s = steps[i]
        prev = steps[i - 1]["collected"] if i > 0 else None
        busy = prev is not None and s["launch_start"] < prev
        ms = (s["collected"] - (prev if busy else s["launch_start"])) / 1e3
        # A step that started an idle device but whose successor began
        # before its collection: the successor's launch (blocking while the
        # device's queue is full) delayed that collection. Not measured.
        nxt = steps[i + 1] if i + 1 < len(steps) else None
        if not busy and nxt is not None and nxt["launch_start"] < s["collected"]:
            ms = -1
        print(",".join(str(s[c]) for c in cols) + ",%.3f,%d" % (ms, s["collected"]))


if __name__ == "__main__":
    main()
