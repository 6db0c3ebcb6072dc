#!/usr/bin/env python3
"""Per-thread CPU of a process over an interval, with the machine's.

Usage: thread-cpu.py PID [SECONDS] [TOP]
Prints the machine's busy share of all cores, the process' total in cores,
and its TOP busiest threads by name (threads of one name summed, with their
count and the busiest one's share): a thread at 100% of a core is a
serialization point; all cores busy means the host is the limit.
"""
import collections, os, sys, time

def threads(pid):
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                s = f.read()
        except OSError:
            continue
        name = s[s.index("(") + 1:s.rindex(")")]
        fields = s[s.rindex(")") + 2:].split()
        out[tid] = (name, int(fields[11]) + int(fields[12]))  # utime + stime
    return out

def machine():
    with open("/proc/stat") as f:
        v = list(map(int, f.readline().split()[1:]))
    return sum(v), v[3] + v[4]

pid, secs, top = sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 1.0, \
    int(sys.argv[3]) if len(sys.argv) > 3 else 8
hz = os.sysconf("SC_CLK_TCK")
a, (ta, ia) = threads(pid), machine()
time.sleep(secs)
b, (tb, ib) = threads(pid), machine()
busy = 1 - (ib - ia) / max(tb - ta, 1)
per = collections.defaultdict(lambda: [0.0, 0, 0.0])
for tid, (name, t) in b.items():
    d = (t - a.get(tid, (name, t))[1]) / hz / secs
    g = per[name]
    g[0] += d; g[1] += 1; g[2] = max(g[2], d)
total = sum(g[0] for g in per.values())
print(f"machine busy {busy:.0%} of {os.cpu_count()} cores; process {total:.2f} cores")
for name, (s, n, mx) in sorted(per.items(), key=lambda kv: -kv[1][0])[:top]:
    print(f"  {name:<16} {s:5.2f} cores over {n:3d} threads (busiest {mx:.0%})")
