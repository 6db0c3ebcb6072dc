#!/usr/bin/env python3
"""scripts/step-log.py, scripts/step-timeline.py and scripts/step-medians.py
on node logs and a simulated step log written here, their outputs worked
out by hand.

Usage (ctest runs it): step_tools_test.py SCRIPTS_DIR
"""
import os
import subprocess
import sys
import tempfile
import unittest

SCRIPTS = None


def step(model, us0, us1, prefill=0, decodes=0, kv=0):
    """One node log line of a step (node.engine.slow_step_warn_ms 0.001)."""
    return ("[2026-12-04 06:30:00.000] [ballast] [warning] model %s: slow step, 0.1 ms (1 chunks, "
            "%d prefill tokens, 0 loads): inbox and tasks 0.000, plan 0.001, KV loads 0.000, launch "
            "0.050, wait 0.010, tokens and finishes 0.010; 1.0 from begin to end (exports of 0 "
            "chunks, 0 KiB: buffers 0.0, copies 0.0, checksums 0.0, puts 0.0); work: %d decodes "
            "over %d KV tokens, %d prefill pairs, %d prompts done; launched at %d us, collected at "
            "%d us; preempted so far: 0 for growth, 0 shed; 0.000 ms of the plan asking the other "
            "models for KV\n" % (model, prefill, decodes, kv, prefill * 10, 1 if prefill else 0,
                                  us0, us1))


def run(*args):
    out = subprocess.run([sys.executable] + list(args), check=True, capture_output=True,
                         text=True)
    return out.stdout


class StepTools(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.log = os.path.join(self.dir.name, "serve.log")
        base = 1_000_000_000
        lines = [
            # A warm-up run, then 2 s with nothing in flight.
            step("a", base, base + 5_000, prefill=8),
            # The run (no gap of 0.5 s in it): a's prefill (0-50 ms), a's
            # decodes back to back (each launched before the last one was
            # collected), b's prefill and decode, a decode of a's after
            # the device idled, and b's decode in the next second.
            step("a", base + 2_000_000, base + 2_050_000, prefill=1000),
            step("a", base + 2_049_000, base + 2_060_000, decodes=2, kv=2000),
            step("a", base + 2_059_000, base + 2_070_000, decodes=2, kv=2002),
            step("b", base + 2_300_000, base + 2_400_000, prefill=500),
            step("b", base + 2_500_000, base + 2_510_000, decodes=1, kv=500),
            step("a", base + 2_950_000, base + 2_960_000, decodes=4, kv=4002),
            step("b", base + 3_300_000, base + 3_310_000, decodes=1, kv=600),
        ]
        with open(self.log, "w") as f:
            f.writelines(lines)
        self.sim = os.path.join(self.dir.name, "steps-4.csv")
        with open(self.sim, "w") as f:
            f.write("gpu,model,start_s,end_s,steps,decode_tokens,decode_context,prefill_tokens,"
                    "prefill_attention,prefill_logits,running,waiting,kv_bytes,lent_layers,"
                    "device_lent\n")
            # The simulated run starts at 10 s of virtual time.
            f.write("0,a,10.0,10.04,1,0,0,1000,10000,1,1,0,100,0,0\n")
            f.write("0,a,10.04,10.1,3,2,2000,0,0,0,1,2,100,0,4\n")  # a stretch of 3 steps
            f.write("0,b,11.1,11.3,1,0,0,500,5000,1,1,0,50,0,2\n")

    def tearDown(self):
        self.dir.cleanup()

    def test_timeline_lines_up_the_last_run_by_window(self):
        out = run(os.path.join(SCRIPTS, "step-timeline.py"), self.log, self.sim, "--window-s", "1")
        rows = [l.split() for l in out.splitlines()[2:]]
        got = {(r[0], r[1]): r for r in rows}
        self.assertEqual(sorted(got), [("0.0", "a"), ("0.0", "b"), ("1.0", "b")])
        # Window 0, a: on the node 4 steps (rows 0, 2, 2, 4: 2.0 a step; KV
        # 8004 / 4; prefill 1000; the warm-up not counted); simulated 1 +
        # the stretch's 3 (2 rows each: 6 / 4; KV 3 x 2000 / 4), with 2
        # queued and 4 layers lent at its last step.
        a0 = got[("0.0", "a")]
        self.assertEqual(a0[3:7], ["4", "2.0", "2001", "1000"])
        self.assertEqual(a0[8:12], ["4", "1.5", "1500", "1000"])
        self.assertEqual(a0[13:], ["1", "2", "4"])
        # b: its prefill and first decode in window 0 on the node, its
        # prefill in window 1 in the simulator (at 1.1-1.3 s).
        self.assertEqual(got[("0.0", "b")][3:7], ["2", "0.5", "250", "500"])
        self.assertEqual(got[("0.0", "b")][8:], ["0", "0.0", "0", "0", "|", "0", "0", "0"])
        self.assertEqual(got[("1.0", "b")][3:7], ["1", "1.0", "600", "0"])
        self.assertEqual(got[("1.0", "b")][8:], ["1", "0.0", "0", "500", "|", "1", "0", "2"])

    def test_timeline_picks_one_model(self):
        out = run(os.path.join(SCRIPTS, "step-timeline.py"), self.log, self.sim, "--model", "b")
        rows = [l.split() for l in out.splitlines()[2:]]
        self.assertEqual([(r[0], r[1]) for r in rows], [("0.0", "b"), ("1.0", "b")])

    def test_step_log_times_back_to_back_steps_by_their_collections(self):
        out = run(os.path.join(SCRIPTS, "step-log.py"), self.log, "--model", "a",
                  "--from-prefill-tokens", "500")
        ms = [l.split(",")[5] for l in out.splitlines()[1:]]
        # From the run's prefill: not measured (-1: the next step was
        # launched before it was collected, and may have delayed it), then
        # collection to collection while queued (10, 10), then launch to
        # collection after the device idled (10).
        self.assertEqual(ms, ["-1.000", "10.000", "10.000", "10.000"])


    def test_medians_by_kind_of_step(self):
        out = run(os.path.join(SCRIPTS, "step-medians.py"), self.sim, self.log, "--from-s", "0",
                  "--to-s", "10")
        rows = {" ".join(l.split()[:2]): l.split()[2:] for l in out.splitlines()[1:5]}
        # The node's run: a's 1,000-token prefill (50 ms), b's 500-token
        # one (100 ms), five decodes of 10 ms (a's second and third began
        # as the step before them was collected, not when launched). The
        # simulator: 40 and 200 ms, and the stretch's 3 decodes of 20 ms.
        self.assertEqual(rows["prefill >="][1:], ["nan", "0", "nan", "0", "nan"])
        self.assertEqual(rows["prefill 600-1899"], ["50.0", "1", "40.0", "1", "0.800"])
        self.assertEqual(rows["prefill <"][1:], ["100.0", "1", "200.0", "1", "2.000"])
        self.assertEqual(rows["decode only"], ["10.0", "5", "20.0", "3", "2.000"])
        # |ln 0.8| + |ln 2| + |ln 2|
        self.assertIn("error (sum of |ln(sim/node)|): 1.609", out)
        # a's back-to-back decodes alone: 10 ms each from the collection
        # before them (11 from their launches).
        out = run(os.path.join(SCRIPTS, "step-medians.py"), self.sim, self.log, "--from-s",
                  "0.04", "--to-s", "0.1")
        decode = [l.split() for l in out.splitlines() if l.startswith("decode only")][0]
        self.assertEqual(decode[2:4], ["10.0", "2"])

    def test_a_run_that_idles_inside_is_clocked_from_its_start(self):
        # A warm-up, 2 s idle, then the run: a's prefill and decode, 0.7 s
        # with nothing in flight, b's prefill and a's decode. The
        # simulator starts b 0.75 s after a, as the node did from the
        # run's start (not from after its idle stretch).
        base = 1_000_000_000
        log = os.path.join(self.dir.name, "idle.log")
        with open(log, "w") as f:
            f.writelines([
                step("a", base, base + 5_000, prefill=8),
                step("a", base + 2_000_000, base + 2_050_000, prefill=1000),
                step("a", base + 2_050_000, base + 2_060_000, decodes=1, kv=1000),
                step("b", base + 2_760_000, base + 2_860_000, prefill=500),
                step("a", base + 2_860_000, base + 2_870_000, decodes=1, kv=1001),
            ])
        sim = os.path.join(self.dir.name, "steps-2.csv")
        with open(sim, "w") as f:
            f.write("gpu,model,start_s,end_s,steps,decode_tokens,decode_context,prefill_tokens,"
                    "prefill_attention,prefill_logits,running,waiting,kv_bytes,lent_layers,"
                    "device_lent\n")
            f.write("0,a,5.0,5.05,1,0,0,1000,10000,1,1,0,100,0,0\n")
            f.write("0,b,5.75,5.85,1,0,0,500,5000,1,1,0,50,0,0\n")

        def prefills(*extra):
            out = run(os.path.join(SCRIPTS, "step-medians.py"), sim, log, "--from-s", "0",
                      "--to-s", "0.5", *extra)
            rows = {" ".join(l.split()[:2]): l.split()[2:] for l in out.splitlines()[1:5]}
            return rows["prefill 600-1899"][:2], rows["prefill <"][1:3]

        # From the run's start: a's prefill at 0, b's at 0.76 (outside).
        self.assertEqual(prefills(), (["50.0", "1"], ["nan", "0"]))
        # From after the idle stretch (the old rule): b's at 0, a's before.
        self.assertEqual(prefills("--last-gap"), (["nan", "0"], ["100.0", "1"]))
        out = run(os.path.join(SCRIPTS, "step-timeline.py"), log, sim, "--window-s", "0.5")
        rows = [l.split()[:2] for l in out.splitlines()[2:]]
        # Windows by when steps end: a's second decode (0.87 s) and b's
        # prefill (0.86 s, simulated 0.85 s) in the second.
        self.assertEqual(rows, [["0.0", "a"], ["0.5", "a"], ["0.5", "b"]])


if __name__ == "__main__":
    SCRIPTS = sys.argv.pop(1)
    unittest.main()
