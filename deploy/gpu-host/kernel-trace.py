#!/usr/bin/env python3
"""Summarises a kernel timeline written by kernel_trace.cc (CUPTI).

Usage: kernel-trace.py TRACE.csv [--window START END | --wall T0 T1]
                       [--last F] [--middle F] [--step-kernel REGEX] [--histogram S]

--window: seconds from the first kernel's start. --wall: wall-clock epoch
seconds (the trace's `# clock` line maps them), e.g. a benchmark's timed
run; --last F keeps the last fraction F of the span; --middle F keeps the middle fraction F of that span (default 1).
Prints, for the window: the device's busy share (the union of kernel
intervals), the mean number of kernels running at once, and per stream
its steps (launches of the step's first kernel, --step-kernel, default
Embedding), kernel time per step, the idle gaps between its kernels per
step; then every kernel name's count per step and mean duration, over all
streams. --histogram S: kernel launches per S seconds over the whole trace
(to find the window).
"""
import argparse
import collections
import re
import sys


def short(name):
    name = re.sub(r"ballast::engine::cuda::(\(anonymous namespace\)::)?", "", name)
    return name if len(name) <= 90 else name[:87] + "..."


def load(path):
    clock = None
    rows = []
    with open(path) as f:
        for line in f:
            if line.startswith("# clock"):
                _, _, cupti, real = line.split()
                clock = (int(cupti), int(real))
                continue
            if line.startswith("#"):
                print(line.strip(), file=sys.stderr)
                continue
            p = line.rstrip("\n").split(",", 7)
            rows.append((int(p[0]), int(p[1]), int(p[3]), p[7]))
    rows.sort()
    return clock, rows


def union_busy(rows):
    busy, end = 0, None
    for s, e, _, _ in rows:
        if end is None or s > end:
            busy += e - s
            end = e
        elif e > end:
            busy += e - end
            end = e
    return busy


GAP_EDGES_US = (5, 20, 100, 500, 2000)


def gap_sizes(rs, steps):
    """The stream's idle gaps between kernels, per step: count and ms by size."""
    n = [0] * (len(GAP_EDGES_US) + 1)
    t = [0] * (len(GAP_EDGES_US) + 1)
    for i in range(1, len(rs)):
        g = rs[i][0] - rs[i - 1][1]
        if g <= 0:
            continue
        b = sum(1 for e in GAP_EDGES_US if g >= e * 1e3)
        n[b] += 1
        t[b] += g
    labels = ["<5us"] + [">=%dus" % e for e in GAP_EDGES_US]
    return ", ".join("%s %.2f (%.3f ms)" % (l, c / steps, d / steps / 1e6)
                     for l, c, d in zip(labels, n, t))


def timeline(win, lo, hi, width):
    """Per bin of `width` seconds: the device's busy share, kernels at once."""
    w = int(width * 1e9)
    nb = max(1, (hi - lo) // w)
    busy = [[] for _ in range(nb)]
    for s, e, st, n in win:
        for b in range(max(0, (s - lo) // w), min(nb, (e - lo) // w + 1)):
            bs, be = lo + b * w, lo + (b + 1) * w
            if min(e, be) > max(s, bs):
                busy[b].append((max(s, bs), min(e, be), st, n))
    for b, rs in enumerate(busy):
        rs.sort()
        total = sum(e - s for s, e, _, _ in rs)
        print("%8.3f s: busy %5.1f%%, kernels at once %.2f, streams %d" %
              (b * width, 100 * union_busy(rs) / w, total / w, len({r[2] for r in rs})))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--window", nargs=2, type=float)
    ap.add_argument("--wall", nargs=2, type=float)
    ap.add_argument("--middle", type=float, default=1.0)
    ap.add_argument("--last", type=float)
    ap.add_argument("--step-kernel", default="Embedding")
    ap.add_argument("--histogram", type=float)
    ap.add_argument("--bins", type=float)
    a = ap.parse_args()
    clock, rows = load(a.trace)
    if not rows:
        sys.exit("no kernels in " + a.trace)
    t_first = rows[0][0]
    if a.histogram:
        bins = collections.Counter(int((s - t_first) / 1e9 / a.histogram) for s, _, _, _ in rows)
        for b in range(max(bins) + 1):
            print("%8.2f s %7d" % (b * a.histogram, bins.get(b, 0)))
    lo, hi = rows[0][0], max(r[1] for r in rows)
    if a.window:
        lo, hi = t_first + int(a.window[0] * 1e9), t_first + int(a.window[1] * 1e9)
    if a.wall:
        if clock is None:
            sys.exit("the trace has no `# clock` line")
        off = clock[1] - clock[0]  # realtime = cupti + off
        lo, hi = int(a.wall[0] * 1e9) - off, int(a.wall[1] * 1e9) - off
    if a.last:
        lo = int(hi - (hi - lo) * a.last)
    cut = (hi - lo) * (1 - a.middle) / 2
    lo, hi = int(lo + cut), int(hi - cut)
    win = [r for r in rows if r[0] >= lo and r[1] <= hi]
    span = (hi - lo) / 1e9
    if not win:
        sys.exit("no kernels in the window")
    total = sum(e - s for s, e, _, _ in win)
    print("window %.3f s, %d kernels; device busy %.1f%%; kernels at once (mean) %.2f" %
          (span, len(win), 100 * union_busy(win) / (hi - lo), total / (hi - lo)))
    if a.bins:
        timeline(win, lo, hi, a.bins)
    step_re = re.compile(a.step_kernel)
    by_stream = collections.defaultdict(list)
    for r in win:
        by_stream[r[2]].append(r)
    all_steps = 0
    for st, rs in sorted(by_stream.items()):
        steps = sum(1 for r in rs if step_re.search(r[3]))
        all_steps += steps
        k = sum(e - s for s, e, _, _ in rs)
        gaps = sum(max(0, rs[i][0] - rs[i - 1][1]) for i in range(1, len(rs)))
        per = max(steps, 1)
        print("stream %4d: %6d kernels, %5d steps (%.3f ms apart); per step: kernels %.3f ms,"
              " gaps %.3f ms, %.1f kernels" %
              (st, len(rs), steps, 1e3 * span / per, k / per / 1e6, gaps / per / 1e6, len(rs) / per))
        print("             gaps per step by size: " + gap_sizes(rs, per))
    per = max(all_steps, 1)
    names = collections.defaultdict(lambda: [0, 0])
    for s, e, _, n in win:
        names[n][0] += 1
        names[n][1] += e - s
    print("%-90s %8s %9s %9s %6s" % ("kernel", "per step", "mean us", "ms/step", "share"))
    for n, (c, d) in sorted(names.items(), key=lambda x: -x[1][1]):
        print("%-90s %8.2f %9.2f %9.4f %5.1f%%" %
              (short(n), c / per, d / c / 1e3, d / per / 1e6, 100 * d / total))


if __name__ == "__main__":
    main()
