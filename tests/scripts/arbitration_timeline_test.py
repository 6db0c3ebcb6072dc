#!/usr/bin/env python3
"""scripts/arbitration-timeline.py on a node log, requests CSVs and a
simulated arbitration CSV written here, its output worked out by hand.

Usage (ctest runs it): arbitration_timeline_test.py SCRIPTS_DIR
"""
import os
import subprocess
import sys
import tempfile
import unittest

SCRIPTS = None


def line(at, rid, model, event, tokens, arrived, start, deadline, cost, queued):
    """One node.arbitration.log_decisions line (device_worker_arbitration.cc)."""
    return ("[2026-12-04 10:00:00.000] [ballast] [info] arbitration cuda:0 at %.6f: %s %s %s; "
            "%d tokens, arrived %.6f s, start %.3f ms, deadline %.3f ms, cost %.3f ms, queued "
            "%.3f ms; fit 10.000 ms + 0.050000 ms/token over 8 steps; 2 queued, KV free 100 MiB\n"
            % (at, rid, model, event, tokens, arrived, start, deadline, cost, queued))


REQ_HEADER = "id,model,release_s,send_s,prompt_tokens,ttft_met,preemptions\n"
ARB_HEADER = ("gpu,t_s,request,model,event,tokens,arrival_ms,start_ms,deadline_ms,cost_ms,"
              "queued_ms,fit_ms,fit_ms_per_token,fit_steps,kv_free_mib\n")


class ArbitrationTimeline(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        d = self.dir.name
        self.log = os.path.join(d, "serve.log")
        with open(self.log, "w") as f:
            # A warm-up request (not in the replay), then the replay, whose
            # clock starts at unix 1000: r0 arrives at 1.0005 (1.0 sent),
            # r1 at 1.5 and is judged late 0.8 s later, refused for KV,
            # and admitted after 3 s.
            f.write(line(990.0, "req-w", "m1", "queued", 8, -0.5, 0, 500, 0.4, 0))
            f.write(line(990.1, "req-w", "m1", "left", 8, -0.6, 0, 400, 0.4, 100))
            f.write(line(1001.0005, "req-a", "m1", "queued", 100, 0, 0, 1000, 20, 0))
            f.write(line(1001.5, "req-b", "m1", "queued", 3000, 0, 0, 1000, 150, 0))
            f.write(line(1001.51, "req-a", "m1", "left", 100, -0.0095, 0, 990.5, 20, 9.5))
            f.write(line(1002.3, "req-b", "m1", "late", 3000, -0.8, 900, 200, 150, 0))
            f.write(line(1002.4, "req-b", "m1", "kv_refused", 3000, -0.9, 900, 100, 150, 0))
            f.write(line(1004.5, "req-b", "m1", "left", 3000, -3.0, 0, -2000, 150, 3000))
            f.write("[2026-12-04 10:00:00.000] [ballast] [info] unrelated line\n")
        self.node_req = os.path.join(d, "node.csv")
        with open(self.node_req, "w") as f:
            f.write(REQ_HEADER + "r0,m1,1.0,1.0,100,1,0\nr1,m1,1.5,1.5,3000,0,1\n")
        self.sim_arb = os.path.join(d, "arbitration-4.csv")
        with open(self.sim_arb, "w") as f:
            # r1 is late when first queued (900 + 200 > 1000).
            f.write(ARB_HEADER +
                    "0,1.000000,r0,m1,queued,100,0.000,0.000,1000.000,25.000,0.000,10,0.05,8,90\n"
                    "0,1.020000,r0,m1,left,100,-20.000,0.000,980.000,25.000,20.000,10,0.05,8,90\n"
                    "0,1.500000,r1,m1,queued,3000,0.000,900.000,1000.000,200.000,0.000,10,0.05,8,"
                    "90\n"
                    "0,2.000000,r1,m1,left,3000,-500.000,0.000,500.000,200.000,500.000,10,0.05,8,"
                    "90\n")
        self.sim_req = os.path.join(d, "sim.csv")
        with open(self.sim_req, "w") as f:
            f.write(REQ_HEADER + "r0,m1,1.0,1.0,100,1,0\nr1,m1,1.5,1.5,3000,1,0\n")

    def tearDown(self):
        self.dir.cleanup()

    def run_script(self, *extra):
        out = subprocess.run(
            [sys.executable, os.path.join(SCRIPTS, "arbitration-timeline.py"), self.log,
             self.node_req, self.sim_arb, self.sim_req] + list(extra),
            check=True, capture_output=True, text=True)
        return out.stdout

    def test_each_request_side_by_side(self):
        out = self.run_script()
        rows = {l.split()[0]: l for l in out.splitlines() if l.startswith("r")}
        # r0: on time on both sides, queued 9.5 ms on the node, 20 in the
        # simulator.
        node, sim = [p.split() for p in rows["r0"].split("|")[1:]]
        self.assertEqual(node, ["-", "0", "0", "10", "20.0", "1", "0"])
        self.assertEqual(sim, ["-", "0", "0", "20", "25.0", "1", "0"])
        # r1: late 800 ms after arriving on the node (one flip), refused
        # for KV once, queued 3 s, missed, preempted once; in the
        # simulator late as soon as it was queued, served after 0.5 s.
        node, sim = [p.split() for p in rows["r1"].split("|")[1:]]
        self.assertEqual(node, ["800", "1", "1", "3000", "150.0", "0", "1"])
        self.assertEqual(sim, ["0", "0", "0", "500", "200.0", "1", "0"])
        summary = [l.split() for l in out.splitlines() if l.startswith("m1 ")]
        self.assertEqual(summary, [["m1", "node", "2", "2", "1", "1", "1", "1"],
                                   ["m1", "sim", "2", "2", "2", "1", "0", "0"]])
        self.assertIn("node requests matched to the trace: 2 of 3 logged", out)

    def test_differ_keeps_only_the_requests_whose_outcome_differs(self):
        out = self.run_script("--differ")
        ids = [l.split()[0] for l in out.splitlines() if l.startswith("r")]
        self.assertEqual(ids, ["r1"])


if __name__ == "__main__":
    SCRIPTS = sys.argv.pop(1)
    unittest.main()
