#!/usr/bin/env python3
"""Lines up a node's arbitration log with the simulator's, request by request.

A node logs each change in a queued request's arbitration state with
node.arbitration.log_decisions: true (LOG_ARBITRATION=true in
deploy/gpu-host's sim-validate.sh and remap-validate.sh); `ballast simulate
--step-log` writes the same changes to arbitration-<rate>.csv
(node_manager/arbitration_log.h says what each one means). For each request
of the replay this prints, on both sides: when it was first judged late and
how many times its state flipped, how often its model refused it for KV
room, how long it queued, its predicted cost and its model's cost fit when
it was first queued, and (from the requests CSVs) its preemptions and
whether it met its TTFT SLO. Then a summary per model. Where the two part
(the node judging late what the simulator serves on time, or refusing for
KV what it admits) says why a simulated run's attainment departs from the
daemon's.

The node's requests carry its own attempt ids; they are matched to the
trace's by model, prompt tokens and arrival: the harness's clock is set
where most (model, tokens) pairs agree, then each node request takes the
request of its model and tokens that arrived nearest (within --match-ms).

Usage: scripts/arbitration-timeline.py SERVE_LOG[.gz|.xz] NODE_REQUESTS_CSV
       SIM_ARBITRATION_CSV SIM_REQUESTS_CSV [--model NAME] [--differ]
       [--match-ms 50]
"""
import argparse
import collections
import csv
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from log_open import open_log  # noqa: E402

LINE = re.compile(
    r"arbitration (\S+) at ([0-9.]+): (\S+) (\S+) (\w+); (\d+) tokens, arrived (-?[0-9.]+) s, "
    r"start (-?[0-9.]+) ms, deadline (-?[0-9.]+) ms, cost (-?[0-9.]+) ms, queued ([0-9.]+) ms; "
    r"fit ([0-9.]+) ms \+ ([0-9.]+) ms/token over (\d+) steps")


def node_events(path):
    """Each node request's events: id -> dict(model, tokens, arrival (unix
    seconds), events [(t, event, start_ms, deadline_ms, cost_ms, queued_ms,
    fit_ms, fit_ms_per_token)])."""
    reqs = {}
    with open_log(path) as f:
        for line in f:
            if "arbitration " not in line:
                continue
            m = LINE.search(line)
            if not m:
                continue
            g = m.groups()
            t = float(g[1])
            r = reqs.setdefault(g[2], dict(model=g[3], tokens=int(g[5]),
                                           arrival=t + float(g[6]), events=[]))
            r["events"].append((t, g[4], float(g[7]), float(g[8]), float(g[9]), float(g[10]),
                                float(g[11]), float(g[12])))
    if not reqs:
        sys.exit("no arbitration lines in %s (set node.arbitration.log_decisions: true)" % path)
    return reqs


def sim_events(path):
    """The simulator's events by trace request id, in the node's form
    (t: simulated seconds; arrival likewise)."""
    reqs = {}
    for r in csv.DictReader(open_log(path)):
        t = float(r["t_s"])
        q = reqs.setdefault(r["request"], dict(model=r["model"], tokens=int(r["tokens"]),
                                               arrival=t + float(r["arrival_ms"]) / 1e3,
                                               events=[]))
        q["events"].append((t, r["event"], float(r["start_ms"]), float(r["deadline_ms"]),
                            float(r["cost_ms"]), float(r["queued_ms"]), float(r["fit_ms"]),
                            float(r["fit_ms_per_token"])))
    return reqs


def match(node, rows, match_ms):
    """Node request id -> trace id (rows: the node run's requests CSV)."""
    by_key = collections.defaultdict(list)
    for r in rows:
        by_key[(r["model"], int(r["prompt_tokens"]))].append(float(r["send_s"]))
    votes = collections.Counter()
    for q in node.values():
        for send in by_key.get((q["model"], q["tokens"]), []):
            votes[round((q["arrival"] - send) * 100)] += 1  # 10 ms bins
    if not votes:
        sys.exit("no node request matches the requests CSV by model and prompt tokens")
    best = votes.most_common(1)[0][0]
    # The bin and its neighbours, weighted, give the clock's offset.
    near = [(b, votes[b]) for b in (best - 1, best, best + 1)]
    t0 = sum(b * n for b, n in near) / sum(n for _, n in near) / 100
    ids = {}
    taken = set()
    for nid, q in sorted(node.items(), key=lambda kv: kv[1]["arrival"]):
        cands = [r for r in rows if r["model"] == q["model"]
                 and int(r["prompt_tokens"]) == q["tokens"] and r["id"] not in taken]
        if not cands:
            continue
        r = min(cands, key=lambda r: abs(q["arrival"] - t0 - float(r["send_s"])))
        if abs(q["arrival"] - t0 - float(r["send_s"])) * 1e3 <= match_ms:
            ids[nid] = r["id"]
            taken.add(r["id"])
    return ids


def digest(q):
    """A request's events in a few figures (times from its arrival, ms)."""
    if q is None:
        return None
    ev = q["events"]
    # Late when first queued (its prefill's predicted end past its
    # deadline), or at its first "late" event.
    queued_late = ev[0][1] == "queued" and ev[0][2] + ev[0][4] > ev[0][3]
    late_at = ev[0][0] if queued_late else next((t for t, e, *_ in ev if e == "late"), None)
    flips = sum(1 for _, e, *_ in ev if e in ("late", "on_time"))
    left = next((x for x in ev if x[1] in ("left", "rejected")), None)
    return dict(
        late_ms=None if late_at is None else (late_at - q["arrival"]) * 1e3,
        flips=flips,
        kv=sum(1 for _, e, *_ in ev if e == "kv_refused"),
        queued_ms=None if left is None else left[5],
        cost_ms=ev[0][4],
        fit=(ev[0][6], ev[0][7]))


def fmt(d, row):
    if d is None:
        return "%-44s" % "(not seen)"
    late = "-" if d["late_ms"] is None else "%.0f" % d["late_ms"]
    queued = "-" if d["queued_ms"] is None else "%.0f" % d["queued_ms"]
    met = row["ttft_met"] if row else "?"
    pre = row["preemptions"] if row else "?"
    return "%6s %2d %2d %7s %6.1f %4s %3s" % (late, d["flips"], d["kv"], queued, d["cost_ms"], met,
                                             pre)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("log")
    ap.add_argument("node_requests")
    ap.add_argument("sim_arbitration")
    ap.add_argument("sim_requests")
    ap.add_argument("--model")
    ap.add_argument("--differ", action="store_true",
                    help="only requests whose TTFT met differs between the two")
    ap.add_argument("--match-ms", type=float, default=50.0)
    a = ap.parse_args()
    node = node_events(a.log)
    node_rows = list(csv.DictReader(open_log(a.node_requests)))
    sim = sim_events(a.sim_arbitration)
    sim_by_id = {r["id"]: r for r in csv.DictReader(open_log(a.sim_requests))}
    ids = match(node, node_rows, a.match_ms)
    node_by_trace = {tid: node[nid] for nid, tid in ids.items()}
    cols = "%6s %2s %2s %7s %6s %4s %3s" % ("late", "fl", "kv", "queued", "cost", "met", "pre")
    print("%-6s %-5s %8s %6s | %-44s | %s" % ("id", "model", "release", "tokens", "node", "simulator"))
    print("%-6s %-5s %8s %6s | %s | %s" % ("", "", "s", "", cols, cols))
    summary = collections.defaultdict(lambda: collections.Counter())
    for r in sorted(node_rows, key=lambda r: float(r["release_s"])):
        if a.model not in (None, r["model"]):
            continue
        srow = sim_by_id.get(r["id"])
        if a.differ and srow is not None and srow["ttft_met"] == r["ttft_met"]:
            continue
        dn, ds = digest(node_by_trace.get(r["id"])), digest(sim.get(r["id"]))
        for side, d, row in (("node", dn, r), ("sim", ds, srow)):
            s = summary[(r["model"], side)]
            s["requests"] += 1
            if row is not None:
                s["met"] += int(row["ttft_met"])
                s["preempted"] += int(int(row["preemptions"]) > 0)
            if d is not None:
                s["seen"] += 1
                s["late"] += int(d["late_ms"] is not None)
                s["kv_refused"] += int(d["kv"] > 0)
        print("%-6s %-5s %8.2f %6s | %s | %s" % (r["id"], r["model"], float(r["release_s"]),
                                                 r["prompt_tokens"], fmt(dn, r), fmt(ds, srow)))
    print("\nlate: ms from arrival to the first decision that judged it late (- never); fl: "
          "late/on-time flips; kv: times refused for KV; queued: ms in the queue; cost: its "
          "predicted prefill ms when first queued; pre: preemptions")
    print("\n%-6s %-5s %9s %5s %5s %5s %10s %10s" % ("model", "side", "requests", "seen", "met",
                                                     "late", "kv_refused", "preempted"))
    for (model, side), s in sorted(summary.items()):
        print("%-6s %-5s %9d %5d %5d %5d %10d %10d" % (model, side, s["requests"], s["seen"],
                                                        s["met"], s["late"], s["kv_refused"],
                                                        s["preempted"]))
    print("\nnode requests matched to the trace: %d of %d logged" % (len(ids), len(node)))


if __name__ == "__main__":
    main()
